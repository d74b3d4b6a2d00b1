"""Putting a file in place whole or not at all: the one way Rayform writes files.

Every file that another process may read while it is written (a cached manifest, a blob in the
server's data root, a slice reference, cached statistics) is written the same way:

1. to a temporary file with a process-unique name, in a directory on the *same filesystem*
   as the destination (a rename across filesystems is a copy, not atomic);
2. flushed and ``fsync``-ed, so that after a crash the name never points at missing bytes;
3. given its final permission bits, then renamed over the destination with ``os.replace``
   (atomic on POSIX filesystems, NFS and Lustre included).

A reader therefore sees either the old file or the complete new one; a process killed at any
instant leaves at most a temporary file, never a partial file under the final name. File locks
are not needed for this (on Lustre and some NFS mounts ``flock`` succeeds for everyone).
"""

from __future__ import annotations

import contextlib
import os
import secrets
from pathlib import Path

__all__ = ["publish", "unique_tmp_name", "write_atomic"]


def unique_tmp_name(stem: str) -> str:
    """A temporary file name no other process or call uses: ``.STEM.PID.RANDOM.tmp``.

    Args:
        stem: what the file will become (its final name), for whoever lists the directory.
    """
    return f".{stem}.{os.getpid()}.{secrets.token_hex(4)}.tmp"


def publish(tmp: str | os.PathLike[str], dest: str | os.PathLike[str], *, mode: int) -> None:
    """Give the complete file ``tmp`` its permission bits ``mode``, then rename it to ``dest``.

    ``tmp`` and ``dest`` must be on the same filesystem. An existing ``dest`` is replaced
    atomically.

    Raises:
        OSError: the chmod or the rename failed (``tmp`` is left for the caller to remove).
    """
    os.chmod(tmp, mode)
    os.replace(tmp, dest)


def write_atomic(
    dest: str | os.PathLike[str],
    data: bytes,
    *,
    mode: int = 0o644,
    tmp_dir: str | os.PathLike[str] | None = None,
    tmp_name: str | None = None,
) -> Path:
    """Write ``data`` to ``dest`` so that readers see the old file or all of ``data``.

    Args:
        dest: the final path; its directory must exist.
        data: the whole content.
        mode: permission bits of the final file, e.g. ``0o444`` for content-addressed files.
        tmp_dir: where the temporary file goes (default: ``dest``'s directory); must be on the
            same filesystem as ``dest``.
        tmp_name: the temporary file's name (default :func:`unique_tmp_name`); it must be
            unique to this process and call, and must not exist.

    Returns:
        ``dest`` as a :class:`~pathlib.Path`.

    Raises:
        OSError: the write, fsync or rename failed; the temporary file is removed and ``dest``
            is untouched.
    """
    dest = Path(dest)
    tmp = Path(tmp_dir if tmp_dir is not None else dest.parent) / (
        tmp_name or unique_tmp_name(dest.name)
    )
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        publish(tmp, dest, mode=mode)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    return dest
