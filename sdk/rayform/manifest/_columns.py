"""The columns of a manifest's pages, and what is derived from them lazily.

:class:`PageColumns` holds the pages' Arrow tables (mapped, never copied whole; an in-memory
manifest's segments become one such table) and derives numpy arrays from them only when asked
(``t0_ns`` of every stream row for the grid index, the blob hashes for a pull), each once. When
every segment lists the same streams in the same order, a stream's field is a strided view of
each page (:attr:`PageColumns.layout`), with no mask over every stream row.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from rayform.manifest._arrow import arrow_ints, to_numpy
from rayform.manifest._arrow import load as pyarrow
from rayform.manifest._model import Segment
from rayform.manifest._pagemap import PageMaps
from rayform.manifest._pagerows import PageRows
from rayform.manifest._rendcols import any_renditions, rendition_blobs, rendition_items
from rayform.manifest._schema import HASH_BYTES

__all__ = ["PageColumns"]

OPTIONAL_STR = ("units", "frame", "quantity", "codec")


class PageColumns:
    """The columns of a manifest's pages (one Arrow table each, in manifest order), and what
    is derived from them, each computed once when first asked.

    Args:
        pages: the pages' tables, in manifest order.
        paths: their files, for pickling by path (``None``: pages built in memory).
        maps: the maps the pages were read through (to give back touched memory).
        objects: an in-memory manifest's own :class:`Segment` objects, returned as they are.
        summary: the writer's summary of the whole table (a root's).
    """

    def __init__(
        self,
        pages: Sequence[Any],
        paths: Sequence[str] | None = None,
        maps: PageMaps | None = None,
        *,
        objects: Sequence[Segment] | None = None,
        summary: dict[str, Any] | None = None,
    ) -> None:
        pa = pyarrow()
        self.pages = list(pages)
        self.paths = list(paths) if paths is not None else None
        self.maps = maps
        # An in-memory manifest's own Segment objects, returned as they are (indexing stays a
        # tuple lookup); a mapped manifest builds one from its page row when asked.
        self.objects = tuple(objects) if objects is not None else None
        # The writer's summary of the whole table (a v2 root's), read instead of the columns.
        self.known_summary = summary
        self.table = pa.concat_tables(self.pages) if len(self.pages) > 1 else self.pages[0]
        self.n = self.table.num_rows
        self._page_start = np.cumsum([0, *(p.num_rows for p in self.pages)])[:-1]
        self._fast: dict[int, PageRows | None] = {}  # per page, built on its first row
        self._cache: dict[str, Any] = {}

    def __reduce__(self) -> tuple[Any, ...]:
        # Pickled (spawned DataLoader workers) as the pages' paths: the receiver maps the same
        # files instead of receiving a copy of the columns.
        if self.paths is None:
            return (_list_columns, (self.pages, self.objects, self.known_summary))
        return (_map_columns, (self.paths, self.known_summary))

    def stream_values(self) -> list[Any]:
        """Per page, the flattened stream rows (a StructArray) and the list offsets."""
        if "values" not in self._cache:
            out = []
            for page in self.pages:
                lists = page.column("streams")
                for chunk in lists.chunks:
                    offs = to_numpy(chunk.offsets)
                    out.append(
                        (chunk.values.slice(int(offs[0]), int(offs[-1] - offs[0])), offs - offs[0])
                    )
            self._cache["values"] = out
        return list(self._cache["values"])

    def col(self, name: str) -> np.ndarray:
        """A segment column (``version``, ``start_ns``, ``end_ns``) as ``(S,)`` numpy."""
        key = "col:" + name
        if key not in self._cache:
            self._cache[key] = to_numpy(self.table.column(name))
        return np.asarray(self._cache[key])

    @property
    def stream_seg(self) -> np.ndarray:
        """``int32 (R,)``: the segment position of every stream row."""
        if "seg" not in self._cache:
            parts, base = [], 0
            for _, offs in self.stream_values():
                n = len(offs) - 1
                parts.append(np.repeat(np.arange(base, base + n, dtype=np.int32), np.diff(offs)))
                base += n
            self._cache["seg"] = np.concatenate(parts) if parts else np.zeros(0, np.int32)
        return np.asarray(self._cache["seg"])

    @property
    def name_list(self) -> list[str]:
        self._names()
        return list(self._cache["names"])

    @property
    def name_code(self) -> np.ndarray:
        """``int32 (R,)``: index into :attr:`name_list` of every stream row."""
        self._names()
        return np.asarray(self._cache["codes"])

    def _names(self) -> None:
        if "codes" in self._cache:
            return
        pa = pyarrow()
        names: list[str] = []
        codes = []
        for values, _ in self.stream_values():
            col = values.field("name")
            if not pa.types.is_dictionary(col.type):
                col = col.dictionary_encode()
            local = [str(x) for x in col.dictionary.to_pylist()]
            for name in local:
                if name not in names:
                    names.append(name)
            remap = np.array([names.index(x) for x in local], dtype=np.int32)
            codes.append(
                remap[to_numpy(col.indices).astype(np.int64)]
                if len(local)
                else np.zeros(len(col), np.int32)
            )
        self._cache["names"] = names
        self._cache["codes"] = np.concatenate(codes) if codes else np.zeros(0, np.int32)

    @property
    def layout(self) -> tuple[str, ...] | None:
        """The stream names every segment lists, in row order, when every segment lists
        exactly these (a fleet's usual manifest): then segment ``s``'s stream ``j`` is stream
        row ``s * k + j``, and a stream's column is a strided view. ``None`` otherwise."""
        if "layout" not in self._cache:
            self._cache["layout"] = self._find_layout()
        found: tuple[str, ...] | None = self._cache["layout"]
        return found

    def _find_layout(self) -> tuple[str, ...] | None:
        # Per page, from the name column's dictionary indices: no code per stream row built.
        found: tuple[str, ...] | None = None
        for values, offs in self.stream_values():
            n = len(offs) - 1
            if not n:
                continue
            k = len(found) if found is not None else int(offs[-1]) // n
            if not k or not np.array_equal(offs, np.arange(n + 1, dtype=offs.dtype) * k):
                return None
            col = values.field("name")
            if not pyarrow().types.is_dictionary(col.type):
                return None
            grid = to_numpy(col.indices).reshape(n, k)
            if not bool((grid == grid[0]).all()):
                return None
            names = tuple(str(col.dictionary[int(i)].as_py()) for i in grid[0])
            if len(set(names)) != k or (found is not None and names != found):
                return None
            found = names
        return found

    def stream_column(self, name: str, field: str) -> np.ndarray | None:
        """``(S,)``: one numeric field of stream ``name`` in every segment, read as a strided
        view of each page (no mask over every stream row); ``None`` unless :attr:`layout`
        holds and names the stream."""
        layout = self.layout
        if layout is None or name not in layout:
            return None
        j, k = layout.index(name), len(layout)
        parts = [to_numpy(values.field(field))[j::k] for values, _ in self.stream_values()]
        return np.concatenate(parts) if len(parts) != 1 else parts[0].copy()

    def field(self, name: str) -> np.ndarray:
        """A stream-row field of every stream row, ``(R,)`` numpy (strings as objects)."""
        # Not kept: the index needs t0/t1 once, and a kept copy would sit in every worker.
        parts = []
        for values, _ in self.stream_values():
            col = values.field(name)
            if pyarrow().types.is_dictionary(col.type):
                col = col.cast(col.type.value_type)
            parts.append(to_numpy(col))
        return np.concatenate(parts) if parts else np.zeros(0)

    def hashes(self, name: str) -> np.ndarray:
        """``(R, 32) uint8`` raw digests of ``blob_hash``/``ts_hash`` (zeros: no blob)."""
        parts = []
        for values, _ in self.stream_values():
            arr = values.field(name)
            buf = np.frombuffer(arr.buffers()[1], dtype=np.uint8)
            start = arr.offset * HASH_BYTES
            parts.append(buf[start : start + len(arr) * HASH_BYTES].reshape(len(arr), HASH_BYTES))
        return np.concatenate(parts) if parts else np.zeros((0, HASH_BYTES), np.uint8)

    def present(self, name: str) -> np.ndarray:
        """``bool (R,)``: whether the stream rows' hash field ``name`` names a blob (a table
        stream's ``ts_hash`` is 32 zero bytes)."""
        return np.asarray(self.hashes(name).any(axis=1))

    def row(self, i: int) -> dict[str, Any]:
        # Sliced from its own page: a row of the concatenated table touches buffers of every
        # page (measured: ~6 MiB mapped per row at 62 pages, against ~130 KiB from its page).
        p = int(np.searchsorted(self._page_start, i, side="right")) - 1
        local = i - int(self._page_start[p])
        if p not in self._fast:
            self._fast[p] = PageRows.of(
                self.pages[p], self.maps.file_of(p) if self.maps is not None else None
            )
            if self.maps is not None:
                self.maps.release(p)  # its dictionaries were read through the map
        fast = self._fast[p]
        if fast is not None:
            return fast.row(local)  # read from the page file, nothing mapped (see _pagerows)
        out = dict(self.pages[p].slice(local, 1).to_pylist()[0])
        if self.maps is not None:
            # One row touches ~25 column buffers of its page, and the kernel maps whole folios
            # around each (up to 2 MiB): unmap at once, or a shuffled epoch would leave most of
            # the manifest resident in every worker.
            self.maps.release(p)
        return out

    def release(self) -> None:
        """Give back the mapped pages this process touched (see :mod:`rayform.manifest._pagemap`)."""
        if self.maps is not None:
            self.maps.release()

    def stream_mask(self, streams: Sequence[str] | None) -> np.ndarray:
        if streams is None:
            return np.ones(len(self.name_code), dtype=bool)
        names = self.name_list
        return np.isin(self.name_code, [names.index(s) for s in streams if s in names])

    def blob_codes(self, stream: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Which of one stream's distinct blobs each segment holds: ``(digests (U, 32) uint8,
        sizes (U,) int64, codes (N,) int32)``, ``codes[s]`` the index into ``digests`` of
        segment ``s``'s blob, ``-1`` where the segment lacks the stream. Computed once."""
        key = "codes:" + stream
        if key not in self._cache:
            self._cache[key] = self._blob_codes(stream)
        found: tuple[np.ndarray, np.ndarray, np.ndarray] = self._cache[key]
        return found

    def _blob_codes(self, stream: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        codes = np.full(self.n, -1, dtype=np.int32)
        if stream not in self.name_list:
            return np.zeros((0, HASH_BYTES), np.uint8), np.zeros(0, np.int64), codes
        layout = self.layout
        if layout is not None:  # stream j of segment s is row s * k + j: no mask over every row
            j, k = layout.index(stream), len(layout)
            digests = self.hashes("blob_hash")[j::k]
            sizes = self.field("blob_size")[j::k].astype(np.int64)
            segs = np.arange(self.n, dtype=np.int64)
        else:
            mask = self.stream_mask([stream])
            digests = self.hashes("blob_hash")[mask]
            sizes = self.field("blob_size")[mask].astype(np.int64)
            segs = self.stream_seg[mask].astype(np.int64)
        first, inverse = _unique_digests(digests)
        codes[segs] = inverse
        return np.ascontiguousarray(digests[first]), sizes[first], codes

    def unique_blobs(
        self, streams: Sequence[str] | None, rows: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Unique ``(digests (U, 32) uint8, sizes (U,) int64)`` of the named streams' blobs."""
        mask = self.stream_mask(streams)
        if rows is not None:
            mask &= np.isin(self.stream_seg, rows)
        digests, sizes = [], []
        for h, s in (("blob_hash", "blob_size"), ("ts_hash", "ts_size")):
            keep = mask & self.present(h)
            digests.append(self.hashes(h)[keep])
            sizes.append(self.field(s)[keep].astype(np.int64))
        all_d, all_s = np.concatenate(digests), np.concatenate(sizes)
        if not len(all_d):
            return all_d, all_s
        keys = np.ascontiguousarray(all_d).view(np.dtype((np.void, HASH_BYTES))).ravel()
        _, first = np.unique(keys, return_index=True)
        return all_d[first], all_s[first]

    def blob_counts(
        self, stream: str, rows: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The distinct blobs of one stream and how many segments hold each: ``(digests (U, 32)
        uint8, sizes (U,) int64, segments (U,) int64)``, most segments first (ties by digest)."""
        mask = self.stream_mask([stream])
        if rows is not None:
            mask &= np.isin(self.stream_seg, rows)
        digests = self.hashes("blob_hash")[mask]
        sizes = self.field("blob_size")[mask].astype(np.int64)
        if not len(digests):
            return digests, sizes, np.zeros(0, dtype=np.int64)
        keys = np.ascontiguousarray(digests).view(np.dtype((np.void, HASH_BYTES))).ravel()
        _, first, counts = np.unique(keys, return_index=True, return_counts=True)
        order = np.argsort(-counts, kind="stable")
        return digests[first][order], sizes[first][order], counts[order].astype(np.int64)

    @property
    def has_renditions(self) -> bool:
        """Whether any stream row lists a rendition (every page has the field; most rows hold
        an empty list)."""
        if "any_renditions" not in self._cache:
            self._cache["any_renditions"] = any(
                any_renditions(values) for values, _ in self.stream_values()
            )
        return bool(self._cache["any_renditions"])

    def unique_renditions(
        self, streams: Sequence[str] | None, rows: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Unique ``(digests (U, 32) uint8, sizes (U,) int64)`` of the named streams' renditions."""
        if not self.has_renditions:
            return np.zeros((0, HASH_BYTES), np.uint8), np.zeros(0, np.int64)
        mask = self.stream_mask(streams)
        if rows is not None:
            mask &= np.isin(self.stream_seg, rows)
        digests, sizes, start = [], [], 0
        for values, _ in self.stream_values():
            d, s = rendition_blobs(values, mask[start : start + len(values)])
            start += len(values)
            digests.append(d)
            sizes.append(s)
        all_d, all_s = np.concatenate(digests), np.concatenate(sizes)
        if not len(all_d):
            return all_d, all_s
        keys = np.ascontiguousarray(all_d).view(np.dtype((np.void, HASH_BYTES))).ravel()
        _, first = np.unique(keys, return_index=True)
        return all_d[first], all_s[first]

    def renditions(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Every stream row's renditions, flattened over the pages: ``(offsets (R + 1,) int64,
        digests (I, 32) uint8, sizes (I,) int64 bytes, heights (I,) int64, widths (I,) int64
        pixels)``; stream row ``r`` lists items ``offsets[r]:offsets[r + 1]``, smallest first.
        Not kept (see :meth:`field`); empty where no row lists a rendition."""
        parts = (
            [rendition_items(values) for values, _ in self.stream_values()]
            if self.has_renditions
            else []
        )
        if not parts:
            none = np.zeros(0, np.int64)
            empty = np.zeros((0, HASH_BYTES), np.uint8)
            return np.zeros(self.n_rows + 1, np.int64), empty, none, none, none
        counts = np.concatenate([p[0] for p in parts])
        offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        digests, sizes, heights, widths = (
            np.concatenate([p[k] for p in parts]) for k in range(1, 5)
        )
        return offsets, digests, sizes, heights, widths

    @property
    def n_rows(self) -> int:
        """Stream rows of all pages (``R``)."""
        return len(self.stream_seg)

    def value_at(self, name: str, row: int) -> Any:
        """Field ``name`` of the stream row ``row`` (an index into every stream row) as Python."""
        local = row
        for values, _ in self.stream_values():
            if local < len(values):
                return values.field(name)[local].as_py()
            local -= len(values)
        raise IndexError(f"stream row {row} out of range")

    def summary(self, rows: np.ndarray | None = None) -> dict[str, Any]:
        """The summary of the segments at ``rows`` (all: ``None``): what a root's
        ``summary`` holds, computed from the columns (``build_root`` writes this)."""
        if rows is None and self.known_summary is not None:
            return self.known_summary
        start, end = self.col("start_ns"), self.col("end_ns")
        sites = self.table.column("site").cast(pyarrow().string())
        codes, segs = self.name_code, self.stream_seg
        if rows is not None:
            start, end = start[rows], end[rows]
            sites = sites.take(arrow_ints(rows))
            keep = np.isin(segs, rows)
            codes, segs = codes[keep], segs[keep]
        info: dict[str, Any] = {}
        for code, name in enumerate(self.name_list):
            hits = np.flatnonzero(codes == code)
            if not hits.size:
                continue
            seg_row = self.row(int(segs[hits[0]]))
            first = next(s for s in seg_row["streams"] if s["name"] == name)
            info[name] = {
                k: first[k]
                for k in ("kind", "rate_hz", "shape", "dtype", *OPTIONAL_STR)
                if first[k] not in (None, "")
            } | {"segments": int(hits.size)}
        n = len(start)
        return {
            "segments": n,
            "streams": dict(sorted(info.items())),
            "sites": sorted(str(x) for x in pyarrow().compute.unique(sites).to_pylist()),
            "start_ns": int(start.min()) if n else 0,
            "end_ns": int(end.max()) if n else 0,
            "duration_ns": int((end - start).sum()),
            "nbytes": int(self.unique_blobs(None, rows)[1].sum()),
        }

    def segment(self, row: int) -> Segment | None:
        """The manifest's own :class:`Segment` at ``row`` if it has objects (in memory)."""
        return self.objects[row] if self.objects is not None else None


def _map_columns(paths: list[str], summary: dict[str, Any] | None = None) -> PageColumns:
    maps = PageMaps()
    return PageColumns([maps.table(p) for p in paths], paths, maps, summary=summary)


def _list_columns(
    pages: list[Any], objects: Sequence[Segment] | None, summary: dict[str, Any] | None
) -> PageColumns:
    return PageColumns(pages, objects=objects, summary=summary)


def _unique_digests(digests: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(first (U,), inverse (R,))`` of ``(R, 32) uint8`` digests, as :func:`numpy.unique`
    gives them. Sorts each digest's first 8 bytes as one integer (a sort of 32-byte keys is
    several times slower), then checks every whole digest against its group's: a shared
    prefix of two different digests falls back to the sort of whole digests."""
    if not len(digests):
        return np.zeros(0, np.int64), np.zeros(0, np.int32)
    whole = np.ascontiguousarray(digests)
    prefix = whole[:, :8].copy().view(np.uint64).ravel()
    _, first, inverse = np.unique(prefix, return_index=True, return_inverse=True)
    if not bool((whole[first][inverse] == whole).all()):
        keys = whole.view(np.dtype((np.void, HASH_BYTES))).ravel()
        _, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
    return first, inverse.astype(np.int32).ravel()
