"""Partial downloads: process-unique temporary files, their owners, adoption after a crash.

A temporary blob file is named ``tmp/<hash>.<host>.<pid>.<random>.part``. Its owner is the
process ``pid`` on ``host``. A file whose owner is dead by the cache's one liveness rule
(:mod:`rayform.cache._liveness`: same host and pid not alive, or its size unchanged for
``stale_s`` seconds on the reader's clock), or whose writer's download claim went stale (see
:mod:`rayform.cache._claims`), may be *adopted* by another puller, which continues the
download from its end with an HTTP ``Range``:

* our own user's file of a provably dead process of this host is atomically renamed to the
  adopter's own temporary name (only one adopter can win the rename) and its prefix re-hashed;
* any other (another host's, whose writer might only be frozen and write again; another
  user's, which we could not make read-only) is *copied*: its prefix is read, hashed and
  written into the adopter's own new file, so a writer that wakes up never touches ours.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from rayform._hashing import new_hasher
from rayform._process import PerProcess
from rayform.cache._liveness import HOST, alive
from rayform.errors import IntegrityError

__all__ = [
    "HOST",
    "PartialBlob",
    "active",
    "TmpName",
    "drop_dead_partials",
    "open_partial",
    "owner_dead",
    "parse_tmp_name",
    "partial_named",
    "tmp_name",
]


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
    return f"{digest}.{HOST}.{os.getpid()}.{secrets.token_hex(4)}.{suffix}"


def parse_tmp_name(name: str) -> TmpName | None:
    """Parse a temporary file name, or None if it is not one of ours."""
    parts = name.split(".")
    if len(parts) != 5 or parts[4] not in ("part", "tmp") or not parts[2].isdigit():
        return None
    return TmpName(hash=parts[0], host=parts[1], pid=int(parts[2]))


def owner_dead(path: Path, stale_s: float) -> bool:
    """True if nobody can still be writing the temporary file ``path``, by the one liveness
    rule (:mod:`rayform.cache._liveness`): its writer of this host is gone, or the file's size
    and modification time (compared for change only, never with a clock) have stayed the same
    for ``stale_s`` seconds on this host's clock.

    Args:
        path: a file under ``tmp/`` (a partial download, a small object's temporary file, or
            any other file left there).
        stale_s: seconds unchanged after which a file is abandoned, whoever wrote it.
    """
    info = parse_tmp_name(path.name)
    try:
        st = path.stat()
    except FileNotFoundError:
        return False
    here = info is not None and info.host == HOST
    if here and info is not None and info.pid == os.getpid():
        return path.name not in active()  # this process knows what it is writing
    return not alive(
        path.parent.parent,
        f"tmp/{path.name}",
        (st.st_size, st.st_mtime_ns),
        stale_s,
        pid=info.pid if here and info is not None else None,
    )


def partial_named(tmp: Path, digest: str, name: str | None) -> Path | None:
    """``tmp/name`` if ``name`` (read from a claim file, which others may write) is a plain
    partial file name of blob ``digest``, else None."""
    info = parse_tmp_name(name) if name and "/" not in name else None
    return tmp / name if name and info is not None and info.hash == digest else None


def open_partial(
    tmp: Path,
    digest: str,
    size: int,
    mode: int,
    *,
    adopt: bool,
    stale_s: float,
    taken_from: str | None = None,
) -> tuple[PartialBlob, Path | None]:
    """A new temporary file of this process for blob ``digest``, adopting a dead writer's bytes.

    Args:
        tmp: the cache's ``tmp/`` directory.
        digest: the blob's hash.
        size: the blob's size in bytes.
        mode: permission bits of the new file.
        adopt: look for a partial file of a dead writer to continue.
        stale_s: a partial file untouched this long is abandoned whoever wrote it.
        taken_from: the file name (in ``tmp``) of the partial of a writer whose claim on the
            blob went stale: it is adopted (copied) at once. Opened by name, not found by
            listing ``tmp``: another node's listing may be cached for seconds.

    Returns:
        The partial blob, and the path of the file it copied from (remove it once the blob is
        complete), if any.

    Raises:
        OSError: the file cannot be created.
    """
    mine = tmp / tmp_name(digest)
    active().add(mine.name)  # before the file exists: nobody may adopt it
    try:
        source = None
        theirs = partial_named(tmp, digest, taken_from) if adopt else None
        if theirs is not None and theirs.is_file():
            return PartialBlob(mine, digest, size, mode, copy_from=theirs), theirs
        for cand in sorted(tmp.glob(f"{digest}.*.part")) if adopt else ():
            info = parse_tmp_name(cand.name)
            if info is None:
                continue
            if not owner_dead(cand, stale_s):
                continue
            if info.host == HOST and _owned(cand):
                try:
                    os.rename(cand, mine)  # atomic: only one adopter wins
                except FileNotFoundError:
                    continue
                break
            source = cand
            break
        return PartialBlob(mine, digest, size, mode, copy_from=source), source
    except OSError:
        active().discard(mine.name)
        raise


def drop_dead_partials(tmp: Path, digest: str, stale_s: float, copied: Path | None) -> None:
    """Remove partial downloads of blob ``digest``, now complete, whose writers are gone.

    Several processes killed while fetching the same blob (e.g. DataLoader workers torn down
    together) leave one partial each; adoption takes only one of them. ``copied`` is a file
    adopted by copying, or known by name from a stale claim: its writer is taken for dead.
    """
    for cand in tmp.glob(f"{digest}.*.part"):
        if cand == copied or owner_dead(cand, stale_s):
            with contextlib.suppress(OSError):
                os.unlink(cand)
    if copied is not None:  # another node's listing of tmp/ may be seconds old
        with contextlib.suppress(OSError):
            os.unlink(copied)


def _owned(p: Path) -> bool:
    try:
        return p.stat().st_uid == os.geteuid()
    except OSError:
        return False


class PartialBlob:
    """A temporary file being filled with one blob's bytes, hashed while written.

    The transport writes with :meth:`write` starting at :attr:`offset` (resume with
    ``Range: bytes=offset-``) and calls :meth:`restart` if the server ignores the range: it is
    a :class:`~rayform._seams.DownloadSink`.
    """

    def __init__(
        self,
        path: Path,
        expected_hash: str,
        expected_size: int,
        mode: int,
        copy_from: Path | None = None,
    ) -> None:
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
            if copy_from is not None:
                self._copy_prefix(copy_from)

    def _copy_prefix(self, source: Path) -> None:
        """Adopt the bytes of another writer's partial file by copying them into ours."""
        try:
            f = source.open("rb")
        except OSError:
            return  # gone meanwhile (its writer finished, or another adopter cleaned it)
        with f:
            while self.offset < self.expected_size:
                chunk = f.read(min(_CHUNK, self.expected_size - self.offset))
                if not chunk:
                    break
                self._f.write(chunk)
                self.hasher.update(chunk)
                self.offset += len(chunk)
        self.adopted_bytes = self.offset

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
