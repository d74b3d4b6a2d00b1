"""A bounded cache: evict least recently used blobs, never one a process is using.

Who uses a blob is told by *pins*: a process that resolved a blob for reading (or scheduled it
for read-ahead) keeps it open with a shared ``flock``, and creates a marker file in ``pins/``
(:mod:`rayform.cache._pinmarks`). An evictor leaves every blob with a live marker (any node),
and takes the blob's exclusive ``flock`` without waiting before it unlinks it (this node).
Correctness does not depend on either: a process that has a blob open keeps reading it after
an unlink on most filesystems (POSIX keeps the inode until the last descriptor closes), and a
read that finds its blob gone or changed fetches it again with a warning
(:func:`rayform.cache._reread.read_blob`), or gets a clear
:class:`~rayform.errors.OfflineError` offline. Blobs are immutable and named by their hash, so
a re-fetched blob is the same file at the same path.

Each process keeps at most ``max_pins`` pins (least recently pinned dropped first): enough for
the segments it is reading and the read-ahead window, so a process never holds the whole cache.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from rayform._ids import HASH_RE
from rayform._process import PerProcess
from rayform.cache._live import lease, read_ledger
from rayform.cache._pinmarks import Marks, marked
from rayform.errors import InvalidArgumentError
from rayform.units import human_bytes

__all__ = ["EvictReport", "Evictor", "Pins", "check_fits", "evict_lru", "evict_one"]

#: Pins one process keeps by default (a segment's blobs plus a read-ahead window).
DEFAULT_MAX_PINS = 32


class _Held:
    """One process's pins: descriptors by blob hash (least recently pinned first), and the
    marker files that make them seen on other nodes."""

    def __init__(self) -> None:
        self.fds: OrderedDict[str, int] = OrderedDict()
        self.markers: dict[str, str] = {}
        self.marks = Marks()
        self.lock = threading.Lock()

    def used(self, name: str) -> None:
        """Mark the pin of ``name`` most recently used (``lock`` held)."""
        self.fds.move_to_end(name)

    def drop(self, name: str) -> None:
        """Unpin ``name`` (``lock`` held)."""
        os.close(self.fds.pop(name))
        marker = self.markers.pop(name, None)
        if marker is not None:
            self.marks.remove(marker)

    def trim(self, n: int) -> None:
        """Unpin the least recently pinned blobs until at most ``n`` are held (``lock`` held)."""
        while len(self.fds) > n:
            self.drop(next(iter(self.fds)))


class Pins:
    """This process's pinned blobs: open read-only descriptors holding a shared ``flock``.

    Safe to use from several threads. The pins are per process (:class:`~rayform._process.
    PerProcess`): a forked child starts with none, without touching the parent's descriptors'
    locks (which the child shares), and a pickled copy starts with none.
    """

    def __init__(self, max_pins: int = DEFAULT_MAX_PINS, *, across_nodes: bool = True) -> None:
        self.max_pins = max_pins
        #: Pins kept at least whatever ``max_pins`` is (:meth:`keep_at_least`).
        self.floor = 0
        self.across_nodes = across_nodes  # also a marker file (rayform.cache._pinmarks)
        self._held: PerProcess[_Held] = PerProcess(_Held)

    def pin(self, path: Path) -> bool:
        """Pin the blob at ``path`` (or mark it most recently pinned). False if it is gone."""
        held = self._held.get()
        name = path.name
        with held.lock:
            if name in held.fds:
                held.used(name)
                return True
        try:
            size = os.stat(path).st_size
        except FileNotFoundError:
            return False
        # The marker first: an evictor on another node that lists pins/ after this leaves
        # the blob (one that listed before may remove it: the check below, or the reader's
        # fetch again, catches that).
        marker = held.marks.add(path, size) if self.across_nodes else None
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            if marker is not None:
                with held.lock:
                    held.marks.remove(marker)
            return False
        with contextlib.suppress(OSError):  # no flock here: eviction may race (see module doc)
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        # An eviction between our open and our lock unlinked the file: the pin would hold a
        # removed file while the path names nothing (or a new copy nobody pins).
        try:
            pinned_it = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            pinned_it = False
        if not pinned_it:
            os.close(fd)
            if marker is not None:
                with held.lock:
                    held.marks.remove(marker)
            return False
        with held.lock:
            if name in held.fds:  # another thread pinned it meanwhile (one marker per process)
                os.close(fd)
                held.used(name)
                return True
            held.fds[name] = fd
            if marker is not None:
                held.markers[name] = marker
            held.trim(max(self.max_pins, self.floor))
        return True

    def keep_at_least(self, n: int) -> None:
        """Never drop below ``n`` pins (the most recently used ones), even after a
        :meth:`holding` block ends: read-ahead keeps the blobs of the coming episodes this way
        in the pins the reader uses, so each blob is pinned once per process."""
        self.floor = max(self.floor, n)

    def holds(self, digest: str) -> bool:
        """Whether this process has the blob ``digest`` pinned."""
        held = self._held.get()
        with held.lock:
            return digest in held.fds

    @contextlib.contextmanager
    def holding(self, n: int) -> Iterator[None]:
        """Keep at least ``n`` pins inside the block (the blobs of a whole batch, which are
        resolved before any of them is decoded), then drop the oldest down to ``max_pins``."""
        base = self.max_pins
        self.max_pins = max(base, n)
        try:
            yield
        finally:
            self.max_pins = base
            held = self._held.get()
            with held.lock:
                held.trim(max(base, self.floor))

    def pinned(self) -> set[str]:
        """Hashes of the blobs this process has pinned."""
        held = self._held.get()
        with held.lock:
            return set(held.fds)

    def close(self) -> None:
        """Drop every pin of this process."""
        held = self._held.get()
        with held.lock:
            held.trim(0)


@dataclass(frozen=True)
class EvictReport:
    """What one eviction pass did: blobs and bytes removed, bytes left, blobs skipped (in use)."""

    evicted: int
    evicted_bytes: int
    total_bytes: int
    skipped_in_use: int


def _blobs(root: Path) -> list[tuple[float, int, Path]]:
    out = []
    with contextlib.suppress(FileNotFoundError):
        for shard in os.scandir(root / "blobs"):
            # No is_dir(): a network filesystem may not give the entry's type, and a stat per
            # shard over sshfs cost more than the listing; a file here is simply not listable.
            with contextlib.suppress(FileNotFoundError, NotADirectoryError):
                for entry in os.scandir(shard.path):
                    if not HASH_RE.fullmatch(entry.name):
                        # Not a blob: a FUSE mount's ``.fuse_hidden*`` is a blob evicted while
                        # open here, removed (and counted) already.
                        continue
                    try:
                        st = entry.stat()
                    except FileNotFoundError:
                        continue
                    out.append((max(st.st_atime, st.st_mtime), st.st_size, Path(entry.path)))
    return out


#: :func:`unlink_unpinned`'s answers.
REMOVED, GONE, PINNED = "removed", "gone", "pinned"


def unlink_unpinned(path: Path) -> tuple[str, int]:
    """Unlink ``path`` unless a process holds it pinned (where ``flock`` works).

    Returns:
        ``(REMOVED, bytes)`` by this call, ``(GONE, 0)`` already (another evictor took it) or
        ``(PINNED, 0)`` (left in place).
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return GONE, 0
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                return PINNED, 0
            # no flock on this filesystem: go ahead, readers survive an unlink (module doc)
        size = os.fstat(fd).st_size
        try:
            os.unlink(path)
        except FileNotFoundError:
            return GONE, 0
        return REMOVED, size
    finally:
        os.close(fd)


def _root_of(blob: Path) -> Path:
    return blob.parent.parent.parent  # ROOT/blobs/ab/<hash>


def evict_one(path: Path) -> bool:
    """Unlink the blob at ``path`` unless a process holds it pinned; True if it is gone now.

    Its bytes leave this process's count in the cache's ledger (:mod:`rayform.cache._live`).
    """
    done, size = unlink_unpinned(path)
    if done == REMOVED:
        lease(_root_of(path)).added(-size)
    return done != PINNED


def _evict(
    entries: list[tuple[float, int, Path]], total: int, limit: int, keep: set[str]
) -> tuple[EvictReport, set[Path]]:
    """Evict from ``entries`` (least recently used first) until ``total`` bytes (the cache's,
    by the ledger) are at most ``limit``."""
    evicted_bytes = skipped = 0
    gone: set[Path] = set()
    for _, _, path in entries:
        if total <= limit:
            break
        if path.name in keep:
            skipped += 1
            continue
        try:
            done, size = unlink_unpinned(path)
        except OSError:
            done, size = PINNED, 0
        if done == PINNED:
            skipped += 1
            continue
        gone.add(path)  # by us or by another evictor, whose own count says so
        if done == REMOVED:
            lease(_root_of(path)).added(-size)
            total -= size
            evicted_bytes += size
    return EvictReport(sum(1 for _ in gone), evicted_bytes, total, skipped), gone


def evict_lru(root: Path, limit: int, keep: Iterable[str] = ()) -> EvictReport:
    """Remove least recently used blobs under ``root`` until they total at most ``limit`` bytes.

    Blobs pinned by any process of any node (and the hashes in ``keep``) stay, even if that
    leaves the cache over the limit: it gets back under once they are released.
    """
    entries = sorted(_blobs(root))
    total = sum(size for _, size, _ in entries)
    return _evict(entries, total, limit, set(keep) | marked(root))[0]


#: Seconds one process trusts its listing of the cache for which blobs exist (the bytes come
#: from the ledger at every fetch); a listing also corrects the count for what no process
#: counted (a blob removed by hand, a race that counted a blob twice).
RELIST_S = 30.0
#: At least this long between two listings that an eviction without candidates asks for.
_MIN_RELIST_S = 1.0


class Evictor:
    """Keeps the cache's blobs under a limit after every fetch, counting every node's fetches.

    After each fetch, this process adds the blob to its record in the cache's ledger
    (:mod:`rayform.cache._live`) and reads the ledger: the bytes of blobs in the cache are the
    ``base`` of its last listing plus every slot's count, so another node's fetch a moment ago
    counts at once, without listing the cache (a listing reads every shard directory and
    stats every blob: tens of milliseconds over sshfs, and listings are cached there for
    seconds). Over the limit, it evicts least recently used blobs of its listing, none pinned
    by a live reader of any node; a listing is made again every :data:`RELIST_S`, or at once
    when it has nothing left to evict.
    """

    def __init__(self, root: Path) -> None:
        self.root = root
        self._scan: PerProcess[_LastScan] = PerProcess(_LastScan)

    def after_fetch(
        self, nbytes: int, limit: int, keep: Iterable[str], path: Path | None = None
    ) -> EvictReport | None:
        """Evict down to ``limit`` after this process put the blob at ``path`` (``nbytes``) in
        the cache (which counted it in the ledger); None when the cache is under the limit."""
        scan = self._scan.get()
        with scan.lock:
            now = time.monotonic()
            if scan.entries is None or now - scan.at > RELIST_S:
                self._list(scan)
            elif path is not None and nbytes:
                scan.entries.append((time.time(), nbytes, path))  # the most recently used
            report = self._pass(scan, limit, keep)
            if (
                report is not None
                and report.total_bytes > limit
                and time.monotonic() - scan.at > _MIN_RELIST_S
            ):
                self._list(scan)  # ran out of what it knew: others' blobs are candidates too
                again = self._pass(scan, limit, keep)
                if again is not None:
                    report = EvictReport(
                        report.evicted + again.evicted,
                        report.evicted_bytes + again.evicted_bytes,
                        again.total_bytes,
                        again.skipped_in_use,
                    )
            return report

    def _list(self, scan: _LastScan) -> None:
        before = sum(r.net for r in read_ledger(self.root))  # first: a race overcounts
        scan.entries = sorted(_blobs(self.root))
        scan.base = sum(size for _, size, _ in scan.entries) - before
        scan.at = time.monotonic()

    def _pass(self, scan: _LastScan, limit: int, keep: Iterable[str]) -> EvictReport | None:
        assert scan.entries is not None
        records = read_ledger(self.root)
        total = scan.base + sum(r.net for r in records)
        if total <= limit:
            return None
        report, gone = _evict(scan.entries, total, limit, set(keep) | marked(self.root, records))
        scan.entries = [e for e in scan.entries if e[2] not in gone]
        return report

    def total(self) -> int | None:
        """Bytes of blobs in the cache as this process counts them (None before a fetch)."""
        scan = self._scan.get()
        with scan.lock:
            if scan.entries is None:
                return None
            return scan.base + sum(r.net for r in read_ledger(self.root))


class _LastScan:
    """One process's listing of the cache's blobs (least recently used first), and what the
    ledger's counts did not account for then."""

    def __init__(self) -> None:
        self.entries: list[tuple[float, int, Path]] | None = None
        self.base = 0  # bytes listed minus the sum of the ledger's counts at the listing
        self.at = 0.0  # time.monotonic() of the listing
        self.lock = threading.Lock()


def check_fits(limit: int | None, need: int, what: str) -> None:
    """Raise up front when one unit of work (``need`` bytes) cannot fit under ``limit``.

    Raises:
        InvalidArgumentError: ``need > limit``; the message says what to change.
    """
    if limit is not None and need > limit:
        raise InvalidArgumentError(
            f"the cache limit {human_bytes(limit)} ({limit} bytes) is smaller than {what} "
            f"({human_bytes(need)}), which must be in the cache at once: raise cache_limit / "
            "RAYFORM_CACHE_LIMIT / --max-cache above it, or ask for fewer streams"
        )
