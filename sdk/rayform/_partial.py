"""Partial downloads: process-unique temporary files, their owners, adoption after a crash.

A temporary blob file is named ``tmp/<hash>.<host>.<pid>.<random>.part``. Its owner is the
process ``pid`` on ``host``. A file whose owner is dead (same host, pid not alive), or that has
not been touched for ``stale_s`` seconds (any host), may be *adopted* by another puller: it is
atomically renamed to the adopter's own temporary name (only one adopter can win the rename),
its prefix is re-hashed, and the download continues from its end with an HTTP ``Range``.
"""

from __future__ import annotations

import os
import secrets
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from rayform._hashing import new_hasher
from rayform._process import PerProcess
from rayform.errors import IntegrityError

__all__ = ["PartialBlob", "active", "TmpName", "owner_dead", "parse_tmp_name", "tmp_name"]

_HOST = socket.gethostname().replace(".", "_").replace("/", "_") or "host"
_CHUNK = 1 << 20

#: Names of the temporary files this process is writing right now (any thread, any Cache).
#: A forked child writes none of its parent's files: it starts with an empty set.
_ACTIVE: PerProcess[set[str]] = PerProcess(set)


def active() -> set[str]:
    """This process's set of temporary files being written (empty in a new process)."""
    return _ACTIVE.get()


@dataclass(frozen=True)
class TmpName:
    """The parts of a temporary file name."""

    hash: str
    host: str
    pid: int


def tmp_name(digest: str, suffix: str = "part") -> str:
    """A new unique temporary file name for blob ``digest`` owned by this process.

    ``suffix`` is ``"part"`` for blob downloads (adoptable) and ``"tmp"`` for small objects.
    """
    return f"{digest}.{_HOST}.{os.getpid()}.{secrets.token_hex(4)}.{suffix}"


def parse_tmp_name(name: str) -> TmpName | None:
    """Parse a temporary file name, or None if it is not one of ours."""
    parts = name.split(".")
    if len(parts) != 5 or parts[4] not in ("part", "tmp") or not parts[2].isdigit():
        return None
    return TmpName(hash=parts[0], host=parts[1], pid=int(parts[2]))


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def owner_dead(path: Path, stale_s: float) -> bool:
    """True if nobody can still be writing the temporary file ``path``.

    Args:
        path: a temporary file under ``tmp/``.
        stale_s: a file untouched for this many seconds is abandoned whoever owns it.
    """
    info = parse_tmp_name(path.name)
    try:
        age = time.time() - path.stat().st_mtime
    except FileNotFoundError:
        return False
    if age > stale_s:
        return True
    if info is None or info.host != _HOST:
        return False
    if info.pid == os.getpid():
        return path.name not in active()
    return not _pid_alive(info.pid)


class PartialBlob:
    """A temporary file being filled with one blob's bytes, hashed while written.

    The transport writes with :meth:`write` starting at :attr:`offset` (resume with
    ``Range: bytes=offset-``) and calls :meth:`restart` if the server ignores the range: it is
    a :class:`~rayform._seams.DownloadSink`.
    """

    def __init__(self, path: Path, expected_hash: str, expected_size: int, mode: int) -> None:
        self.path = path
        self.expected_hash = expected_hash
        self.expected_size = expected_size
        self.hasher = new_hasher()
        self.offset = 0
        self.adopted_bytes = 0
        if path.exists():  # adopted from a dead writer: its bits were set when it was made
            self._f: BinaryIO = path.open("r+b")
            self._rehash_prefix()
        else:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
            self._f = os.fdopen(fd, "wb")
            os.fchmod(fd, mode)  # the umask applied at creation; the file is ours

    def _rehash_prefix(self) -> None:
        self._f.seek(0)
        while chunk := self._f.read(_CHUNK):
            self.hasher.update(chunk)
            self.offset += len(chunk)
        if self.offset > self.expected_size:
            self.restart()
        self.adopted_bytes = self.offset

    @property
    def remaining(self) -> int:
        """Bytes still missing."""
        return self.expected_size - self.offset

    def write(self, chunk: bytes) -> None:
        """Append ``chunk`` at :attr:`offset` and hash it."""
        if self.offset + len(chunk) > self.expected_size:
            raise IntegrityError(
                f"blob {self.expected_hash[:12]}... is longer than the {self.expected_size} bytes "
                "its manifest declares: the server sent bad data. Retry later or report it."
            )
        self._f.write(chunk)
        self.hasher.update(chunk)
        self.offset += len(chunk)

    def restart(self) -> None:
        """Forget everything written so far (the server ignored our ``Range``)."""
        self._f.seek(0)
        self._f.truncate()
        self.hasher = new_hasher()
        self.offset = 0

    def finish(self) -> str:
        """Flush and fsync the file, close it, and return the BLAKE3 hex digest."""
        self._f.flush()
        os.fsync(self._f.fileno())
        self._f.close()
        return self.hasher.hexdigest()

    def close(self) -> None:
        """Close without fsync (on error paths)."""
        if not self._f.closed:
            try:
                self._f.close()
            except OSError:
                pass
