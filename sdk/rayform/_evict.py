"""A bounded cache: evict least recently used blobs, never one a process is using.

Who uses a blob is told by *pins*: a process that resolved a blob for reading (or scheduled it
for read-ahead) keeps it open with a shared ``flock``. An evictor takes the blob's exclusive
``flock`` without waiting before it unlinks it, so where locks work nothing in use is ever
removed. Correctness does not depend on that: a process that has a blob open keeps reading it
after an unlink (POSIX keeps the inode until the last descriptor closes), and a process that
finds its blob gone fetches it again (online) or gets a clear
:class:`~rayform.errors.OfflineError`. Blobs are immutable and named by their hash, so a
re-fetched blob is the same file at the same path.

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
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from rayform._units import human_bytes
from rayform.errors import InvalidArgumentError

__all__ = ["EvictReport", "Evictor", "Pins", "check_fits", "evict_lru"]

#: Pins one process keeps by default (a segment's blobs plus a read-ahead window).
DEFAULT_MAX_PINS = 32


class Pins:
    """This process's pinned blobs: open read-only descriptors holding a shared ``flock``.

    Safe to use from several threads; reset (without touching the parent's descriptors' locks,
    which the child shares) after a fork.
    """

    def __init__(self, max_pins: int = DEFAULT_MAX_PINS) -> None:
        self.max_pins = max_pins
        self._fds: OrderedDict[str, int] = OrderedDict()
        self._lock = threading.Lock()
        self._pid = os.getpid()

    def __getstate__(self) -> dict[str, object]:
        return {"max_pins": self.max_pins}

    def __setstate__(self, state: dict[str, object]) -> None:
        self.__init__(int(state["max_pins"]))  # type: ignore[misc,call-overload]

    def _check_pid(self) -> None:
        if self._pid != os.getpid():  # a forked child: these are the parent's pins
            self._fds, self._lock, self._pid = OrderedDict(), threading.Lock(), os.getpid()

    def pin(self, path: Path) -> bool:
        """Pin the blob at ``path`` (or mark it most recently pinned). False if it is gone."""
        self._check_pid()
        name = path.name
        with self._lock:
            if name in self._fds:
                self._fds.move_to_end(name)
                return True
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return False
        with contextlib.suppress(OSError):  # no flock here: eviction may race (see module doc)
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        with self._lock:
            if name in self._fds:
                os.close(fd)
                self._fds.move_to_end(name)
                return True
            self._fds[name] = fd
            while len(self._fds) > self.max_pins:
                _, old = self._fds.popitem(last=False)
                os.close(old)
        return True

    def pinned(self) -> set[str]:
        """Hashes of the blobs this process has pinned."""
        self._check_pid()
        with self._lock:
            return set(self._fds)

    def close(self) -> None:
        """Drop every pin of this process."""
        self._check_pid()
        with self._lock:
            for fd in self._fds.values():
                os.close(fd)
            self._fds.clear()


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
            if not shard.is_dir():
                continue
            with contextlib.suppress(FileNotFoundError):
                for entry in os.scandir(shard.path):
                    try:
                        st = entry.stat()
                    except FileNotFoundError:
                        continue
                    out.append((max(st.st_atime, st.st_mtime), st.st_size, Path(entry.path)))
    return out


def _evict_one(path: Path) -> bool:
    """Unlink ``path`` unless a process holds it pinned (where ``flock`` works)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return True  # someone else evicted it
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                return False  # pinned: in use
            # no flock on this filesystem: go ahead, readers survive an unlink (module doc)
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        return True
    finally:
        os.close(fd)


def evict_lru(root: Path, limit: int, keep: Iterable[str] = ()) -> EvictReport:
    """Remove least recently used blobs under ``root`` until they total at most ``limit`` bytes.

    Blobs pinned by any process (and the hashes in ``keep``) stay, even if that leaves the cache
    over the limit: it gets back under once they are released.
    """
    keep = set(keep)
    entries = sorted(_blobs(root))
    total = sum(size for _, size, _ in entries)
    evicted = evicted_bytes = skipped = 0
    for _, size, path in entries:
        if total <= limit:
            break
        if path.name in keep:
            skipped += 1
            continue
        try:
            removed = _evict_one(path)
        except OSError:
            removed = False
        if removed:
            total -= size
            evicted += 1
            evicted_bytes += size
        else:
            skipped += 1
    return EvictReport(evicted, evicted_bytes, total, skipped)


class Evictor:
    """Runs :func:`evict_lru` after fetches, skipping the directory scan while clearly unneeded.

    A scan lists every cached blob; on a big cache over NFS that costs more than a small
    fetch. It is skipped while the last scan's total plus what this process fetched since is
    under half the limit and that scan is under a second old (other processes may be filling
    the cache meanwhile, so the estimate is trusted only briefly).
    """

    def __init__(self, root: Path) -> None:
        self.root = root
        self._estimate: int | None = None
        self._at = 0.0

    def __getstate__(self) -> dict[str, object]:
        return {"root": self.root}

    def __setstate__(self, state: dict[str, object]) -> None:
        self.__init__(state["root"])  # type: ignore[misc,arg-type]

    def after_fetch(self, nbytes: int, limit: int, keep: Iterable[str]) -> EvictReport | None:
        now = time.monotonic()
        if self._estimate is not None:
            self._estimate += nbytes
            if self._estimate < limit // 2 and now - self._at < 1.0:
                return None
        report = evict_lru(self.root, limit, keep)
        self._estimate, self._at = report.total_bytes, time.monotonic()
        return report


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
