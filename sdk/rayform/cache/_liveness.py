"""The one liveness rule for every file another process or node leaves in the cache.

Claims (``claims/``), ledger records (``live/ledger``, which the markers in ``pins/`` name),
partial downloads and other temporary files (``tmp/``): each may be left by a process that
died, on this host or on another node, and each must be told from the file of a writer that
is still at work. One rule decides for all of them (:func:`alive`):

* **A writer of this host** whose PID is gone is dead at once (:func:`pid_alive`; the host
  includes the PID namespace, :data:`HOST`).
* **Otherwise a writer is alive while its heartbeat changes.** The heartbeat is what the
  writer rewrites inside its file (a claim's and a ledger record's beat counter, a partial
  file's bytes). The reader compares what it reads now with what it read before and measures,
  on its *own* monotonic clock, how long it has stayed the same; unchanged for ``stale_s``
  (per kind of file: :data:`~rayform.cache._live.STALE_S` for a ledger record, the claim's
  stale time, the cache's ``stale_s`` for a partial), the writer is dead. A file seen for the
  first time has been unchanged for zero seconds.

**Clock skew between nodes does nothing.** No writer's time stamp and no ``st_mtime`` is
compared with the reader's clock: both are only compared for change, and every duration is
the difference of two readings of the reader's clock. A node hours ahead or behind (or a file
whose ``mtime`` was set to the far past or future) is judged as a node in step would be.

What watching costs is time: a reader needs ``stale_s`` of watching before it may call a
remote writer dead. So that a one-off command (``rayform cache verify``, ``prune``, the end
of a pull) does not start from nothing, what this host's processes saw is kept in
``live/seen.<host>``: per file, a digest of the heartbeat and the reading of the host's
boot-time clock (``CLOCK_BOOTTIME``, one clock for every process of a boot) since when it
has been unchanged. A later process of the same boot starts from there; after a reboot the
file is ignored. A lost or stale memory only makes a reader wait longer, never call a live
writer dead: equal heartbeats at two readings mean no beat in between, as a beat counter or
a growing file never goes back.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
import socket
import threading
import time
from collections.abc import Iterable
from pathlib import Path

from rayform._process import PerProcess
from rayform.cache._sharing import CacheModes, shared_mode
from rayform.files import write_atomic

__all__ = ["HOST", "Observer", "alive", "observer", "pid_alive", "unchanged_s"]


def _host() -> str:
    """The host name, plus the PID namespace where it can be read: containers that share
    the host's name (``--network host`` pods) have their own PIDs, so a PID of another such
    container, missing from ours, would pass for a dead process of this host."""
    name = socket.gethostname().replace(".", "_").replace("/", "_") or "host"
    try:
        return f"{name}-pid{os.stat('/proc/self/ns/pid').st_ino:x}"
    except OSError:
        return name


#: This host (and PID namespace), as it appears in temporary, claim and ledger records.
HOST = _host()


def pid_alive(pid: int) -> bool:
    """True if process ``pid`` of this host exists (perhaps another user's)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _boot() -> str | None:
    """This boot's id: readings of the boot-time clock compare only within one boot."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip() or None
    except OSError:
        return None


_BOOT = _boot()
_CLOCK = getattr(time, "CLOCK_BOOTTIME", None)


def _now() -> float:
    """Seconds on this host's boot-time clock (monotonic, the same in every process)."""
    return time.clock_gettime(_CLOCK) if _CLOCK is not None else time.monotonic()


def _digest(beat: object) -> str:
    raw = beat if isinstance(beat, bytes) else repr(beat).encode()
    return hashlib.blake2b(raw, digest_size=8).hexdigest()


class Observer:
    """What this process saw of other writers' heartbeats, per cache, on its own clock.

    Safe from several threads. Keys are paths under the cache root (``claims/<name>``,
    ``tmp/<name>``, ``live/ledger#<slot>``).
    """

    def __init__(self) -> None:
        self._seen: dict[Path, dict[str, tuple[str, float]]] = {}
        self._lock = threading.Lock()

    def unchanged_s(self, root: Path, key: str, beat: object) -> float:
        """Seconds (this host's clock) for which ``key`` under ``root`` has shown ``beat``."""
        digest, now = _digest(beat), _now()
        with self._lock:
            seen = self._of(root)
            found = seen.get(key)
            if found is None or found[0] != digest:
                seen[key] = (digest, now)
                return 0.0
            return max(0.0, now - found[1])

    def forget(self, root: Path, key: str) -> None:
        """Drop what was seen of ``key`` (its file is gone)."""
        with self._lock:
            self._of(root).pop(key, None)

    def save(self, root: Path, keys: Iterable[str]) -> None:
        """Keep what was seen of ``keys`` (the files that exist) in ``live/seen.<host>`` for
        the next process of this host, merged with what others saved. Best effort."""
        if _BOOT is None or _CLOCK is None:
            return
        wanted = set(keys)
        saved = _load(root)
        with self._lock:
            seen = self._of(root)
            out = {}
            for key in wanted:
                mine, theirs = seen.get(key), saved.get(key)
                if mine is not None and theirs is not None and mine[0] == theirs[0]:
                    mine = (mine[0], min(mine[1], theirs[1]))  # the same beat, seen earlier
                if mine is not None:
                    out[key] = [mine[0], round(mine[1], 3)]
        doc = json.dumps({"boot": _BOOT, "seen": out}, sort_keys=True).encode()
        modes = CacheModes(root, shared_mode(root, None))
        # A temporary name of this host's process in tmp/: its leftovers are cleaned as any.
        name = f"{_digest(b'seen')}{'0' * 48}.{HOST}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
        with contextlib.suppress(OSError):
            modes.make_dirs(root / "live")
            modes.make_dirs(root / "tmp")
            write_atomic(
                root / "live" / f"seen.{HOST}",
                doc,
                mode=modes.file_mode,
                tmp_dir=root / "tmp",
                tmp_name=name,
            )

    def _of(self, root: Path) -> dict[str, tuple[str, float]]:
        """The observations of ``root`` (``_lock`` held), started from the host's memory."""
        seen = self._seen.get(root)
        if seen is None:
            seen = self._seen[root] = _load(root)
        return seen


def _load(root: Path) -> dict[str, tuple[str, float]]:
    """What this host's processes saved for ``root`` during this boot (empty if nothing)."""
    if _BOOT is None:
        return {}
    try:
        doc = json.loads((root / "live" / f"seen.{HOST}").read_bytes())
        if doc.get("boot") != _BOOT:
            return {}
        now = _now()
        # A reading from the future of this boot's clock is not one of ours: ignore it.
        return {
            str(k): (str(v[0]), float(v[1])) for k, v in doc["seen"].items() if float(v[1]) <= now
        }
    except (OSError, ValueError, KeyError, TypeError, AttributeError, IndexError):
        return {}


_OBSERVER: PerProcess[Observer] = PerProcess(Observer)


def observer() -> Observer:
    """This process's observer (a forked child starts its own, from the host's memory)."""
    return _OBSERVER.get()


def unchanged_s(root: Path, key: str, beat: object) -> float:
    """Seconds this process (or, before it, this host) has seen ``beat`` unchanged at ``key``."""
    return observer().unchanged_s(root, key, beat)


def alive(
    root: Path,
    key: str,
    beat: object,
    stale_s: float,
    *,
    pid: int | None = None,
    idle: bool = False,
    by: Observer | None = None,
) -> bool:
    """The one rule (module doc): whether the writer of the file ``key`` under ``root``,
    whose heartbeat now reads ``beat``, is alive.

    Args:
        root: the cache root.
        key: the file's path under ``root`` (plus a record's slot).
        beat: what the writer rewrites in the file (compared for change only).
        stale_s: seconds unchanged, on this host's clock, after which the writer is dead.
        pid: the writer's PID if it is a process of this host (None: another host).
        idle: the writer may rest without beating while alive (a ledger record of a process
            that pins nothing): for one of this host, its PID alone decides.
        by: whose observations (default: this process's :func:`observer`).
    """
    if pid is not None and pid != os.getpid():
        if not pid_alive(pid):
            return False
        if idle:
            return True
    elif pid is not None and idle:
        return True
    return (by or observer()).unchanged_s(root, key, beat) < stale_s
