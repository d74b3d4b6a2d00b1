"""`rayform pull` against the real server stub (behind a counting proxy), in real processes."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import DEMO_SLICE, ServerProcess, forbid_network, make_client
from support.proxy import CountingProxy
from support.reliability import assert_cache_consistent, kill_when_writing, pull_cmd, sub_env

import rayform
from rayform.errors import IntegrityError, OfflineError
from rayform.format import hash_file


@pytest.fixture
def proxy(demo_server: ServerProcess) -> Iterator[CountingProxy]:
    with CountingProxy(demo_server.url) as p:
        yield p


def test_pull_fetches_each_blob_once_then_nothing(proxy: CountingProxy, tmp_path: Path) -> None:
    client = make_client(proxy.url, tmp_path / "cache")
    report = client.pull(DEMO_SLICE, jobs=4)
    slice_ = client.slices.get(DEMO_SLICE)
    expected, manifest = slice_.manifest.blobs(), slice_.manifest_hash
    assert report.blobs == len(expected) == report.fetched_blobs
    assert report.fetched_bytes == report.bytes == sum(r.size for r in expected.values())
    assert proxy.blob_gets() == {h: 1 for h in expected}
    assert assert_cache_consistent(tmp_path / "cache") == sorted(expected)
    before = len(proxy.requests)
    again = make_client(proxy.url, tmp_path / "cache").pull(DEMO_SLICE)
    assert again.fetched_blobs == 0 and again.fetched_bytes == 0
    assert again.cached_blobs == report.blobs
    # What can change under a slice ID is asked again: the slice itself, and the latest
    # version of its label set (docs/curation.md, "Offline"); no manifest, no blob.
    assert [p for p, _ in proxy.requests[before:]] == [
        f"/v1/slices/{DEMO_SLICE}",
        f"/v1/slices/{DEMO_SLICE}/labels/{manifest}",
    ]


def test_pull_named_streams_only(proxy: CountingProxy, tmp_path: Path) -> None:
    client = make_client(proxy.url, tmp_path / "cache")
    report = client.pull(DEMO_SLICE, streams=["joints/position"])
    wanted = client.slices.get(DEMO_SLICE).manifest.blobs(["joints/position"])
    assert report.fetched_blobs == len(wanted) == 4
    assert set(proxy.blob_gets()) == set(wanted)
    with pytest.raises(rayform.NotFoundError, match="no stream nope"):
        client.pull(DEMO_SLICE, streams=["nope"])


@pytest.mark.parametrize("locks", [True, False], ids=["locks", "no-locks"])
def test_four_processes_pull_one_cache(proxy: CountingProxy, tmp_path: Path, locks: bool) -> None:
    proxy.delay_s = 0.002  # ~0.5 MB/s per blob: the four pullers overlap
    cache = tmp_path / "shared-cache"
    env = sub_env() if locks else sub_env(RAYFORM_NO_LOCKS="1")
    procs = [
        subprocess.Popen(pull_cmd(proxy.url, cache, "--jobs", "4"), env=env, stderr=subprocess.PIPE)
        for _ in range(4)
    ]
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err.decode()
    expected = make_client(proxy.url, cache).slices.get(DEMO_SLICE).manifest.blobs()
    assert assert_cache_consistent(cache) == sorted(expected)
    assert list((cache / "tmp").iterdir()) == []
    gets = proxy.blob_gets()
    assert set(gets) == set(expected)
    if locks:
        assert gets == {h: 1 for h in expected}, "each blob transferred once"


def test_sigkill_mid_transfer_then_resume(proxy: CountingProxy, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    proxy.delay_s = 0.05  # 1 KiB every 50 ms: a 20 KiB blob takes a second
    proc = subprocess.Popen(
        pull_cmd(proxy.url, cache, "--jobs", "2"), env=sub_env(), stderr=subprocess.DEVNULL
    )
    partial = kill_when_writing(proc, cache)
    # A puller killed right after creating a .part file leaves it empty: that is fine too.
    assert any(size > 0 for size in partial.values())
    done = assert_cache_consistent(cache)  # whatever finished is complete and correct
    assert not set(partial) & set(done)
    proxy.delay_s = 0.0
    before = len(proxy.requests)
    result = subprocess.run(pull_cmd(proxy.url, cache), env=sub_env(), capture_output=True)
    assert result.returncode == 0, result.stderr.decode()
    expected = make_client(proxy.url, cache).slices.get(DEMO_SLICE).manifest.blobs()
    assert assert_cache_consistent(cache) == sorted(expected)
    assert list((cache / "tmp").iterdir()) == [], (partial, done, proxy.requests[before:])
    resumed = [(p, r) for p, r in proxy.requests[before:] if r is not None]
    assert resumed, "the next pull continued a partial file with a Range request"
    for path, rng in resumed:
        assert rng == f"bytes={partial[path.rsplit('/', 1)[-1]]}-"


def test_corrupted_bytes_raise_integrity_error(proxy: CountingProxy, tmp_path: Path) -> None:
    client = make_client(proxy.url, tmp_path / "cache")
    ref = client.slices.get(DEMO_SLICE).segments[0].streams["joints/position"].blob
    proxy.corrupt.add(ref.hash)
    with pytest.raises(IntegrityError, match="failed verification"):
        client.ensure_blob(DEMO_SLICE, ref)
    assert not client.cache.blob_path(ref.hash).exists()
    assert list((tmp_path / "cache" / "tmp").iterdir()) == []
    with pytest.raises(IntegrityError):
        client.pull(DEMO_SLICE, jobs=4)
    assert ref.hash not in assert_cache_consistent(tmp_path / "cache")


def test_offline_after_pull_with_server_stopped(
    demo_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = ServerProcess(demo_root)
    try:
        online = make_client(server.url, tmp_path / "cache")
        online.pull(DEMO_SLICE, streams=["cam0/rgb", "joints/position"])
    finally:
        server.stop()

    forbid_network(monkeypatch)
    monkeypatch.setenv("RAYFORM_OFFLINE", "1")
    client = make_client(server.url, tmp_path / "cache")
    slice_ = client.slices.get(DEMO_SLICE)
    assert slice_.id == DEMO_SLICE and len(slice_.segments) == 4
    seg = slice_.segments[0]
    path = slice_.blob_path(seg.streams["cam0/rgb"].blob)
    assert hash_file(path) == seg.streams["cam0/rgb"].blob.hash
    with pytest.raises(OfflineError, match=rf"rayform pull {DEMO_SLICE} --streams wrist/rgb"):
        slice_.blob_path(seg.streams["wrist/rgb"].blob)
    with pytest.raises(OfflineError, match=r"`rayform pull slc_0123abcd`"):
        client.slices.get("slc_0123abcd")
    report = client.pull(DEMO_SLICE, streams=["joints/position"])  # all cached: works offline
    assert report.fetched_blobs == 0 and report.cached_blobs == 4
    # an offline client without endpoint finds the slice through any remembered server
    assert rayform.Client(cache_dir=tmp_path / "cache").slices.get(DEMO_SLICE).id == DEMO_SLICE
