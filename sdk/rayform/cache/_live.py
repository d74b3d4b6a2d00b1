"""Which processes of which nodes use a cache, whether they are alive, and what they added.

``live/ledger`` is one file of :data:`SLOTS` fixed-length records, one per process that
fetches into, evicts from or pins blobs of the cache (any node). A record says who holds the
slot (host, pid, a random token), a heartbeat counter, the holder's clock, how many bytes of
blobs the slot's processes added minus removed (``net``), and what the holder pins right now.

One file of fixed length, because it needs only what every network filesystem gives:

* an ``open`` reads current content, while listings and attributes may be cached for seconds
  (sshfs: 20 s; NFS: ``actimeo``), so a new process on another node, which a listing of
  ``live/`` might not show for 20 s, is seen at once in the file everyone reads;
* one length for ever, so a stale cached size never cuts a read short;
* each holder writes only its own record (``pwrite`` at its offset): no lock across nodes.

**Liveness** is the cache's one rule (:mod:`rayform.cache._liveness`), for every record of
another process: of this host, alive while its PID exists (an idle holder does not beat); of
another host, alive while its record keeps changing, judged on our own clock: unchanged for
:data:`STALE_S` since we first saw it so, it is dead. A holder rewrites its record every
:data:`BEAT_S` while it pins anything. Clock skew between the nodes changes nothing: the time
in a record is never compared with ours.

**The count.** A process that takes a dead slot inherits its ``net``, so the sum over the
slots changes exactly when a process adds or removes a blob, and any process knows the bytes
of blobs in the cache as ``base + sum(net)``, where ``base`` (what no slot accounts for, such
as a cache filled before the ledger) comes from a listing (:class:`~rayform.cache._evict.Evictor`).
A race that counts twice (two takers of one slot, say) only overcounts until the next listing.
Without a slot (all taken, or a read-only cache) a process still works; its own fetches are
then seen by others at their next listing.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import secrets
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from rayform._process import PerProcess
from rayform.cache._liveness import HOST, Observer, alive, observer
from rayform.cache._sharing import CacheModes, shared_mode

__all__ = [
    "BEAT_S",
    "SLOTS",
    "STALE_S",
    "Lease",
    "Liveness",
    "Record",
    "lease",
    "read_ledger",
]

log = logging.getLogger("rayform.cache")

#: Seconds between two heartbeats of a process that pins blobs.
BEAT_S = 1.0
#: Seconds a record of another host may stay unchanged and still count as alive.
STALE_S = 10.0
#: Records in the ledger: processes that use one cache at once, all nodes together.
SLOTS = 256
_RECORD = 128
_LEDGER = Path("live") / "ledger"


@dataclass(frozen=True)
class Record:
    """One slot of the ledger as read."""

    slot: int
    token: str
    host: str
    pid: int
    beat: int
    time: float  # the holder's wall clock (s since the epoch): shown, never compared
    net: int  # bytes of blobs this slot's processes added minus those they removed
    pins: int  # blobs the holder pins right now
    pinned: int  # their bytes
    raw: bytes
    root: Path = Path()  # the cache whose ledger holds it

    @property
    def key(self) -> str:
        """The record's name for the liveness rule."""
        return f"{_LEDGER}#{self.slot}"

    @property
    def here(self) -> bool:
        """The holder runs on this host (and PID namespace)."""
        return self.host == HOST


def _encode(token: str, beat: int, net: int, pins: int, pinned: int) -> bytes:
    line = f"{token} {HOST[:48]} {os.getpid()} {beat} {time.time():.2f} {net} {pins} {pinned}"
    return line.encode()[: _RECORD - 1].ljust(_RECORD - 1) + b"\n"


def _decode(slot: int, raw: bytes, root: Path) -> Record | None:
    parts = raw.split()
    if len(parts) != 8:
        return None  # an empty slot (zeros), or a record being written
    try:
        return Record(
            slot,
            parts[0].decode(),
            parts[1].decode(),
            int(parts[2]),
            int(parts[3]),
            float(parts[4]),
            int(parts[5]),
            int(parts[6]),
            int(parts[7]),
            raw,
            root,
        )
    except (ValueError, UnicodeDecodeError):
        return None


def read_ledger(root: Path) -> list[Record]:
    """Every record of the ledger of the cache at ``root`` (none if it has no ledger)."""
    try:
        with open(root / _LEDGER, "rb", buffering=0) as f:
            data = f.read(SLOTS * _RECORD)
    except OSError:
        return []
    out = []
    for slot in range(len(data) // _RECORD):
        rec = _decode(slot, data[slot * _RECORD : (slot + 1) * _RECORD], root)
        if rec is not None:
            out.append(rec)
    return out


class Liveness:
    """The liveness rule (module doc) for ledger records, with its own observations."""

    def __init__(self, observer: Observer | None = None) -> None:
        self._observer = observer if observer is not None else Observer()

    def alive(self, rec: Record) -> bool:
        """Whether the holder of ``rec`` is alive, by the one rule."""
        pid = rec.pid if rec.here else None
        return alive(rec.root, rec.key, rec.raw, STALE_S, pid=pid, idle=True, by=self._observer)

    def live(self, records: list[Record]) -> list[Record]:
        """The records of ``records`` whose holder is alive."""
        return [r for r in records if self.alive(r)]


#: One observer per process: what it saw of each record is its clock for the rule.
_LIVENESS: PerProcess[Liveness] = PerProcess(lambda: Liveness(observer()))


def liveness() -> Liveness:
    """This process's observer of the ledger."""
    return _LIVENESS.get()


class Lease:
    """This process's slot in the ledger of one cache: its counts and its heartbeat.

    Every method is safe from several threads and never raises: a cache where the ledger
    cannot be written (read-only, full) works without one (module doc).
    """

    def __init__(self, root: Path) -> None:
        self.root = root
        self.token = secrets.token_hex(4)
        self._lock = threading.Lock()
        self._fd: int | None = None
        self._slot: int | None = None
        self._failed = False
        self._beat = 0
        self._net = 0  # inherited from the slot's dead holder plus ours
        self._pins = 0
        self._pinned = 0
        self._inherited = 0  # the part of _net the slot's dead holder left
        self._checked = 0.0  # time.monotonic() when our slot was last seen to be ours
        self._thread: threading.Thread | None = None

    # -- what the process does -------------------------------------------------------------
    def added(self, nbytes: int) -> None:
        """This process put ``nbytes`` of blobs into the cache (negative: removed them)."""
        with self._lock:
            if self._held():
                self._net += nbytes
                self._write()

    def pinned(self, nbytes: int) -> None:
        """This process pins one more blob of ``nbytes`` (negative: one fewer); while it pins
        anything it beats, so that other nodes leave its blobs."""
        with self._lock:
            self._pins += 1 if nbytes >= 0 else -1
            self._pinned += nbytes
            if self._thread is not None and self._thread.is_alive():
                return  # its next beat, within BEAT_S, writes the new counts
            if self._pins > 0 and self._held():
                self._write()  # alive from now on: the marker about to be made names it
                self._thread = threading.Thread(
                    target=self._run, name="rayform-heartbeat", daemon=True
                )
                self._thread.start()

    def slot(self) -> int | None:
        """The slot this process holds (None without one)."""
        with self._lock:
            return self._slot if self._held() else None

    # -- the slot --------------------------------------------------------------------------
    def _held(self) -> bool:
        """Hold a slot (``_lock`` held): take one if this process has none or lost its own to
        a taker that judged it dead (an idle holder does not beat)."""
        if self._failed:
            return False
        if self._fd is None:
            self._fd = self._open()
            if self._fd is None:
                self._failed = True
                return False
        if self._slot is not None:
            now = time.monotonic()
            if now - self._checked < BEAT_S:
                return True  # a taker waits STALE_S for us to look dead: still ours
            self._checked = now
            try:
                raw = os.pread(self._fd, _RECORD, self._slot * _RECORD)
            except OSError:
                raw = b""
            rec = _decode(self._slot, raw, self.root)
            if rec is not None and rec.token == self.token:
                return True
            # A taker judged this process dead (it beats only while it pins) and inherited
            # all our slot held: from now on only what we add after this counts as ours.
            self._net = self._inherited = 0
            self._slot = None
        return self._take()

    def _open(self) -> int | None:
        path = self.root / _LEDGER
        modes = CacheModes(self.root, shared_mode(self.root, None))
        size = SLOTS * _RECORD
        try:
            modes.make_dirs(path.parent)
            try:
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
                with contextlib.suppress(OSError):
                    os.fchmod(fd, modes.file_mode)
            except FileExistsError:
                fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
            if os.fstat(fd).st_size < size:  # new, or its creator died before sizing it
                os.ftruncate(fd, size)
            return fd
        except OSError as exc:
            log.debug("no cache ledger at %s: %s", path, exc)
            return None

    def _take(self) -> bool:
        assert self._fd is not None
        try:
            data = os.pread(self._fd, SLOTS * _RECORD, 0)
        except OSError:
            return False
        free: list[tuple[int, int]] = []  # (slot, net inherited)
        watch = liveness()
        for slot in range(SLOTS):
            rec = _decode(slot, data[slot * _RECORD : (slot + 1) * _RECORD], self.root)
            if rec is None:
                free.append((slot, 0))
            elif rec.token != self.token and not watch.alive(rec):
                free.append((slot, rec.net))
        if not free:
            log.warning(
                "the ledger of cache %s has no free slot (%d processes use it): this "
                "process's fetches count for the others' limit only at their next listing",
                self.root,
                SLOTS,
            )
            self._failed = True
            return False
        # A random free slot: workers that start together rarely pick the same one (a
        # collision only overcounts until the next listing, module doc).
        slot, inherited = random.choice(free)
        self._slot, self._inherited = slot, inherited
        self._checked = time.monotonic()
        self._net += inherited
        return self._write()

    def _write(self) -> bool:
        assert self._fd is not None and self._slot is not None
        self._beat += 1
        try:
            os.pwrite(
                self._fd,
                _encode(self.token, self._beat, self._net, self._pins, self._pinned),
                self._slot * _RECORD,
            )
            return True
        except OSError:
            return False

    def _run(self) -> None:
        while True:
            time.sleep(BEAT_S)
            with self._lock:
                if self._pins <= 0 or not self._held():
                    self._thread = None
                    return  # nothing pinned: nobody needs to see this process alive
                self._write()


_LEASES: PerProcess[dict[Path, Lease]] = PerProcess(dict)
_LEASES_LOCK = threading.Lock()


def lease(root: Path) -> Lease:
    """This process's lease on the cache at ``root`` (a forked child gets its own)."""
    leases = _LEASES.get()
    with _LEASES_LOCK:
        found = leases.get(root)
        if found is None:
            found = leases[root] = Lease(root)
        return found
