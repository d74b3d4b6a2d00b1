"""Matrix row 4: bad input of every kind gives a typed ``rayform.errors`` error that says what to do.

The server side of the bad cases is a real server stub over a copy of the demo root that the
test edits: malformed manifests, an unknown format version, bytes that do not match their hash,
blobs whose size disagrees with the manifest, a tampered blob, an empty slice. After every case
the cache is still consistent (every object hashes to its name, nothing writable).
"""

from __future__ import annotations

import dataclasses
import errno
import fcntl
import json
import math
import os
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from support import DEMO_SLICE, TOKEN, ServerProcess
from support.reliability import assert_cache_consistent

import rayform
from rayform import errors
from rayform.format import hash_bytes
from rayform.manifest import BlobRef, Manifest, canonical_json
from rayform.torch import EpisodeDataset
from rayform_server.store import Store

OBS = ["cam0/rgb", "joints/position"]
ACTION = "joints/position_delta"


@dataclass
class Bad:
    """A server stub over an edited copy of the demo root, and where a test's cache lives."""

    url: str
    cache: Path
    blob_hash: str

    def client(self, **kw: Any) -> rayform.Client:
        kw.setdefault("endpoint", self.url)
        kw.setdefault("token", TOKEN)
        kw.setdefault("attempts", 2)
        return rayform.Client(cache_dir=kw.pop("cache_dir", self.cache), **kw)

    def dataset(self, **kw: Any) -> EpisodeDataset:
        args: dict[str, Any] = {"obs": OBS, "action": ACTION, "fps": 15, "horizon": 4}
        args.update(kw)
        return EpisodeDataset(self.client().slices.get(DEMO_SLICE), **args)


def _put_manifest(root: Path, slice_id: str, data: bytes, name: str | None = None) -> None:
    digest = name or hash_bytes(data)
    path = root / "manifests" / digest[:2] / digest
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    (root / "slices" / f"{slice_id}.json").write_bytes(
        canonical_json({"id": slice_id, "manifest": digest, "description": "edited by a test"})
    )


@pytest.fixture(scope="module")
def bad_server(
    demo_root: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, str]]:
    root = tmp_path_factory.mktemp("bad-root") / "root"
    shutil.copytree(demo_root, root)
    ref = json.loads((root / "slices" / f"{DEMO_SLICE}.json").read_bytes())
    store = Store(root)
    manifest = store.load_manifest(ref["manifest"])
    doc = json.loads(manifest.to_bytes())  # the root: edits to it keep its pages
    _put_manifest(root, "slc_bad00001", b'{"format": "rayform.manifest", "segments": [')
    _put_manifest(root, "slc_bad00002", canonical_json({**doc, "format_version": 99}))
    good = canonical_json({**doc, "description": "tampered below"})
    _put_manifest(root, "slc_bad00003", good.replace(b"tampered", b"TAMPERED"), hash_bytes(good))
    store.set_slice("slc_bad00004", store.put_manifest(Manifest(segments=())))
    segments = list(manifest.segments)
    stream = segments[0].streams["joints/position"]
    for sid, new_size in (
        ("slc_bad00005", stream.blob.size + 100),
        ("slc_bad00006", stream.blob.size - 100),
    ):
        wrong = dataclasses.replace(stream, blob=BlobRef(stream.blob.hash, new_size))
        first = dataclasses.replace(
            segments[0], streams={**segments[0].streams, stream.name: wrong}
        )
        store.set_slice(sid, store.put_manifest(Manifest(segments=(first, *segments[1:]))))
    doc = manifest.to_v1().to_json()
    # A blob whose bytes on the server no longer match their name (same size).
    victim = doc["segments"][1]["streams"]["joints/position"]
    victim_hash = (victim["blob"] if "blob" in victim else victim["blobs"][0])["hash"]
    path = root / "blobs" / victim_hash[:2] / victim_hash
    path.chmod(0o644)
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))
    server = ServerProcess(root)
    yield server.url, victim_hash
    server.stop()


@pytest.fixture
def bad(bad_server: tuple[str, str], tmp_path: Path) -> Bad:
    return Bad(bad_server[0], tmp_path / "cache", bad_server[1])


def _blob_of(client: rayform.Client, slice_id: str, seg: int = 0) -> Any:
    return client.slices.get(slice_id).segments[seg].streams["joints/position"].blob


# name -> (action on a Bad, expected error type, regex the message must match: what to do)
CASES: dict[str, tuple[Callable[[Bad], object], type[Exception], str]] = {
    "id-empty": (lambda b: b.client().slices.get(""), errors.InvalidArgumentError, "slc_"),
    "id-uppercase": (
        lambda b: b.client().slices.get("slc_7C1E04AA"),
        errors.InvalidArgumentError,
        "slc_",
    ),
    "id-traversal": (
        lambda b: b.client().slices.get("../../etc/passwd"),
        errors.InvalidArgumentError,
        "slc_",
    ),
    "id-not-a-string": (
        lambda b: b.client().slices.get(12345),
        errors.InvalidArgumentError,
        "slc_",
    ),
    "id-with-path": (
        lambda b: b.client().slices.get(f"{DEMO_SLICE}/manifest"),
        errors.InvalidArgumentError,
        "slc_",
    ),
    "id-unknown": (
        lambda b: b.client().slices.get("slc_0123abcd"),
        errors.NotFoundError,
        "rayform slices ls",
    ),
    "pull-unknown-stream": (
        lambda b: b.client().pull(DEMO_SLICE, streams=["cam9/rgb"]),
        errors.NotFoundError,
        "it has cam0/rgb",
    ),
    "pull-malformed-stream": (
        lambda b: b.client().pull(DEMO_SLICE, streams=["../x"]),
        errors.InvalidArgumentError,
        "stream",
    ),
    # A string was read as its characters ("malformed stream name '/'"; Slice.blobs: none).
    "pull-streams-one-string": (
        lambda b: b.client().pull(DEMO_SLICE, streams="cam0/rgb,wrist/rgb"),
        errors.InvalidArgumentError,
        r"is one string: pass a list of stream names, e.g. streams=\['cam0/rgb', 'wrist/rgb'\]",
    ),
    "blobs-streams-one-string": (
        lambda b: b.client().slices.get(DEMO_SLICE).blobs("cam0/rgb"),
        errors.InvalidArgumentError,
        r"streams=\['cam0/rgb'\]",
    ),
    "pull-jobs-0": (
        lambda b: b.client().pull(DEMO_SLICE, jobs=0),
        errors.InvalidArgumentError,
        "positive",
    ),
    "dataset-unknown-obs": (
        lambda b: b.dataset(obs=["cam9/rgb"]),
        errors.NotFoundError,
        "cam0/rgb",
    ),
    "dataset-unknown-action": (
        lambda b: b.dataset(action="joints/torque"),
        errors.NotFoundError,
        "joints",
    ),
    "dataset-no-obs": (lambda b: b.dataset(obs=[]), errors.InvalidArgumentError, "non-empty list"),
    "fps-zero": (lambda b: b.dataset(fps=0), errors.InvalidArgumentError, r"> 0 \(Hz\)"),
    "fps-negative": (lambda b: b.dataset(fps=-15), errors.InvalidArgumentError, r"> 0 \(Hz\)"),
    "fps-nan": (lambda b: b.dataset(fps=math.nan), errors.InvalidArgumentError, "finite"),
    "fps-string": (lambda b: b.dataset(fps="15"), errors.InvalidArgumentError, "number"),
    "horizon-zero": (lambda b: b.dataset(horizon=0), errors.InvalidArgumentError, ">= 1"),
    "horizon-float": (lambda b: b.dataset(horizon=2.5), errors.InvalidArgumentError, "integer"),
    "frame-unknown": (lambda b: b.dataset(frame="enu"), errors.InvalidArgumentError, "ros"),
    "obs-steps-zero": (lambda b: b.dataset(obs_steps=0), errors.InvalidArgumentError, ">= 1"),
    "manifest-malformed": (
        lambda b: b.client().slices.get("slc_bad00001"),
        errors.ManifestError,
        "report",
    ),
    "manifest-format-version": (
        lambda b: b.client().slices.get("slc_bad00002"),
        errors.ManifestError,
        "pip install -U rayform",
    ),
    "manifest-hash-mismatch": (
        lambda b: b.client().slices.get("slc_bad00003"),
        errors.ManifestError,
        "corrupt",
    ),
    "slice-empty": (
        lambda b: EpisodeDataset(
            b.client().slices.get("slc_bad00004"), obs=OBS, action=None, fps=15
        ),
        errors.NotFoundError,
        "no episodes.*rayform slices ls",
    ),
    "blob-shorter-than-manifest": (
        lambda b: b.client().ensure_blob("slc_bad00005", _blob_of(b.client(), "slc_bad00005")),
        errors.IntegrityError,
        "report",
    ),
    "blob-longer-than-manifest": (
        lambda b: b.client().ensure_blob("slc_bad00006", _blob_of(b.client(), "slc_bad00006")),
        errors.IntegrityError,
        "report",
    ),
    "blob-tampered-on-server": (
        lambda b: b.client().pull(DEMO_SLICE, streams=["joints/position"]),
        errors.IntegrityError,
        "report",
    ),
    "token-wrong": (
        lambda b: b.client(token="not-the-token-123").slices.get(DEMO_SLICE),
        errors.AccessDeniedError,
        "RAYFORM_TOKEN",
    ),
    "token-missing": (
        lambda b: b.client(token=None).slices.get(DEMO_SLICE),
        errors.AccessDeniedError,
        "RAYFORM_TOKEN",
    ),
    "offline-nothing-cached": (
        lambda b: b.client(offline=True).slices.get(DEMO_SLICE),
        errors.OfflineError,
        f"rayform pull {DEMO_SLICE}",
    ),
    "endpoint-not-http": (
        lambda b: b.client(endpoint="ftp://example.com"),
        errors.InvalidArgumentError,
        "RAYFORM_ENDPOINT",
    ),
    "endpoint-missing": (
        lambda b: rayform.Client(token=TOKEN, cache_dir=b.cache).slices.get(DEMO_SLICE),
        errors.InvalidArgumentError,
        "RAYFORM_ENDPOINT",
    ),
    "prune-negative": (lambda b: b.client().cache.prune(-1), errors.InvalidArgumentError, ">= 0"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_raises_typed_error(bad: Bad, case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    if case == "token-missing":
        monkeypatch.delenv("RAYFORM_TOKEN", raising=False)
    action, error, hint = CASES[case]
    with pytest.raises(error, match=hint) as info:
        action(bad)
    assert isinstance(info.value, errors.RayformError)
    assert TOKEN not in str(info.value)
    if bad.cache.is_dir():
        assert_cache_consistent(bad.cache)
        assert list((bad.cache / "tmp").glob("*.part")) == []


# -- filesystems that fight back ------------------------------------------------------------


def test_read_only_cache_dir_is_a_clear_error(bad: Bad, tmpfs: Callable[[str], Path]) -> None:
    ro = tmpfs("size=2m,ro")
    with pytest.raises(errors.CacheError, match="not writable.*RAYFORM_CACHE_DIR"):
        bad.client(cache_dir=ro / "cache").pull(DEMO_SLICE)
    assert list(ro.iterdir()) == []


def test_full_disk_is_a_clear_error_and_cache_stays_consistent(
    bad: Bad, tmpfs: Callable[[str], Path]
) -> None:
    small = tmpfs("size=96k")
    client = bad.client(cache_dir=small / "cache")
    with pytest.raises(errors.CacheError, match="full.*prune"):
        client.pull(DEMO_SLICE, streams=["cam0/rgb", "wrist/rgb"], jobs=4)
    cached = assert_cache_consistent(small / "cache")
    assert list((small / "cache" / "tmp").glob("*.part")) == [], "partial files removed"
    assert client.cache.verify().removed == []
    assert len(cached) < 8
    client.cache.prune(0)  # what the message suggests; then the pull fits
    report = client.pull(DEMO_SLICE, streams=["ee/pose"])
    assert report.blobs == report.fetched_blobs == 4 and client.cache.verify().removed == []


@pytest.mark.parametrize("err", [errno.ENOLCK, errno.ENOSYS], ids=["no-locks", "no-flock-syscall"])
def test_cache_on_a_filesystem_without_locking(
    bad: Bad, monkeypatch: pytest.MonkeyPatch, err: int
) -> None:
    def no_flock(fd: int, op: int) -> None:
        raise OSError(err, os.strerror(err))

    monkeypatch.setattr(fcntl, "flock", no_flock)
    client = bad.client()
    report = client.pull(DEMO_SLICE, streams=["cam0/rgb", "joints/position_delta"], jobs=4)
    assert report.fetched_blobs == report.blobs == 12
    assert len(assert_cache_consistent(bad.cache)) == 12
