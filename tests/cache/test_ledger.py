"""The cache's ledger: one record per process, one liveness rule, byte counts that add up.

Records of "another node" are written here as that node writes them (the fixed-length format
is what nodes share); the rule is judged on this process's clock.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from rayform.cache import _live
from rayform.cache._live import Lease, Liveness, read_ledger


def _write(cache: Path, slot: int, host: str, pid: int, beat: int, stamp: float, net: int) -> None:
    ledger = cache / "live" / "ledger"
    ledger.parent.mkdir(parents=True, exist_ok=True)
    if not ledger.exists():
        ledger.write_bytes(b"\0" * (_live.SLOTS * 128))
    record = f"tok{slot:05d} {host} {pid} {beat} {stamp:.2f} {net} 1 100".encode()
    with open(ledger, "r+b") as f:
        f.seek(slot * 128)
        f.write(record.ljust(127) + b"\n")


def _dead_pid() -> int:
    done = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        check=True,
        capture_output=True,
        text=True,
    )
    return int(done.stdout)


def test_another_nodes_record_is_alive_while_it_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_live, "STALE_S", 0.5)
    watch = Liveness()
    _write(tmp_path, 3, "node-b", 4242, 1, time.time(), 0)
    [rec] = read_ledger(tmp_path)
    assert watch.alive(rec)
    time.sleep(0.7)  # unchanged for longer than the stale time, on our clock
    assert not watch.alive(read_ledger(tmp_path)[0])
    _write(tmp_path, 3, "node-b", 4242, 2, time.time(), 0)  # a heartbeat
    assert watch.alive(read_ledger(tmp_path)[0])


@pytest.mark.parametrize("skew_s", [-3600.0, 0.0, 3600.0], ids=["behind", "in-step", "ahead"])
def test_clock_skew_changes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, skew_s: float
) -> None:
    # A node an hour behind, in step, or an hour ahead: alive at first sight, alive while it
    # beats, dead a stale time after its last beat, on our clock alike.
    monkeypatch.setattr(_live, "STALE_S", 1.5)
    watch = Liveness()
    _write(tmp_path, 1, "node-b", 7, 1, time.time() + skew_s, 0)
    assert watch.alive(read_ledger(tmp_path)[0])
    for beat in (2, 3):
        time.sleep(0.2)
        _write(tmp_path, 1, "node-b", 7, beat, time.time() + skew_s, 0)
        assert watch.alive(read_ledger(tmp_path)[0]), beat
    time.sleep(1.7)
    assert not watch.alive(read_ledger(tmp_path)[0])


def test_a_dead_process_of_this_host_is_dead_at_once(tmp_path: Path) -> None:
    from rayform.cache import HOST

    _write(tmp_path, 0, HOST, _dead_pid(), 1, time.time(), 0)
    assert not Liveness().alive(read_ledger(tmp_path)[0])


def test_a_slot_taken_from_a_dead_process_keeps_its_count(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rayform.cache import HOST

    monkeypatch.setattr(_live, "SLOTS", 2)
    _write(tmp_path, 0, "node-b", 99, 1, time.time(), 500)  # alive: not free
    _write(tmp_path, 1, HOST, _dead_pid(), 1, time.time(), 1000)  # dead: free, with its bytes
    lease = Lease(tmp_path)
    lease.added(50)
    assert lease.slot() == 1
    assert sum(r.net for r in read_ledger(tmp_path)) == 500 + 1000 + 50
    lease.added(-30)
    assert sum(r.net for r in read_ledger(tmp_path)) == 500 + 1000 + 20


def test_a_process_whose_slot_was_taken_counts_only_what_it_adds_after(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_live, "BEAT_S", 0.0)  # it looks at its slot on every write
    lease = Lease(tmp_path)
    lease.added(100)
    slot = lease.slot()
    assert slot is not None
    # A taker (judging this idle process dead) inherited the 100 bytes and holds the slot now.
    _write(tmp_path, slot, "node-c", 5, 1, time.time(), 100)
    lease.added(7)
    assert lease.slot() != slot
    assert sum(r.net for r in read_ledger(tmp_path)) == 107


def test_a_read_only_cache_works_without_a_ledger(tmp_path: Path) -> None:
    (tmp_path / "live").write_text("not a directory")  # the ledger cannot be made
    lease = Lease(tmp_path)
    lease.added(10)
    lease.pinned(10)
    assert lease.slot() is None and read_ledger(tmp_path) == []
