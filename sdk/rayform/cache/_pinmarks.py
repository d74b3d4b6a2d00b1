"""Pins that cross nodes: a marker file per pinned blob, ``pins/<hash>.<host>.<pid>.<token>``.

A pin's shared ``flock`` (:class:`~rayform.cache._evict.Pins`) keeps a blob from being evicted
by a process of the same node only: ``flock`` does not cross the nodes of NFS without lockd,
Lustre without ``-o flock`` or sshfs. A marker needs only what every network filesystem has,
a create, an unlink and a directory listing. An evictor lists ``pins/`` once per pass and
leaves every blob with a live marker:

* a marker of this host is live while its process is (a killed reader's are removed);
* a marker of another host is live while its mtime is under :data:`MARK_STALE_S` old. A
  holder refreshes it (``utime``) when it uses the pin again after :data:`MARK_REFRESH_S`, so a
  blob a process keeps reading stays pinned however long it reads, and a dead node's markers
  stop counting after ten minutes (the bound also covers clocks that differ by minutes).

Markers only keep the cache from evicting what is in use; correctness does not depend on
them (a listing may be cached for seconds, and a marker may be created just after a pass
listed the directory). A reader whose file vanishes anyway fetches it again
(:mod:`rayform.cache._reread`).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import time
from pathlib import Path

from rayform._ids import HASH_RE
from rayform.cache._partial import HOST, pid_alive
from rayform.cache._sharing import CacheModes, shared_mode

__all__ = ["MARK_REFRESH_S", "MARK_STALE_S", "Marks", "marked"]

#: A marker of another host not refreshed for this long (by its mtime) no longer pins.
MARK_STALE_S = 600.0
#: A held marker is refreshed when its pin is used again this long after the last refresh.
MARK_REFRESH_S = 60.0


def _root_of(blob: Path) -> Path:
    return blob.parent.parent.parent  # ROOT/blobs/ab/<hash>


class Marks:
    """The markers of one process's :class:`~rayform.cache._evict.Pins` (safe from several
    threads: each call touches one marker and one dictionary entry)."""

    def __init__(self) -> None:
        self.token = secrets.token_hex(3)  # one per set of pins: each releases its own markers
        self._made: dict[Path, CacheModes] = {}  # pins/ directories this process created
        self.refreshed: dict[str, float] = {}  # marker path -> time.monotonic() of its last touch

    def add(self, blob: Path) -> str | None:
        """Create the marker of ``blob`` for this process; its path, or None if it cannot be made
        (a read-only cache: nothing is evicted there by this process's readers either)."""
        root = _root_of(blob)
        if blob.parent.parent.name != "blobs":
            return None  # not a cache's blob
        pins = root / "pins"
        marker = pins / f"{blob.name}.{HOST}.{os.getpid()}.{self.token}"
        try:
            fd = os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except FileNotFoundError:
            try:
                modes = self._made.get(pins) or CacheModes(root, shared_mode(root, None))
                modes.make_dirs(pins)
                self._made[pins] = modes
                fd = os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)
            except OSError:
                return None
        except OSError:
            return None
        os.close(fd)
        self.refreshed[str(marker)] = time.monotonic()
        return str(marker)

    def used(self, marker: str) -> None:
        """The pin of ``marker`` is used again: refresh its mtime if it is due."""
        now = time.monotonic()
        if now - self.refreshed.get(marker, now) >= MARK_REFRESH_S:
            self.refreshed[marker] = now
            with contextlib.suppress(OSError):
                os.utime(marker)

    def remove(self, marker: str) -> None:
        """Drop the marker (its pin was released)."""
        self.refreshed.pop(marker, None)
        with contextlib.suppress(OSError):
            os.unlink(marker)


def marked(root: Path) -> set[str]:
    """Hashes of the blobs under ``root`` that a live process of any node has pinned.

    Markers of dead processes of this host are removed on the way.
    """
    out: set[str] = set()
    now = time.time()
    try:
        entries = list(os.scandir(root / "pins"))
    except OSError:
        return out
    for entry in entries:
        parts = entry.name.split(".")
        if len(parts) != 4 or not HASH_RE.fullmatch(parts[0]) or not parts[2].isdigit():
            continue
        digest, host, pid = parts[0], parts[1], int(parts[2])
        if host == HOST:
            if pid == os.getpid() or pid_alive(pid):
                out.add(digest)
            else:
                with contextlib.suppress(OSError):
                    os.unlink(entry.path)
            continue
        try:
            fresh = now - entry.stat().st_mtime < MARK_STALE_S
        except OSError:
            continue
        if fresh:
            out.add(digest)
    return out
