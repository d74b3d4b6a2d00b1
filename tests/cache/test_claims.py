"""Download claims (``claims/<hash>.claim``) on one real filesystem, nodes simulated by records.

A claim of "another node" is a file this test writes and rewrites itself, with another host
name in it: the cache cannot check that host's pids, so only the record's changes tell it the
holder lives. The two-mount tests in ``test_claims_nodes.py`` run the same against sshfs.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from rayform.cache import Cache
from rayform.cache._claims import read_claim
from rayform.cache._partial import HOST, PartialBlob
from rayform.errors import InvalidArgumentError
from rayform.format import hash_bytes
from rayform.manifest import BlobRef

FAST = {"claim_heartbeat_s": 0.1, "claim_stale_s": 1.0, "stall_s": 1.0}


def _blob(n: int, seed: int = 0) -> tuple[bytes, BlobRef]:
    data = bytes((i * 31 + seed) % 251 for i in range(n))
    return data, BlobRef(hash_bytes(data), len(data))


def _writer(data: bytes, calls: list[int], delay_s: float = 0.0) -> Callable[[PartialBlob], None]:
    def download(part: PartialBlob) -> None:
        calls.append(part.offset)
        for pos in range(part.offset, len(data), 4096):
            part.write(data[pos : pos + 4096])
            time.sleep(delay_s)

    return download


def _record(
    host: str, pid: int, beat: int, nbytes: int = 0, token: str = "feedface", part: str = ""
) -> bytes:
    doc = {
        "host": host,
        "pid": pid,
        "uid": os.geteuid(),
        "token": token,
        "beat": beat,
        "bytes": nbytes,
        "part": part,
        "time": 0,
    }
    return json.dumps(doc).encode().ljust(255) + b"\n"


class ForeignHolder:
    """A claim held by a process on another node: rewritten every 0.1 s while ``beating``,
    its byte count growing while ``growing``; its partial file is ``tmp/<part>``."""

    def __init__(self, path: Path, *, growing: bool = True, part: str = "") -> None:
        self.path = path
        self.growing = growing
        self.part = part
        self.beating = True
        self._stop = threading.Event()
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(_record("othernode", 4242, 0))
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        beat = 0
        while not self._stop.wait(0.1):
            if self.beating and self.path.exists():
                beat += 1
                self.path.write_bytes(
                    _record(
                        "othernode", 4242, beat, beat * 100 if self.growing else 0, part=self.part
                    )
                )

    def stop(self, remove: bool = True) -> None:
        self._stop.set()
        self._thread.join()
        if remove:
            self.path.unlink(missing_ok=True)


@pytest.fixture
def holder(tmp_path: Path) -> Iterator[Callable[..., ForeignHolder]]:
    made: list[ForeignHolder] = []

    def make(digest: str, **kw: bool | str) -> ForeignHolder:
        h = ForeignHolder(tmp_path / "c" / "claims" / f"{digest}.claim", **kw)
        made.append(h)
        return h

    try:
        yield make
    finally:
        for h in made:
            h.stop(remove=False)


def test_a_live_claim_of_another_node_is_waited_for_not_duplicated(
    tmp_path: Path, holder: Callable[..., ForeignHolder]
) -> None:
    data, ref = _blob(50_000)
    remote = holder(ref.hash)

    def finish_remotely() -> None:  # the other node completes the blob, then releases
        time.sleep(1.5)
        Cache(tmp_path / "c", locks=False).fetch_blob(ref, _writer(data, []))
        remote.stop()

    t = threading.Thread(target=finish_remotely)
    t.start()
    calls: list[int] = []
    t0 = time.monotonic()
    path, fetched = Cache(tmp_path / "c", **FAST).fetch_blob(ref, _writer(data, calls))
    t.join()
    assert calls == [] and fetched == 0, "waited for the holder instead of downloading"
    assert time.monotonic() - t0 > 1.0  # longer than the stale time: beats kept it alive
    assert path.read_bytes() == data


def test_a_stale_claim_of_a_dead_node_is_taken_over_and_its_partial_copied(
    tmp_path: Path, holder: Callable[..., ForeignHolder]
) -> None:
    data, ref = _blob(60_000)
    theirs = tmp_path / "c" / "tmp" / f"{ref.hash}.othernode.4242.0badcafe.part"
    remote = holder(ref.hash, part=theirs.name)
    tmp = theirs.parent
    tmp.mkdir(parents=True)
    theirs.write_bytes(data[:20_000])
    time.sleep(0.3)
    remote.beating = False  # the node dies: its record stops changing
    calls: list[int] = []
    t0 = time.monotonic()
    path, fetched = Cache(tmp_path / "c", **FAST).fetch_blob(ref, _writer(data, calls))
    waited = time.monotonic() - t0
    assert 0.9 < waited < 10, waited  # the stale time (1 s) on our clock, then at once
    assert calls == [20_000], "the dead node's 20,000 bytes were adopted"
    assert fetched == 40_000 and path.read_bytes() == data
    assert list(tmp.iterdir()) == [], "the copied partial is removed once the blob is complete"
    assert list((tmp_path / "c" / "claims").iterdir()) == []


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_a_claim_of_a_dead_process_of_this_host_is_taken_over_at_once(tmp_path: Path) -> None:
    data, ref = _blob(10_000)
    claim = tmp_path / "c" / "claims" / f"{ref.hash}.claim"
    claim.parent.mkdir(parents=True)
    claim.write_bytes(_record(HOST, _dead_pid(), 3))
    t0 = time.monotonic()
    path, _ = Cache(tmp_path / "c").fetch_blob(ref, _writer(data, []))
    assert time.monotonic() - t0 < 5  # not the 15 s stale time: the pid is gone
    assert path.read_bytes() == data and not claim.exists()


def test_a_holder_that_beats_but_downloads_nothing_is_not_waited_for_long(
    tmp_path: Path, holder: Callable[..., ForeignHolder]
) -> None:
    data, ref = _blob(10_000)
    holder(ref.hash, growing=False)  # alive (record changing), but its byte count never moves
    calls: list[int] = []
    t0 = time.monotonic()
    path, _ = Cache(tmp_path / "c", **FAST).fetch_blob(ref, _writer(data, calls))
    assert 0.9 < time.monotonic() - t0 < 10
    assert calls == [0] and path.read_bytes() == data


def test_the_holder_beats_reports_its_bytes_and_releases(tmp_path: Path) -> None:
    data, ref = _blob(200_000)
    cache = Cache(tmp_path / "c", claim_heartbeat_s=0.1, claim_stale_s=1.0)
    claim = tmp_path / "c" / "claims" / f"{ref.hash}.claim"
    seen: list[dict[str, int]] = []

    def watch() -> None:
        while not cache.has_blob(ref.hash):
            raw = read_claim(claim)
            if raw:
                seen.append(json.loads(raw))
            time.sleep(0.05)

    t = threading.Thread(target=watch)
    t.start()
    cache.fetch_blob(ref, _writer(data, [], delay_s=0.02))  # about 1 s
    t.join()
    beats = sorted({d["beat"] for d in seen})
    assert len(beats) >= 3, beats
    assert max(d["bytes"] for d in seen) > 0
    assert {d["pid"] for d in seen} == {os.getpid()}
    assert not claim.exists(), "released once the blob is complete"


def test_a_holder_taken_over_while_frozen_stops_beating_and_still_ends_with_one_blob(
    tmp_path: Path,
) -> None:
    data, ref = _blob(100_000)
    cache = Cache(tmp_path / "c", claim_heartbeat_s=0.1, claim_stale_s=1.0)
    claim = tmp_path / "c" / "claims" / f"{ref.hash}.claim"
    taker = _record("othernode", 4242, 1, token="0123abcd")

    def download(part: PartialBlob) -> None:
        claim.write_bytes(taker)  # another node took the claim over meanwhile
        time.sleep(0.5)
        for pos in range(part.offset, len(data), 4096):
            part.write(data[pos : pos + 4096])

    path, _ = cache.fetch_blob(ref, download)
    assert read_claim(claim) == taker, "neither overwritten by a beat nor removed"
    assert path.read_bytes() == data


def test_clean_tmp_removes_dead_and_stale_claims_and_keeps_live_ones(tmp_path: Path) -> None:
    claims = tmp_path / "c" / "claims"
    claims.mkdir(parents=True)
    dead = claims / f"{'a' * 64}.claim"
    dead.write_bytes(_record(HOST, _dead_pid(), 1))
    old = claims / f"{'b' * 64}.claim"  # another node's, silent from now on
    old.write_bytes(_record("othernode", 1, 1))
    # Its mtime an hour old says nothing: only this host's watching of the record counts.
    os.utime(old, (time.time() - 3600, time.time() - 3600))
    aside = claims / f"{'c' * 64}.claim.othernode.7.abcd.stale"
    aside.write_bytes(b"")
    live = claims / f"{'d' * 64}.claim"
    live.write_bytes(_record("othernode", 1, 1))
    mine = claims / f"{'e' * 64}.claim"
    mine.write_bytes(_record(HOST, os.getppid(), 1))
    stray = claims / "not-a-hash.claim"
    stray.write_bytes(b"")
    data, ref = _blob(1000)
    cache = Cache(tmp_path / "c", claim_heartbeat_s=0.1, claim_stale_s=1.0)
    cache.fetch_blob(ref, _writer(data, []))
    done = claims / f"{ref.hash}.claim"  # a holder killed between publishing and releasing
    done.write_bytes(_record("othernode", 1, 1))
    assert cache.clean_tmp() == 2, "the dead holder's and the finished blob's, not yet the others"
    assert old.exists() and aside.exists()
    time.sleep(1.2)  # the stale time on this host's clock; only the live holders beat
    live.write_bytes(_record("othernode", 1, 2))
    mine.write_bytes(_record(HOST, os.getppid(), 2))
    # A new process of this host (a one-off `rayform cache verify`) starts from what the
    # last one saw, kept in live/: it need not watch for the stale time itself.
    code = (
        "import sys; from rayform.cache import Cache; "
        "print(Cache(sys.argv[1], claim_heartbeat_s=0.1, claim_stale_s=1.0).clean_tmp())"
    )
    done_run = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "c")], capture_output=True, text=True
    )
    assert done_run.stdout.strip() == "3", done_run.stderr  # the silent one, aside and stray
    assert sorted(p.name for p in claims.iterdir()) == sorted([live.name, mine.name])


def test_claims_get_the_shared_cache_mode(tmp_path: Path) -> None:
    data, ref = _blob(100_000)
    cache = Cache(tmp_path / "c", shared=True, claim_heartbeat_s=0.1, claim_stale_s=1.0)
    modes: list[int] = []

    def download(part: PartialBlob) -> None:
        claim = tmp_path / "c" / "claims" / f"{ref.hash}.claim"
        modes.append(stat.S_IMODE(claim.stat().st_mode))
        part.write(data)

    cache.fetch_blob(ref, download)
    assert modes == [0o664]
    assert stat.S_IMODE((tmp_path / "c" / "claims").stat().st_mode) == 0o2775


@pytest.mark.parametrize("beat, stale", [(0, 15), (2, 3), (-1, 15)])
def test_claim_times_are_checked(tmp_path: Path, beat: float, stale: float) -> None:
    with pytest.raises(InvalidArgumentError, match="claim_stale_s"):
        Cache(tmp_path / "c", claim_heartbeat_s=beat, claim_stale_s=stale)
