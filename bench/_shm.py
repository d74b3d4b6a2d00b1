"""Huge pages for ``/dev/shm``: the lever for DataLoader worker transfer (opt-in, needs root).

Every batch a DataLoader worker collates is written into a new shared-memory file in
``/dev/shm`` (tmpfs), which the kernel allocates, zeroes and later frees page by page: with
4 KiB pages that is about 1.2 ms of system time per 1.8 MB sample on the development VM. A
tmpfs mounted with ``huge=within_size`` backs files of 2 MiB and more with 2 MiB pages
instead. This module switches that mount option for the duration of a ``with`` block and
puts the previous value back, for ``bench/run_all.py --hugepage-shm``.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

__all__ = ["hugepage_shm", "shm_huge_option"]

SHM = "/dev/shm"


def shm_huge_option() -> str:
    """The ``huge=`` option of the ``/dev/shm`` mount (``"never"`` when absent)."""
    for line in Path("/proc/mounts").read_text().splitlines():
        fields = line.split()
        if len(fields) > 3 and fields[1] == SHM:
            for opt in fields[3].split(","):
                if opt.startswith("huge="):
                    return opt.split("=", 1)[1]
            return "never"
    raise RuntimeError(f"{SHM} is not a mount point here")


def _remount(value: str) -> None:
    subprocess.run(
        ["mount", "-o", f"remount,huge={value}", SHM], check=True, capture_output=True, text=True
    )


@contextlib.contextmanager
def hugepage_shm() -> Iterator[str]:
    """Remount ``/dev/shm`` with ``huge=within_size`` inside the block; yields the old value.

    Raises:
        PermissionError: not root (remounting needs ``CAP_SYS_ADMIN``).
        subprocess.CalledProcessError: the kernel refused (e.g. no shmem THP support).
    """
    if os.geteuid() != 0:
        raise PermissionError("--hugepage-shm remounts /dev/shm and needs root")
    old = shm_huge_option()
    _remount("within_size")
    try:
        yield old
    finally:
        _remount(old)
