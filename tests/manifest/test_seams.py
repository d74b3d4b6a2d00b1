"""The data path's seams (``rayform._seams``): who satisfies each Protocol, and what crosses it."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from support import ServerProcess
from support.fakes import StoreBlobs, store_slice

import rayform
from rayform._net._transport import Transport
from rayform._seams import BlobFetcher, BlobSource
from rayform.cache._partial import PartialBlob
from rayform.errors import InvalidArgumentError
from rayform.format import hash_bytes, hash_file
from rayform.manifest import BlobRef
from rayform.torch import EpisodeDataset
from rayform_server.demo import DEMO_SLICE
from rayform_server.store import Store

DATA = bytes(range(256)) * 1000


def test_the_real_and_the_fake_client_are_blob_fetchers(tmp_path: Path) -> None:
    assert isinstance(rayform.Client(endpoint="http://127.0.0.1:9"), BlobFetcher)
    assert isinstance(StoreBlobs(None), BlobFetcher)
    assert not isinstance(object(), BlobFetcher)


def test_a_slice_is_a_blob_source_and_exposes_its_cache_dir(
    demo_root: Path, tmp_path: Path
) -> None:
    store = Store(demo_root)
    manifest = store.load_manifest(store.get_slice(DEMO_SLICE)["manifest"])
    slice_ = store_slice(DEMO_SLICE, manifest, store, tmp_path / "c")
    assert isinstance(slice_, BlobSource)
    assert slice_.cache_dir == tmp_path / "c"
    assert store_slice(DEMO_SLICE, manifest, store).cache_dir is None


def test_the_client_slice_uses_the_client_cache_dir(
    client_env: ServerProcess, isolated_env: Path
) -> None:
    slice_ = rayform.Client().slices.get(DEMO_SLICE)
    assert isinstance(slice_, BlobSource)
    assert slice_.cache_dir == isolated_env.absolute()


class Lookalike:
    """Has a manifest and blob_path, but is no slice: no id, no cache_dir."""

    manifest = None

    def blob_path(self, ref: BlobRef) -> Path:
        raise AssertionError("never read")


@pytest.mark.parametrize(
    "bad", ["slc_7c1e04aa", None, Lookalike()], ids=["slice-id", "none", "lookalike"]
)
def test_a_dataset_of_something_else_than_a_slice_is_a_clear_error(bad: object) -> None:
    with pytest.raises(
        InvalidArgumentError, match=r"slice_ must be a rayform.Slice \(from client.slices.get"
    ):
        EpisodeDataset(bad, obs=["joints/position"], action=None, fps=15)  # type: ignore[arg-type]


def test_download_reports_progress_to_the_callback_it_is_given(tmp_path: Path) -> None:
    digest = hash_bytes(DATA)

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=DATA)

    transport = Transport(
        "http://stub.test:8765", None, http_transport=httpx.MockTransport(handler)
    )
    part = PartialBlob(tmp_path / f"{digest}.h.1.x.part", digest, len(DATA), 0o644)
    seen: list[int] = []
    transport.download("blob", part, "downloading", on_bytes=seen.append)
    assert sum(seen) == len(DATA) and all(n > 0 for n in seen)
    assert part.finish() == digest
    assert not hasattr(part, "on_bytes")  # the sink only holds bytes; progress is the caller's


def test_pull_progress_counts_every_byte_once(
    client_env: ServerProcess, capsys: pytest.CaptureFixture[str]
) -> None:
    client = rayform.Client()
    report = client.pull(DEMO_SLICE, streams=["joints/position"], progress=True)
    assert report.fetched_bytes == report.bytes > 0
    err = capsys.readouterr().err
    assert f"pull {DEMO_SLICE}" in err and "100%" in err
    slice_ = client.slices.get(DEMO_SLICE)
    for seg in slice_.segments:
        ref = seg.streams["joints/position"].blob
        assert hash_file(slice_.blob_path(ref)) == ref.hash


def test_a_slice_tells_its_cache_limit_and_what_a_read_would_download(
    client_env: ServerProcess, isolated_env: Path, demo_root: Path
) -> None:
    slice_ = rayform.Client(cache_limit=10**9).slices.get(DEMO_SLICE)
    ref = next(iter(slice_.segments[0].streams["joints/position"].blobs()))
    assert slice_.cache_limit == 10**9 and slice_.would_fetch(ref)
    slice_.blob_path(ref)
    assert not slice_.would_fetch(ref)  # cached now
    missing = next(iter(slice_.segments[0].streams["cam0/rgb"].blobs()))
    assert slice_.would_fetch(missing)
    offline = rayform.Client(offline=True).slices.get(DEMO_SLICE)  # the resolution is cached
    assert offline.cache_limit is None and not offline.would_fetch(
        missing
    )  # offline never downloads
    store = Store(demo_root)
    fake = store_slice(
        DEMO_SLICE, store.load_manifest(store.get_slice(DEMO_SLICE)["manifest"]), store
    )
    assert fake.cache_limit is None and not fake.would_fetch(ref)
