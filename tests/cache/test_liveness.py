"""The one liveness rule for files other processes or nodes leave (``rayform.cache._liveness``).

"Another node" is a writer whose host name is not ours and whose clock is hours off: its
files carry its time stamps and an ``mtime`` set with ``os.utime`` to the far past or future.
The rule must judge it as it judges a writer in step: alive while its heartbeat changes, dead
a stale time after it stops, both on the reader's own clock.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from rayform.cache import HOST, Cache
from rayform.cache._claims import read_claim
from rayform.cache._liveness import Observer, alive
from rayform.cache._partial import PartialBlob
from rayform.format import hash_bytes
from rayform.manifest import BlobRef

HOURS = [-5 * 3600.0, 0.0, 5 * 3600.0]
IDS = ["behind", "in-step", "ahead"]


def _claim_record(beat: int, stamp: float, nbytes: int) -> bytes:
    doc = {
        "host": "skewed-node",
        "pid": 4242,
        "uid": os.geteuid(),
        "token": "5cecafe0",
        "beat": beat,
        "bytes": nbytes,
        "part": "",
        "time": stamp,
    }
    return json.dumps(doc).encode().ljust(255) + b"\n"


@pytest.mark.parametrize("skew_s", HOURS, ids=IDS)
def test_a_skewed_writers_claim_is_waited_for_while_it_beats_and_taken_over_after(
    tmp_path: Path, skew_s: float
) -> None:
    data = bytes(range(256)) * 100
    ref = BlobRef(hash_bytes(data), len(data))
    claim = tmp_path / "c" / "claims" / f"{ref.hash}.claim"
    claim.parent.mkdir(parents=True)
    stop = threading.Event()
    beating = threading.Event()
    beating.set()

    def beat() -> None:  # the skewed node: its time stamps and the file's mtime hours off
        n = 0
        while not stop.wait(0.1):
            if beating.is_set():
                n += 1
                claim.write_bytes(_claim_record(n, time.time() + skew_s, n * 10))
                os.utime(claim, (time.time() + skew_s, time.time() + skew_s))

    claim.write_bytes(_claim_record(0, time.time() + skew_s, 0))
    thread = threading.Thread(target=beat, daemon=True)
    thread.start()
    calls: list[int] = []

    def download(part: PartialBlob) -> None:
        calls.append(part.offset)
        part.write(data[part.offset :])

    cache = Cache(tmp_path / "c", claim_heartbeat_s=0.1, claim_stale_s=1.0, stall_s=30.0)
    got: list[Path] = []
    fetch = threading.Thread(target=lambda: got.append(cache.fetch_blob(ref, download)[0]))
    try:
        fetch.start()
        fetch.join(2.5)
        assert fetch.is_alive() and calls == [], "a beating claim is waited for, whatever its clock"
        beating.clear()  # the node dies
        fetch.join(20)
        assert got and got[0].read_bytes() == data, "taken over a stale time after its last beat"
        assert calls == [0]
        assert read_claim(claim) is None, "the taker released its own claim"
    finally:
        stop.set()
        thread.join()


@pytest.mark.parametrize("skew_s", HOURS, ids=IDS)
def test_a_skewed_nodes_pin_counts_while_its_record_beats(tmp_path: Path, skew_s: float) -> None:
    cache = Cache(tmp_path / "c")
    data = b"pinned blob" * 100
    ref = BlobRef(hash_bytes(data), len(data))
    cache.fetch_blob(ref, lambda part: part.write(data))
    ledger = tmp_path / "c" / "live" / "ledger"
    raw = bytearray(ledger.read_bytes()) if ledger.exists() else bytearray(256 * 128)
    slot = next(i for i in range(256) if not raw[i * 128 : (i + 1) * 128].strip(b"\0"))

    def beat(n: int) -> None:
        line = f"5cecafe0 skewed-node 4242 {n} {time.time() + skew_s:.2f} 0 1 {len(data)}"
        raw[slot * 128 : (slot + 1) * 128] = line.encode().ljust(127) + b"\n"
        ledger.parent.mkdir(parents=True, exist_ok=True)
        ledger.write_bytes(bytes(raw))

    beat(1)
    (tmp_path / "c" / "pins").mkdir(exist_ok=True)
    marker = tmp_path / "c" / "pins" / f"{ref.hash}.skewed-node.4242.5cecafe0-abcdef"
    marker.write_bytes(b"")
    os.utime(marker, (time.time() + skew_s, time.time() + skew_s))
    assert cache.prune(0) == [], "pinned by a live node at first sight"
    assert cache.du()["pinned_blobs"] == 1
    beat(2)
    assert cache.prune(0) == []


def test_a_host_memory_of_another_boot_is_not_trusted(tmp_path: Path) -> None:
    # What an earlier process saw helps a one-off command only within one boot of this host:
    # readings of another boot's clock mean nothing here.
    root = tmp_path / "c"
    key = "tmp/x"
    first = Observer()
    assert first.unchanged_s(root, key, b"beat 1") == 0.0
    time.sleep(0.3)
    first.save(root, [key])
    memory = root / "live" / f"seen.{HOST}"
    code = (
        "import sys; from pathlib import Path; from rayform.cache._liveness import Observer; "
        "print(Observer().unchanged_s(Path(sys.argv[1]), 'tmp/x', b'beat 1'))"
    )

    def later() -> float:
        out = subprocess.run(
            [sys.executable, "-c", code, str(root)], capture_output=True, text=True, check=True
        )
        return float(out.stdout)

    assert later() >= 0.3, "the same boot: the earlier watching counts"
    doc = json.loads(memory.read_bytes())
    memory.write_text(json.dumps({**doc, "boot": "another-boot"}))
    assert later() == 0.0, "another boot: starts from nothing"


def test_the_rule_for_a_writer_of_this_host_is_its_pid(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        check=True,
        capture_output=True,
        text=True,
    )
    dead = int(done.stdout)
    watch = Observer()
    assert not alive(tmp_path, "k", b"1", 60.0, pid=dead, by=watch), "gone: dead at once"
    assert alive(tmp_path, "k", b"1", 60.0, pid=os.getppid(), by=watch)
    # A live process that has not beaten for the stale time is frozen: dead for the rule,
    # unless it may rest without beating (an idle ledger record).
    assert not alive(tmp_path, "k", b"1", 0.0, pid=os.getppid(), by=watch)
    assert alive(tmp_path, "k", b"1", 0.0, pid=os.getppid(), idle=True, by=watch)
