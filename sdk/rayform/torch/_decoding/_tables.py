"""A bounded, per-process cache of loaded table, text and timestamps blobs.

Table blobs (``t_ns int64 (N,)`` + ``values (N, D)``), text blobs (timed records) and video
timestamps blobs (``int64 (N,)``) are small next to video, so they are read whole with one ``read_bytes`` (no
file handle stays open) and kept in memory, least recently used first out, up to
``max_bytes``. One cache serves one process: its owner holds it in a
:class:`~rayform._process.PerProcess`, so a forked DataLoader worker starts with an empty one.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import numpy as np

from rayform._blobfmt import decode_table, decode_timestamps
from rayform._textfmt import decode_text
from rayform.cache import read_blob

__all__ = ["TableCache"]

T = TypeVar("T")


class TableCache:
    """LRU of decoded blobs keyed by content hash, bounded by total bytes held."""

    def __init__(
        self, max_bytes: int = 512 << 20, refetch: Callable[[str], Path] | None = None
    ) -> None:
        self.max_bytes = max_bytes
        self._refetch = refetch
        self._items: OrderedDict[str, tuple[np.ndarray, np.ndarray | None]] = OrderedDict()
        self._bytes = 0

    def _get(self, key: str) -> tuple[np.ndarray, np.ndarray | None] | None:
        item = self._items.get(key)
        if item is not None:
            self._items.move_to_end(key)
        return item

    def _put(self, key: str, item: tuple[np.ndarray, np.ndarray | None]) -> None:
        size = sum(a.nbytes for a in item if a is not None)
        self._items[key] = item
        self._bytes += size
        while self._bytes > self.max_bytes and len(self._items) > 1:
            _, old = self._items.popitem(last=False)
            self._bytes -= sum(a.nbytes for a in old if a is not None)

    def table(self, key: str, path: Path) -> tuple[np.ndarray, np.ndarray]:
        """``(t_ns int64 (N,), values (N, D))`` of the table blob at ``path``."""
        item = self._get(key)
        if item is None:
            item = self._load(key, path, "table", decode_table)
            self._put(key, item)
        t_ns, values = item
        assert values is not None
        return t_ns, values

    def text(self, key: str, path: Path) -> tuple[np.ndarray, np.ndarray]:
        """``(dt_ns int64 (N,), records object (N,))`` of the text blob at ``path``: times in
        ns after the stream's first record (one blob serves every episode holding the same
        records, each from its own ``t0_ns``), and the records as dicts."""
        item = self._get(key)
        if item is None:

            def decode(data: bytes, what: str) -> tuple[np.ndarray, np.ndarray]:
                t_ns, records = decode_text(data, 0, what=what)
                column = np.empty(len(records), dtype=object)
                column[:] = records
                return t_ns, column

            item = self._load(key, path, "text", decode)
            self._put(key, item)
        t_ns, records = item
        assert records is not None
        return t_ns, records

    def timestamps(self, key: str, path: Path) -> np.ndarray:
        """Per-frame times, ns, ``int64 (N,)``, of the timestamps blob at ``path``."""
        item = self._get(key)
        if item is None:
            item = (self._load(key, path, "timestamps", decode_timestamps), None)
            self._put(key, item)
        return item[0]

    def _load(self, key: str, path: Path, kind: str, decode: Callable[..., T]) -> T:
        """Decode the blob at ``path``, fetched again if it vanishes meanwhile (``refetch``)."""
        what = f"{kind} blob {key[:12]}"
        refetch = self._refetch
        return read_blob(
            lambda p: decode(p.read_bytes(), what=what),
            path,
            key,
            refetch=None if refetch is None else lambda: refetch(key),
            what=f"{what}...",
        )

    def __len__(self) -> int:
        return len(self._items)
