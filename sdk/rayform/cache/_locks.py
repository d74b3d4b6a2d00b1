"""Best-effort per-blob locks that only save duplicate downloads.

Correctness never depends on these locks: on Lustre and some NFS mounts ``flock`` silently
"succeeds" for everyone, and a lock holder may die or stall. So the wait is bounded: we poll the
lock, give up as soon as the blob has appeared, and go ahead without the lock once nobody has
made progress on the blob for ``stall_s`` seconds. Locks are always taken with ``with``.

A lock is ``flock`` on ``locks/<hash>.lock``. The file is created with the cache's file mode
(group-writable in a team cache) and, when it belongs to another user who left it unwritable
for us, opened read-only: ``flock`` needs no write access, so such a file still dedupes instead
of silently turning locking off for everyone but its owner.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

__all__ = ["bounded_lock"]

_POLL_S = 0.1


def _open(path: Path, mode: int) -> int:
    """A descriptor on the lock file ``path``, created with ``mode`` if missing."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, mode)
    except PermissionError:
        return os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if st.st_uid == os.geteuid() and st.st_mode & 0o777 != mode:
            os.fchmod(fd, mode)  # ours, made under a umask: give it the cache's bits
    except OSError:
        pass
    return fd


@contextlib.contextmanager
def bounded_lock(
    path: Path,
    *,
    done: Callable[[], bool],
    progress: Callable[[], object],
    stall_s: float = 10.0,
    mode: int = 0o644,
    check: Callable[[], None] | None = None,
) -> Iterator[bool]:
    """Hold the file lock at ``path`` if it can be had in reasonable time.

    Args:
        path: the lock file (created if missing).
        done: returns True when waiting is pointless (the blob is already in the cache).
        progress: returns a value that changes while another process makes progress (e.g. the
            size and mtime of its temporary file); waiting continues while it changes.
        stall_s: give up waiting after this many seconds without progress.
        mode: permission bits of a lock file this call creates.
        check: called at each look while waiting; what it raises ends the wait (the store
            was just found stalled: the holder's download will not finish either).

    Yields:
        True if the lock is held, False if we go ahead without it (done, stalled, or lock
        files cannot be created or locked here).
    """
    try:
        fd = _open(path, mode)
    except OSError:  # read-only cache, or no such directory: go on without a lock
        yield False
        return
    try:
        held = False
        last = progress()
        last_change = time.monotonic()
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                held = True
                break
            except OSError as exc:
                if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    break  # no working flock on this filesystem (ENOLCK...): correctness holds
            if done():
                break
            if check is not None:
                check()
            now = time.monotonic()
            current = progress()
            if current != last:
                last, last_change = current, now
            elif now - last_change > stall_s:
                break
            time.sleep(_POLL_S)
        yield held
    finally:
        os.close(fd)  # releases the flock
