"""The content-addressed cache on real files: atomicity, read-only files, verify, prune, crashes."""

from __future__ import annotations

import fcntl
import os
import pickle
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from support import DEMO_SLICE, SCRIPTS, TOKEN, ServerProcess

import rayform
from rayform.cache import Cache
from rayform.cache._partial import HOST, PartialBlob, owner_dead, tmp_name
from rayform.errors import CacheError, IntegrityError, TransportError
from rayform.format import hash_bytes
from rayform.manifest import BlobRef


def _blob(n: int, seed: int = 0) -> tuple[bytes, BlobRef]:
    data = bytes((i * 31 + seed) % 251 for i in range(n))
    return data, BlobRef(hash_bytes(data), len(data))


def _writer(
    data: bytes, calls: list[int] | None = None, chunk: int = 4096
) -> Callable[[PartialBlob], None]:
    def download(part: PartialBlob) -> None:
        if calls is not None:
            calls.append(part.offset)
        pos = part.offset
        while pos < len(data):
            part.write(data[pos : pos + chunk])
            pos += chunk

    return download


def _files_under(root: Path, sub: str) -> list[Path]:
    return [p for p in (root / sub).rglob("*") if p.is_file()]


def test_fetch_places_verified_read_only_blob(tmp_path: Path) -> None:
    cache = Cache(tmp_path / "c")
    data, ref = _blob(100_000)
    path, fetched = cache.fetch_blob(ref, _writer(data))
    assert path == tmp_path / "c" / "blobs" / ref.hash[:2] / ref.hash
    assert path.read_bytes() == data and fetched == len(data)
    assert stat.S_IMODE(path.stat().st_mode) == 0o444
    assert _files_under(tmp_path / "c", "tmp") == []
    calls: list[int] = []
    assert cache.fetch_blob(ref, _writer(data, calls)) == (path, 0)
    assert calls == []  # a hit never downloads
    assert cache.get_blob(ref.hash) == path


def test_broken_download_leaves_nothing_under_content_name_and_resumes(tmp_path: Path) -> None:
    cache = Cache(tmp_path / "c")
    data, ref = _blob(200_000)

    def broken(part: PartialBlob) -> None:
        part.write(data[:120_000])
        raise TransportError("server went away")

    with pytest.raises(TransportError):
        cache.fetch_blob(ref, broken)
    assert not cache.has_blob(ref.hash)
    parts = _files_under(tmp_path / "c", "tmp")
    assert len(parts) == 1 and parts[0].stat().st_size == 120_000
    calls: list[int] = []
    path, fetched = cache.fetch_blob(ref, _writer(data, calls))
    assert calls == [120_000], "the partial file was adopted and continued"
    assert fetched == len(data) - 120_000 and path.read_bytes() == data
    assert _files_under(tmp_path / "c", "tmp") == []


def test_corrupt_bytes_raise_integrity_error_and_cache_nothing(tmp_path: Path) -> None:
    cache = Cache(tmp_path / "c")
    data, ref = _blob(50_000)
    bad = bytearray(data)
    bad[1000] ^= 0xFF
    calls: list[int] = []
    with pytest.raises(IntegrityError, match="failed verification"):
        cache.fetch_blob(ref, _writer(bytes(bad), calls))
    assert calls == [0, 0], "refetched once from scratch"
    assert not cache.has_blob(ref.hash)
    assert _files_under(tmp_path / "c", "blobs") == []
    assert _files_under(tmp_path / "c", "tmp") == []


def test_corrupt_adopted_prefix_is_refetched(tmp_path: Path) -> None:
    cache = Cache(tmp_path / "c")
    data, ref = _blob(60_000)
    (tmp_path / "c" / "tmp").mkdir(parents=True)
    dead = _dead_pid()
    stale = tmp_path / "c" / "tmp" / tmp_name(ref.hash).replace(f".{os.getpid()}.", f".{dead}.")
    stale.write_bytes(b"\0" * 10_000)  # garbage prefix left by a crashed puller
    calls: list[int] = []
    path, _ = cache.fetch_blob(ref, _writer(data, calls))
    assert calls == [10_000, 0] and path.read_bytes() == data


def test_two_writers_without_locks_end_with_one_correct_blob(tmp_path: Path) -> None:
    data, ref = _blob(300_000)
    results: list[Path] = []
    errors: list[BaseException] = []

    def slow(part: PartialBlob) -> None:
        for i in range(part.offset, len(data), 10_000):
            part.write(data[i : i + 10_000])
            time.sleep(0.002)

    def run() -> None:
        try:
            results.append(Cache(tmp_path / "c", locks=False).fetch_blob(ref, slow)[0])
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and len(results) == 3
    assert results[0].read_bytes() == data
    assert _files_under(tmp_path / "c", "blobs") == [results[0]]
    assert _files_under(tmp_path / "c", "tmp") == []


def test_verify_removes_tampered_blob(tmp_path: Path) -> None:
    cache = Cache(tmp_path / "c")
    good, gref = _blob(10_000, 1)
    bad, bref = _blob(10_000, 2)
    cache.fetch_blob(gref, _writer(good))
    p, _ = cache.fetch_blob(bref, _writer(bad))
    os.chmod(p, 0o644)
    p.write_bytes(b"tampered" + bad[8:])
    report = cache.verify()
    assert report.checked == 2 and report.removed == [bref.hash]
    assert cache.has_blob(gref.hash) and not cache.has_blob(bref.hash)


def test_prune_evicts_least_recently_used(tmp_path: Path) -> None:
    cache = Cache(tmp_path / "c")
    refs = []
    for i in range(4):
        data, ref = _blob(1000, i)
        path, _ = cache.fetch_blob(ref, _writer(data))
        os.utime(path, (1_000_000 + i * 100, 1_000_000))  # used in order 0, 1, 2, 3
        refs.append(ref)
    # blob 0 is used again, the most recently of all
    p0 = cache.blob_path(refs[0].hash)
    os.utime(p0, (2_000_000, 1_000_000))
    evicted = cache.prune(2000)
    assert [e.hash for e in evicted] == [refs[1].hash, refs[2].hash]
    assert cache.has_blob(refs[0].hash) and cache.has_blob(refs[3].hash)
    assert cache.du()["blob_bytes"] == 2000


def test_hit_updates_last_use_once_per_process(tmp_path: Path) -> None:
    cache = Cache(tmp_path / "c")
    data, ref = _blob(1000)
    path, _ = cache.fetch_blob(ref, _writer(data))
    fresh = Cache(tmp_path / "c")  # another process's view: nothing touched yet
    os.utime(path, (1_000, 1_000))
    fresh.get_blob(ref.hash)
    assert path.stat().st_atime > time.time() - 60
    os.utime(path, (1_000, 1_000))
    fresh.get_blob(ref.hash)  # second hit in the same process: no syscall
    assert path.stat().st_atime == 1_000


def test_partials_of_several_dead_writers_are_all_gone_after_the_fetch(tmp_path: Path) -> None:
    # Two workers killed while fetching the same blob leave two partials; one is adopted and
    # completed, the other must not linger in tmp/ (found by the stress matrix).
    cache = Cache(tmp_path / "c")
    data, ref = _blob(50_000)
    tmp = tmp_path / "c" / "tmp"
    tmp.mkdir(parents=True)
    partials = []
    for _ in range(2):
        p = tmp / tmp_name(ref.hash).replace(f".{os.getpid()}.", f".{_dead_pid()}.")
        p.write_bytes(data[:20_000])
        partials.append(p)
    calls: list[int] = []
    path, _ = cache.fetch_blob(ref, _writer(data, calls))
    assert calls == [20_000] and path.read_bytes() == data
    assert list(tmp.iterdir()) == []


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_clean_tmp_removes_only_files_of_dead_writers(tmp_path: Path) -> None:
    cache = Cache(tmp_path / "c", stale_s=1.0)
    tmp = tmp_path / "c" / "tmp"
    tmp.mkdir(parents=True)
    h = "ab" * 32
    dead = tmp / tmp_name(h).replace(f".{os.getpid()}.", f".{_dead_pid()}.")
    live_proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        alive = tmp / tmp_name(h).replace(f".{os.getpid()}.", f".{live_proc.pid}.")
        # Another node's files, one with an mtime an hour old, one an hour ahead (skewed
        # clocks): neither time is compared with ours, only whether the file changes.
        silent = tmp / f"{h}.otherhost.123.deadbeef.part"
        growing = tmp / f"{h}.otherhost.124.deadbeef.part"
        for p in (dead, alive, silent, growing):
            p.write_bytes(b"x")
        os.utime(silent, (time.time() - 3600, time.time() - 3600))
        os.utime(growing, (time.time() + 3600, time.time() + 3600))
        assert cache.clean_tmp() == 1, "only the dead process's file, at first sight"
        time.sleep(1.2)  # the stale time, on this host's clock
        with growing.open("ab") as f:
            f.write(b"more")  # its writer goes on
        alive.write_bytes(b"xy")
        assert cache.clean_tmp() == 1, "the silent one, now"
        assert sorted(p.name for p in tmp.iterdir()) == sorted([alive.name, growing.name])
    finally:
        live_proc.kill()
        live_proc.wait()


def test_shared_cache_is_group_writable_and_setgid(tmp_path: Path) -> None:
    cache = Cache(tmp_path / "c", shared=True)
    data, ref = _blob(1000)
    path, _ = cache.fetch_blob(ref, _writer(data))
    for d in (tmp_path / "c", path.parent, tmp_path / "c" / "blobs", tmp_path / "c" / "tmp"):
        assert stat.S_IMODE(d.stat().st_mode) == 0o2775, d
    assert stat.S_IMODE(path.stat().st_mode) == 0o444


def test_a_shared_clients_cached_statistics_are_group_writable(
    demo_server: ServerProcess, tmp_path: Path
) -> None:
    # Shared mode asked for by the client, not inferred from the directory (0775, no setgid):
    # the statistics a dataset caches must be written in it like every other file.
    from rayform.torch import EpisodeDataset

    root = tmp_path / "team"
    root.mkdir(mode=0o775)
    os.chmod(root, 0o775)
    client = rayform.Client(endpoint=demo_server.url, token=TOKEN, cache_dir=root, shared=True)
    ds = EpisodeDataset(client.slices.get(DEMO_SLICE), obs=["joints/position"], action=None, fps=15)
    assert ds.stats()["joints/position"]["count"] == len(ds)
    # The result file and the episodes' partials (a pack in a folder per context).
    (result,) = (root / "stats").glob("*.json")
    (pack,) = (root / "stats" / "packs").rglob("*.pack")
    for folder in (root / "stats", root / "stats" / "packs", pack.parent):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o2775, folder
    for written in (result, pack):
        assert stat.S_IMODE(written.stat().st_mode) & 0o060 == 0o060  # the team may replace it


def test_cache_pickles_without_process_state(tmp_path: Path) -> None:
    cache = Cache(tmp_path / "c", locks=False)
    clone = pickle.loads(pickle.dumps(cache))
    assert clone.root == cache.root and clone.locks is False


def test_read_only_cache_gives_cache_error(tmpfs: Callable[[str], Path]) -> None:
    root = tmpfs("size=2m,ro")
    cache = Cache(root / "cache")
    data, ref = _blob(1000)
    with pytest.raises(CacheError, match="not writable.*RAYFORM_CACHE_DIR"):
        cache.fetch_blob(ref, _writer(data))
    assert list(root.iterdir()) == []


def test_full_disk_gives_cache_error_and_stays_consistent(tmpfs: Callable[[str], Path]) -> None:
    root = tmpfs("size=1m")
    cache = Cache(root / "cache")
    big, bref = _blob(3_000_000)
    with pytest.raises(CacheError, match="full.*prune"):
        cache.fetch_blob(bref, _writer(big, chunk=65536))
    assert not cache.has_blob(bref.hash)
    assert _files_under(root / "cache", "tmp") == [], "the partial file was removed"
    small, sref = _blob(10_000)
    path, _ = cache.fetch_blob(sref, _writer(small))
    assert path.read_bytes() == small
    assert cache.verify().removed == []


def test_a_claim_held_by_a_stalled_process_of_this_host_does_not_block(tmp_path: Path) -> None:
    # One claim per blob is the only lock, on one host too: a holder that lives and beats but
    # downloads nothing (its store stalled) is waited for only the stall bound.
    cache = Cache(tmp_path / "c", stall_s=0.5, claim_heartbeat_s=0.1, claim_stale_s=1.0)
    data, ref = _blob(5000)
    claim = tmp_path / "c" / "claims" / f"{ref.hash}.claim"
    claim.parent.mkdir(parents=True)
    holder = subprocess.Popen(
        [sys.executable, str(SCRIPTS / "hold_claim.py"), str(claim), "0.1"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        t0 = time.monotonic()
        path, fetched = cache.fetch_blob(ref, _writer(data))
        waited = time.monotonic() - t0
        assert path.read_bytes() == data and fetched == len(data)
        assert waited > 0.4, "it waited for the holder first"
        assert claim.exists(), "the live holder's claim was not taken from it"
    finally:
        holder.kill()
        holder.wait()


def test_a_download_whose_temporary_file_was_removed_is_fetched_again(tmp_path: Path) -> None:
    # A frozen process cleaned up after, or a node whose clock runs ahead, removes our live
    # partial: the blob must still arrive (it was "cannot move a blob into ...").
    cache = Cache(tmp_path / "c")
    data, ref = _blob(50_000)
    calls: list[int] = []

    def download(part: PartialBlob) -> None:
        _writer(data, calls)(part)
        if len(calls) == 1:
            part.path.unlink()

    path, _ = cache.fetch_blob(ref, download)
    assert path.read_bytes() == data and len(calls) == 2
    assert _files_under(tmp_path / "c", "tmp") == []

    other, ref2 = _blob(50_000, seed=1)

    def always_lost(part: PartialBlob) -> None:
        _writer(other)(part)
        part.path.unlink()

    with pytest.raises(CacheError, match="temporary file .* was removed"):
        cache.fetch_blob(ref2, always_lost)
    assert not cache.has_blob(ref2.hash)


def test_prune_keeps_a_blob_a_reader_holds_pinned(tmp_path: Path) -> None:
    cache = Cache(tmp_path / "c")
    refs = [
        cache.fetch_blob(ref, _writer(data))[0] for data, ref in (_blob(1000, i) for i in range(3))
    ]
    fd = os.open(refs[1], os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)  # what a reading job's pin holds (rayform.cache._evict.Pins)
        evicted = cache.prune(0)
        assert {e.path for e in evicted} == {refs[0], refs[2]}
        assert refs[1].is_file()
    finally:
        os.close(fd)
    assert [e.path for e in cache.prune(0)] == [refs[1]]


def test_a_host_is_its_pid_namespace_too(tmp_path: Path) -> None:
    # Containers that share a host name (`--network host`) have their own PIDs: a process of
    # another one must not pass for a dead process of ours, nor its partial for abandoned.
    code = "from rayform.cache._partial import HOST; print(HOST)"
    theirs = subprocess.run(
        ["unshare", "--pid", "--fork", sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    ).stdout.strip()
    assert theirs.split("-pid")[0] == HOST.split("-pid")[0] and theirs != HOST
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()  # a pid no process of ours has now
    for host, dead in ((theirs, False), (HOST, True)):
        partial = tmp_path / f"{'ab' * 32}.{host}.{child.pid}.0123abcd.part"
        partial.write_bytes(b"x")
        assert owner_dead(partial, stale_s=600) is dead, host
