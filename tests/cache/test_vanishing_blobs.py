"""A blob removed or replaced while a dataset reads it is fetched again, never a false error.

Another node's eviction does not see this node's ``flock`` pins, so it can remove a blob
between the reader's pin and its decode (the CI failure: a false ``IntegrityError``, a raw
``FileNotFoundError`` or a ``CacheError`` from a worker, on a cache that verified clean). Here
that eviction is forced: right after each pin, the pinned file is removed, or replaced by
other bytes, once per blob. ``test_evict_nodes.py`` runs the real thing on two sshfs nodes.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from support import DEMO_SLICE, TOKEN, ServerProcess
from support.reliability import assert_cache_consistent
from torch.utils.data import DataLoader

import rayform
from rayform.cache import _evict, _live, _reread, evict_lru
from rayform.cache._evict import Pins
from rayform.cache._pinmarks import marked
from rayform.errors import IntegrityError
from rayform.manifest import BlobRef
from rayform.torch import EpisodeDataset

OBS = ["cam0/rgb", "wrist/rgb", "joints/position"]
ACTION = "joints/position_delta"


def _remove(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):  # another worker's hook was first
        os.unlink(path)


def _replace(path: Path) -> None:
    other = path.with_name(path.name + ".other")
    other.write_bytes(b"\0" * path.stat().st_size)  # the same size, other bytes
    os.replace(other, path)


def _evict_after_pin(
    monkeypatch: pytest.MonkeyPatch, kinds: set[str], action: Callable[[Path], None]
) -> list[str]:
    """``action`` on a blob's file right after the reader pinned it, once per blob of ``kinds``
    (the other node's eviction, which the pin's flock does not stop). A fetch pins the blob
    first (the client's pins), then the reader (its own): the reader's is the second set."""
    real, done, first = Pins.pin, [], {}

    def pin(self: Pins, path: Path) -> bool:
        ok = real(self, path)
        if (
            ok
            and path.name in kinds
            and path.name not in done
            and first.setdefault(path.name, self) is not self
        ):
            done.append(path.name)
            action(path)
        return ok

    monkeypatch.setattr(_evict.Pins, "pin", pin)
    return done


def _samples(ds: EpisodeDataset, workers: int = 0) -> list[bytes]:
    out = []
    for batch in DataLoader(ds, batch_size=8, num_workers=workers):
        out.append(b"".join(batch[k].numpy().tobytes() for k in [*OBS, "action", "t_ns"]))
    return out


def _dataset(server: ServerProcess, cache: Path, limit: int | None) -> EpisodeDataset:
    client = rayform.Client(endpoint=server.url, token=TOKEN, cache_dir=cache, cache_limit=limit)
    return EpisodeDataset(client.slices.get(DEMO_SLICE), obs=OBS, action=ACTION, fps=15, horizon=4)


@pytest.mark.parametrize("action", [_remove, _replace], ids=["removed", "replaced"])
@pytest.mark.parametrize("kind", ["video", "table"])
def test_a_blob_evicted_between_pin_and_decode_is_fetched_again_with_a_warning(
    demo_server: ServerProcess,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    kind: str,
    action: Callable[[Path], None],
) -> None:
    want = _samples(_dataset(demo_server, tmp_path / "free", None))
    ds = _dataset(demo_server, tmp_path / "bounded", 10 << 20)
    names = ["cam0/rgb", "wrist/rgb"] if kind == "video" else ["joints/position", ACTION]
    hashes = {seg.streams[n].blob.hash for seg in ds.segments for n in names}
    hit = _evict_after_pin(monkeypatch, hashes, action)
    with caplog.at_level(logging.WARNING, logger="rayform.cache"):
        assert _samples(ds) == want
    assert set(hit) == hashes  # every blob of that kind vanished once under the reader
    warned = [r.getMessage() for r in caplog.records if "vanished" in r.getMessage()]
    assert len(warned) >= len(hashes), warned
    assert "fetching it again" in warned[0]
    assert_cache_consistent(tmp_path / "bounded")


def test_a_video_with_an_open_decoder_is_read_through_its_open_file(
    demo_server: ServerProcess, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Once its decoder is open, a video is not looked up on disk again for each batch: a
    file removed meanwhile is still read through the decoder's open file, with the same
    samples, no warning and no fetch."""
    ds = _dataset(demo_server, tmp_path / "cache", None)
    want = _samples(ds)  # every video's decoder is now open in this process
    refs = {seg.streams[n].blob for seg in ds.segments for n in ["cam0/rgb", "wrist/rgb"]}
    paths = [Path(ds.slice.blob_path(ref)) for ref in refs]
    for path in paths:
        os.unlink(path)
    with caplog.at_level(logging.WARNING, logger="rayform.cache"):
        assert _samples(ds) == want
    assert not [r for r in caplog.records if "vanished" in r.getMessage()]
    assert not any(p.exists() for p in paths)  # read from the open files, not fetched again


def test_real_workers_survive_blobs_removed_under_them(
    demo_server: ServerProcess, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    want = _samples(_dataset(demo_server, tmp_path / "free", None))
    ds = _dataset(demo_server, tmp_path / "bounded", 10 << 20)
    hashes = {b.hash for seg in ds.segments for n in [*OBS, ACTION] for b in [seg.streams[n].blob]}
    _evict_after_pin(monkeypatch, hashes, _remove)  # in each forked worker, once per blob
    assert _samples(ds, workers=2) == want


def test_undecodable_bytes_that_match_their_hash_are_still_an_integrity_error(
    demo_server: ServerProcess, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The re-read is no blanket retry: bytes that hash right and fail twice are the data's fault.
    ds = _dataset(demo_server, tmp_path / "c", 10 << 20)
    video = ds.segments[0].streams["cam0/rgb"].blob.hash
    bad = tmp_path / "not-a-video"
    bad.write_bytes(b"\1" * 1000)
    monkeypatch.setattr(_reread, "_intact", lambda path, digest: True)  # "its hash matches"
    real = ds.slice.client.ensure_blob

    def ensure(slice_id: str, ref: BlobRef) -> Path:
        return bad if ref.hash == video else real(slice_id, ref)

    monkeypatch.setattr(ds.slice.client, "ensure_blob", ensure)
    with pytest.raises(IntegrityError, match="cannot be decoded"):
        ds[0]


def test_a_pin_is_seen_by_an_evictor_of_another_node(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # flock does not cross nodes; the pin's marker file does: an evictor leaves the blob.
    cache = tmp_path / "c"
    blobs = []
    for i in range(3):
        digest = f"{i:02d}" * 32
        p = cache / "blobs" / digest[:2] / digest
        p.parent.mkdir(parents=True)
        p.write_bytes(b"x" * 100)
        blobs.append(p)
    pins = Pins(4)
    assert pins.pin(blobs[0])
    [marker] = (cache / "pins").iterdir()
    assert marker.name.startswith(blobs[0].name)
    # As another node sees it: a host name that is not ours, whose ledger record is fresh.
    ledger = cache / "live" / "ledger"

    def node_b(slot: int, token: str, stamp: float) -> None:
        record = f"{token} node-b 12345 1 {stamp:.2f} 0 1 100".encode().ljust(127) + b"\n"
        with open(ledger, "r+b") as f:
            f.seek(slot * 128)
            f.write(record)

    node_b(200, "beefbeef", time.time())
    os.rename(marker, cache / "pins" / f"{blobs[0].name}.node-b.12345.beefbeef-abcdef")
    assert marked(cache) == {blobs[0].name}
    assert evict_lru(cache, 0).skipped_in_use == 1 and blobs[0].exists()
    # A node whose record stays unchanged for the stale time, on our clock, no longer pins;
    # its time stamp an hour old does not shorten that (the nodes' clocks may differ).
    monkeypatch.setattr(_live, "STALE_S", 1.0)
    node_b(201, "deaddead", time.time() - 3600)
    os.rename(
        cache / "pins" / f"{blobs[0].name}.node-b.12345.beefbeef-abcdef",
        cache / "pins" / f"{blobs[0].name}.node-b.12345.deaddead-abcdef",
    )
    assert marked(cache) == {blobs[0].name}, "alive at first sight"
    time.sleep(1.2)
    assert marked(cache) == set()
    assert not (cache / "pins" / f"{blobs[0].name}.node-b.12345.deaddead-abcdef").exists()
    pins.close()
    assert evict_lru(cache, 0).evicted == 1 and not blobs[0].exists()
