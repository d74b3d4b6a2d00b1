"""Best-effort per-blob locks that only save duplicate downloads.

Correctness never depends on these locks: on Lustre and some NFS mounts ``flock`` silently
"succeeds" for everyone, and a lock holder may die or stall. So the wait is bounded: we poll the
lock, give up as soon as the blob has appeared, and go ahead without the lock once nobody has
made progress on the blob for ``stall_s`` seconds. Locks are always taken with ``with``.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from filelock import FileLock, Timeout

__all__ = ["bounded_lock"]

_POLL_S = 0.1


@contextlib.contextmanager
def bounded_lock(
    path: Path,
    *,
    done: Callable[[], bool],
    progress: Callable[[], object],
    stall_s: float = 10.0,
) -> Iterator[bool]:
    """Hold the file lock at ``path`` if it can be had in reasonable time.

    Args:
        path: the lock file (created if missing).
        done: returns True when waiting is pointless (the blob is already in the cache).
        progress: returns a value that changes while another process makes progress (e.g. the
            size and mtime of its temporary file); waiting continues while it changes.
        stall_s: give up waiting after this many seconds without progress.

    Yields:
        True if the lock is held, False if we go ahead without it (done, stalled, or lock
        files cannot be created).
    """
    with contextlib.ExitStack() as stack:
        held = False
        last = progress()
        last_change = time.monotonic()
        while True:
            try:
                stack.enter_context(FileLock(str(path), timeout=_POLL_S))
                held = True
                break
            except Timeout:
                pass
            except (OSError, NotImplementedError, Warning):
                # Read-only, or no working locks here (filelock may warn, and under
                # ``-W error`` raise, when it falls back to soft locks): go on without one.
                break
            if done():
                break
            now = time.monotonic()
            current = progress()
            if current != last:
                last, last_change = current, now
            elif now - last_change > stall_s:
                break
        yield held
