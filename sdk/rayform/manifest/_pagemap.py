"""Manifest pages mapped read-only, whose resident memory a process can give back.

Mapping a page copies nothing, but every 4 KiB page a process touches stays mapped, counted
in its RSS (and, divided among the processes that touched it, in its PSS) until unmapped.
A shuffled epoch over a fleet-sized manifest reads one segment row here and one there, and
the kernel maps at least 64 KiB around each fault (a whole 2 MiB folio where the file system
caches files in large folios, as ext4 and XFS do), so one row's ~25 column buffers can map
most of its 14 MB page, and a few hundred rows most of the manifest, in every DataLoader
worker. The pages are immutable files that
stay in the page cache, so dropping a process's mappings (``MADV_DONTNEED``) loses nothing:
the next access maps the cached page again (a minor fault, about a microsecond).
"""

from __future__ import annotations

import mmap
import os
from pathlib import Path
from typing import Any

from rayform.manifest._arrow import load as pyarrow

__all__ = ["PageMaps"]


class PageMaps:
    """The memory maps of one manifest's pages; :meth:`release` unmaps what was touched."""

    def __init__(self) -> None:
        self._maps: list[mmap.mmap] = []
        self._paths: list[str] = []
        self._bases: list[int] = []  # the address each map starts at
        self._stats: list[os.stat_result] = []  # of each file as it was opened

    def table(self, path: str | Path) -> Any:
        """Map ``path`` (an Arrow IPC file) and return its table, whose buffers point into
        the map (nothing is copied).

        Raises:
            OSError: the file cannot be opened or is empty.
            pyarrow.ArrowInvalid: it is not an Arrow IPC file.
        """
        pa = pyarrow()
        with open(path, "rb") as f:
            st = os.fstat(f.fileno())
            if st.st_size == 0:
                raise OSError(f"{path} is empty")
            mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        self._stats.append(st)
        buf = pa.py_buffer(mm)
        self._maps.append(mm)
        self._paths.append(str(path))
        self._bases.append(buf.address)
        return pa.ipc.open_file(pa.BufferReader(buf)).read_all()

    def file_of(self, page: int) -> tuple[str, int]:
        """``(path, address)``: page ``page``'s file and the address its map starts at, so an
        address inside the map is at file offset ``address - start`` (for ``os.pread``)."""
        return self._paths[page], self._bases[page]

    def stat(self, page: int) -> os.stat_result:
        """The ``fstat`` of page ``page``'s file as it was mapped (the file the map holds,
        even if its path was replaced since)."""
        return self._stats[page]

    def span(self, page: int) -> tuple[int, int]:
        """``(address, size)`` of page ``page``'s map: a buffer of its table outside it was
        not read from the file (a compressed IPC body is decompressed into memory)."""
        return self._bases[page], len(self._maps[page])

    def release(self, page: int | None = None) -> None:
        """Unmap what this process touched of one page (by position), or of every page; the
        data stays valid (it is mapped again from the page cache on the next access)."""
        for mm in self._maps if page is None else self._maps[page : page + 1]:
            mm.madvise(mmap.MADV_DONTNEED)
