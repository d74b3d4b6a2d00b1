"""Reading a cached blob that another process or node may remove meanwhile.

Pins (:mod:`rayform.cache._evict`, :mod:`rayform.cache._pinmarks`) keep what is being read from
being evicted, but nothing guarantees it across nodes: a pin may be made just after another
node's eviction listed the pins, a ``rayform cache prune`` or a teammate's ``rm`` may remove a
blob, and a file opened on one NFS client and unlinked by another fails its next read
(``ESTALE``). A network filesystem also answers ``stat`` from a cache (sshfs keeps attributes
20 s), so "the file is there" may be false for seconds while an ``open`` fails.

:func:`read_blob` makes such a loss a fetch, never an error: when a read of a cached blob
fails, it checks the blob itself, by opening and re-hashing the file at its path (an ``open``
goes to the server, unlike a ``stat``). If those bytes are not the blob (gone, or replaced by
something else, which is then removed), the loss was the cache's: a warning on the ``rayform.cache`` logger says so,
the blob is fetched again and read again. Only a read that fails twice on bytes that hash
right raises its error: then the data itself is bad.

The hashes found gone are remembered in this process (:func:`vanished`), so the cache's next
lookup of them opens the file instead of trusting a cached ``stat``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from rayform._hashing import hash_file
from rayform._process import PerProcess
from rayform.errors import CacheError

__all__ = ["blob_opens", "read_blob", "vanished"]

log = logging.getLogger("rayform.cache")

T = TypeVar("T")

#: Reads of one blob tried while it keeps vanishing (each after a fresh fetch).
_TRIES = 5


class _Vanished:
    def __init__(self) -> None:
        self.hashes: set[str] = set()
        self.lock = threading.Lock()


_VANISHED: PerProcess[_Vanished] = PerProcess(_Vanished)


def vanished(digest: str, *, forget: bool = False) -> bool:
    """True if a read in this process found blob ``digest`` gone since it last opened it
    (``forget``: and clear that, as the blob was found again)."""
    v = _VANISHED.get()
    with v.lock:
        if forget:
            if digest not in v.hashes:
                return False
            v.hashes.discard(digest)
            return True
        return digest in v.hashes


def _mark_vanished(digest: str) -> None:
    v = _VANISHED.get()
    with v.lock:
        v.hashes.add(digest)


def blob_opens(path: Path) -> bool:
    """True if ``path`` opens now as a regular file: asked of the server, not of a cached stat."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return False
    os.close(fd)
    return True


def _intact(path: Path, digest: str) -> bool | None:
    """True if the file at ``path`` hashes to ``digest``, False if it holds other bytes, None
    if it cannot be read (gone)."""
    try:
        return hash_file(path) == digest
    except OSError:
        return None


def read_blob(
    read: Callable[[Path], T],
    path: Path,
    digest: str,
    *,
    refetch: Callable[[], Path] | None,
    what: str,
    reset: Callable[[], None] | None = None,
) -> T:
    """``read(path)``, surviving the loss of the cached blob ``digest`` while it is read.

    Args:
        read: reads the blob at the path it is given (opens it, decodes it...).
        path: where the blob is cached.
        digest: its BLAKE3 hex digest.
        refetch: the blob's path after fetching it again if missing (``None``: one read, as is).
        what: the blob as the warning names it, e.g. ``"video blob 1a2b... of stream cam0/rgb"``.
        reset: drops what ``read`` keeps of the file (an open decoder), before a read again.

    Returns:
        What ``read`` returned.

    Raises:
        CacheError: the blob vanished at each of the tries.
        Exception: what ``read`` raised twice on bytes that hash right (the data's fault),
            or what ``refetch`` raised (offline, say).
    """
    if refetch is None:
        return read(path)
    intact_failures = 0
    for _ in range(_TRIES):
        try:
            return read(path)
        except Exception:
            if reset is not None:
                reset()
            intact = _intact(path, digest)
            if intact:
                intact_failures += 1
                if intact_failures == 2:
                    raise
                continue  # an open handle of a removed file (NFS ESTALE): read it anew
            _mark_vanished(digest)
            if intact is False:  # other bytes under the blob's name: never data, drop them
                with contextlib.suppress(OSError):
                    os.unlink(path)
            log.warning(
                "%s vanished or changed while being read (evicted or pruned by another process "
                "or node); fetching it again",
                what,
            )
            path = refetch()
    raise CacheError(
        f"{what} vanished {_TRIES} times while being read, each time just after it was fetched: "
        f"something keeps removing it from the cache {path.parent.parent.parent} (a cache limit "
        "far too small for the jobs sharing it, or a job deleting cache files)"
    )
