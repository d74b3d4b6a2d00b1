"""Pins that cross nodes: a marker per pinned blob, ``pins/<hash>.<host>.<pid>.<lease>-<mark>``.

A pin's shared ``flock`` (:class:`~rayform.cache._evict.Pins`) keeps a blob from being evicted
by a process of the same node only: ``flock`` does not cross the nodes of NFS without lockd,
Lustre without ``-o flock`` or sshfs. A marker needs only what every network filesystem has,
a create, an unlink and a directory listing. An evictor lists ``pins/`` once per pass and
leaves every blob with a live marker.

A marker is live while the process that made it is, by the one liveness rule of the cache's
ledger (:mod:`rayform.cache._live`): the marker's token names the process's record there,
which beats while it pins anything. So a blob a process keeps reading stays pinned however
long it reads, and the pins of a killed reader, or of a dead node, stop counting within
seconds (:data:`~rayform.cache._live.STALE_S`), and whoever sees them dead removes them. A
marker whose record cannot be found (made without a ledger, or just now) counts for
:data:`~rayform.cache._live.STALE_S` after this process first saw it.

Markers only keep the cache from evicting what is in use; correctness does not depend on
them (a listing may be cached for seconds, and a marker may be created just after a pass
listed the directory). A reader whose file vanishes anyway fetches it again
(:mod:`rayform.cache._reread`).
"""

from __future__ import annotations

import contextlib
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

from rayform._ids import HASH_RE
from rayform.cache._live import STALE_S, Record, lease, liveness, read_ledger
from rayform.cache._liveness import HOST, pid_alive
from rayform.cache._liveness import alive as writer_alive
from rayform.cache._sharing import CacheModes, shared_mode

__all__ = ["Marks", "Pinned", "marked", "pinned"]


def _root_of(blob: Path) -> Path:
    return blob.parent.parent.parent  # ROOT/blobs/ab/<hash>


class Marks:
    """The markers of one process's :class:`~rayform.cache._evict.Pins` (safe from several
    threads: each call touches one marker and one dictionary entry)."""

    def __init__(self) -> None:
        self.token = secrets.token_hex(3)  # one per set of pins: each releases its own markers
        self._made: dict[Path, CacheModes] = {}  # pins/ directories this process created
        self._sizes: dict[str, tuple[Path, int]] = {}  # marker -> (cache root, blob bytes)

    def add(self, blob: Path, size: int) -> str | None:
        """Create the marker of ``blob`` (``size`` bytes) for this process; its path, or None if
        it cannot be made (a read-only cache: nothing is evicted there by this process's
        readers either)."""
        root = _root_of(blob)
        if blob.parent.parent.name != "blobs":
            return None  # not a cache's blob
        held = lease(root)
        held.pinned(size)  # the heartbeat first: the marker names a record that beats
        pins = root / "pins"
        marker = pins / f"{blob.name}.{HOST}.{os.getpid()}.{held.token}-{self.token}"
        try:
            fd = os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except FileNotFoundError:
            try:
                modes = self._made.get(pins) or CacheModes(root, shared_mode(root, None))
                modes.make_dirs(pins)
                self._made[pins] = modes
                fd = os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)
            except OSError:
                held.pinned(-size)
                return None
        except OSError:
            held.pinned(-size)
            return None
        os.close(fd)
        self._sizes[str(marker)] = (root, size)
        return str(marker)

    def remove(self, marker: str) -> None:
        """Drop the marker (its pin was released)."""
        found = self._sizes.pop(marker, None)
        with contextlib.suppress(OSError):
            os.unlink(marker)
        if found is not None:
            lease(found[0]).pinned(-found[1])


@dataclass(frozen=True)
class Pinned:
    """What the live readers of a cache pin (:func:`pinned`)."""

    hashes: set[str]  # blobs pinned by a live process of any node
    readers: int  # live processes that pin at least one blob
    pinned_bytes: int  # bytes those processes pin, by their ledger records
    processes: int  # live processes in the ledger (pinning or not)


def pinned(root: Path, records: list[Record] | None = None) -> Pinned:
    """What a live process of any node pins under ``root``; markers of dead processes (by
    the ledger's rule) are removed on the way. ``records``: the ledger, if just read."""
    if records is None:
        records = read_ledger(root)
    watch = liveness()
    alive = {r.token: watch.alive(r) for r in records}
    live = [r for r in records if alive[r.token]]
    out: set[str] = set()
    tokens: set[str] = set()
    try:
        entries = list(os.scandir(root / "pins"))
    except OSError:
        entries = []
    for entry in entries:
        parts = entry.name.split(".")
        if len(parts) != 4 or not HASH_RE.fullmatch(parts[0]) or not parts[2].isdigit():
            continue
        digest, host, pid, token = parts[0], parts[1], int(parts[2]), parts[3].split("-")[0]
        if host == HOST and pid != os.getpid() and not pid_alive(pid):
            live_marker = False
        elif token in alive:
            live_marker = alive[token]
        else:  # no record (yet): a marker without a heartbeat, judged by the same rule
            live_marker = writer_alive(root, f"pins/{entry.name}", b"", STALE_S)
        if live_marker:
            out.add(digest)
            tokens.add(token)
        else:
            with contextlib.suppress(OSError):
                os.unlink(entry.path)
    return Pinned(
        out,
        len(tokens),
        sum(r.pinned for r in live if r.token in tokens),
        len(live),
    )


def marked(root: Path, records: list[Record] | None = None) -> set[str]:
    """Hashes of the blobs under ``root`` that a live process of any node has pinned."""
    return pinned(root, records).hashes
