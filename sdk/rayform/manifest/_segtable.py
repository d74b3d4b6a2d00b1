"""The one segment model: the segments of a manifest of either version as Arrow columns
(a v2 manifest's memory-mapped pages, or a v1 manifest's segments turned into the same table).

:class:`_Columns` holds the pages' Arrow tables (mapped, never copied whole) and derives numpy
arrays from them only when asked (``t0_ns`` of every stream row for the grid index, the blob
hashes for a pull), each once. :class:`Segments` is the ``Sequence[Segment]`` over them: a
selection is an array of positions, and indexing builds one
:class:`~rayform.manifest._model.Segment` (keeping the last few thousand).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, overload

import numpy as np

from rayform.errors import ManifestError
from rayform.manifest._model import BlobRef, Segment, Stream
from rayform.manifest._pagemap import PageMaps
from rayform.manifest._pagerows import PageRows
from rayform.manifest._rendcols import parse_cells, rendition_blobs, rendition_items
from rayform.manifest._schema import HASH_BYTES, segments_to_table, table_has_renditions
from rayform.manifest._segments import SegmentColumns

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["SegmentTable", "Segments"]


OPTIONAL_STR = ("units", "frame", "quantity", "codec")
_FLOATS = {"halffloat": "float16", "float": "float32", "double": "float64"}


def _pa() -> Any:
    import pyarrow as pa
    import pyarrow.compute  # noqa: F401

    return pa


def arrow_ints(values: np.ndarray) -> Any:
    """An Arrow ``int64`` array over a numpy array's buffer (``pa.array(ndarray)`` would
    import pandas to check for a Series: ~1 s in a fresh process)."""
    data = np.ascontiguousarray(values, dtype=np.int64)
    return _pa().Array.from_buffers(_pa().int64(), len(data), [None, _pa().py_buffer(data)])


def arrow_strings(values: Sequence[str]) -> Any:
    """An Arrow ``string`` array of ``values``, built from buffers (see :func:`arrow_ints`)."""
    encoded = [v.encode() for v in values]
    offsets = np.zeros(len(encoded) + 1, dtype=np.int32)
    np.cumsum([len(b) for b in encoded], out=offsets[1:])
    pa = _pa()
    return pa.Array.from_buffers(
        pa.string(), len(encoded), [None, pa.py_buffer(offsets), pa.py_buffer(b"".join(encoded))]
    )


def _np(arr: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """A numpy view of a fixed-width Arrow array (chunks concatenated; other types converted).

    Reads the data buffer directly: pyarrow's own ``to_numpy`` may import pandas (~1 s).
    """
    pa = _pa()
    if isinstance(arr, pa.ChunkedArray):
        parts = [_np(c) for c in arr.chunks]
        return np.concatenate(parts) if len(parts) != 1 else parts[0]
    t = arr.type
    if arr.null_count == 0 and (pa.types.is_integer(t) or pa.types.is_floating(t)):
        dtype = np.dtype(_FLOATS.get(str(t), str(t)))  # (t.to_pandas_dtype imports pandas)
        return np.frombuffer(
            arr.buffers()[1], dtype=dtype, count=len(arr), offset=arr.offset * dtype.itemsize
        )
    if arr.null_count == 0 and pa.types.is_boolean(t):
        return _bits(arr.buffers()[1], arr.offset, len(arr))
    return np.asarray(arr.to_numpy(zero_copy_only=False))


def _bits(buf: pa.Buffer, offset: int, n: int) -> np.ndarray:
    """``bool (n,)`` from an Arrow bitmap (least significant bit first)."""
    raw = np.unpackbits(np.frombuffer(buf, dtype=np.uint8), bitorder="little")
    return raw[offset : offset + n].astype(bool)


def _ints_or(arr: pa.Array, missing: int) -> np.ndarray:
    """An Arrow integer array as ``int64`` numpy, ``missing`` where null."""
    values = np.frombuffer(
        arr.buffers()[1],
        dtype=np.dtype(str(arr.type)),
        count=len(arr),
        offset=arr.offset * arr.type.bit_width // 8,
    ).astype(np.int64)
    if arr.null_count:
        values[~_bits(arr.buffers()[0], arr.offset, len(arr))] = missing
    return values


class _Columns:
    """Columns of the pages (one Arrow table each, in manifest order), derived lazily."""

    def __init__(
        self,
        pages: Sequence[Any],
        paths: Sequence[str] | None = None,
        maps: PageMaps | None = None,
        *,
        objects: Sequence[Segment] | None = None,
        summary: dict[str, Any] | None = None,
    ) -> None:
        pa = _pa()
        self.pages = list(pages)
        self.paths = list(paths) if paths is not None else None
        self.maps = maps
        # A version 1 manifest's own Segment objects, returned as they are (indexing stays a
        # tuple lookup); a v2 manifest builds one from its page row when asked.
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
                    offs = _np(chunk.offsets)
                    out.append(
                        (chunk.values.slice(int(offs[0]), int(offs[-1] - offs[0])), offs - offs[0])
                    )
            self._cache["values"] = out
        return list(self._cache["values"])

    def col(self, name: str) -> np.ndarray:
        """A segment column (``version``, ``start_ns``, ``end_ns``) as ``(S,)`` numpy."""
        key = "col:" + name
        if key not in self._cache:
            self._cache[key] = _np(self.table.column(name))
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
        pa = _pa()
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
                remap[_np(col.indices).astype(np.int64)]
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
            if not _pa().types.is_dictionary(col.type):
                return None
            grid = _np(col.indices).reshape(n, k)
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
        parts = [_np(values.field(field))[j::k] for values, _ in self.stream_values()]
        return np.concatenate(parts) if len(parts) != 1 else parts[0].copy()

    def field(self, name: str) -> np.ndarray:
        """A stream-row field of every stream row, ``(R,)`` numpy (strings as objects)."""
        # Not kept: the index needs t0/t1 once, and a kept copy would sit in every worker.
        parts = []
        for values, _ in self.stream_values():
            col = values.field(name)
            if _pa().types.is_dictionary(col.type):
                col = col.cast(col.type.value_type)
            parts.append(_np(col))
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

    @property
    def has_renditions(self) -> bool:
        """Whether the pages have the ``renditions`` field (format version 3, or a version 1
        manifest whose cameras list renditions)."""
        return table_has_renditions(self.pages[0])

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
        Not kept (see :meth:`field`); empty without the ``renditions`` field (version 2)."""
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
        """The summary of the segments at ``rows`` (all: ``None``): what a v2 root's
        ``summary`` holds, computed from the columns (``build_root`` writes this)."""
        if rows is None and self.known_summary is not None:
            return self.known_summary
        start, end = self.col("start_ns"), self.col("end_ns")
        sites = self.table.column("site").cast(_pa().string())
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
            "sites": sorted(str(x) for x in _pa().compute.unique(sites).to_pylist()),
            "start_ns": int(start.min()) if n else 0,
            "end_ns": int(end.max()) if n else 0,
            "duration_ns": int((end - start).sum()),
            "nbytes": int(self.unique_blobs(None, rows)[1].sum()),
        }

    def segment(self, row: int) -> Segment | None:
        """The manifest's own :class:`Segment` at ``row`` if it has objects (version 1)."""
        return self.objects[row] if self.objects is not None else None


def _map_columns(paths: list[str], summary: dict[str, Any] | None = None) -> _Columns:
    maps = PageMaps()
    return _Columns([maps.table(p) for p in paths], paths, maps, summary=summary)


def _list_columns(
    pages: list[Any], objects: Sequence[Segment] | None, summary: dict[str, Any] | None
) -> _Columns:
    return _Columns(pages, objects=objects, summary=summary)


class Segments(SegmentColumns):
    """The segments of a slice (or of a selection of it), as columns: the one segment model,
    whatever the manifest's version.

    A ``Sequence[Segment]``: ``len`` and the column methods cost no Python per segment;
    indexing gives a :class:`~rayform.Segment` (a version 1 manifest's own object; for
    version 2 one built from its page row, the last few thousand kept). Build one with
    :func:`~rayform.manifest.segments_of`; a selection is :meth:`take`.

    Args:
        columns: the whole manifest's columns.
        rows: positions of the selected segments in manifest order (``None``: all).
    """

    _CACHE = 4096

    def __init__(
        self, columns: _Columns | Iterable[Segment], rows: np.ndarray | None = None
    ) -> None:
        if not isinstance(columns, _Columns):  # Segments([seg, ...]): a table of these segments
            objects = tuple(columns)
            columns = _Columns([segments_to_table(objects)], objects=objects)
        self._c = columns
        self.rows = None if rows is None else np.asarray(rows, dtype=np.int64)
        self._made: OrderedDict[int, Segment] = OrderedDict()
        self._summary: dict[str, Any] | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_made": OrderedDict()}

    def __len__(self) -> int:
        return self._c.n if self.rows is None else len(self.rows)

    def positions(self) -> np.ndarray:
        """``int64 (S,)`` manifest positions of these segments."""
        return np.arange(self._c.n, dtype=np.int64) if self.rows is None else self.rows

    @overload
    def __getitem__(self, i: int) -> Segment: ...
    @overload
    def __getitem__(self, i: slice) -> Segments: ...
    def __getitem__(self, i: int | slice) -> Segment | Segments:
        if isinstance(i, slice):
            return Segments(self._c, self.positions()[i])
        n = len(self)
        if not -n <= i < n:
            raise IndexError(f"segment position {i} out of range for {n} segments")
        i = i + n if i < 0 else i
        row = int(self.rows[i]) if self.rows is not None else int(i)
        objects = self._c.objects
        if objects is not None:
            return objects[row]
        seg = self._made.get(row)
        if seg is None:
            seg = _segment(self._c.row(row))
            self._made[row] = seg
            if len(self._made) > self._CACHE:
                self._made.popitem(last=False)
        return seg

    def __iter__(self) -> Iterator[Segment]:
        for i in range(len(self)):
            yield self[i]

    def __eq__(self, other: object) -> bool:
        # Equal to any tuple, list or Segments of equal segments in the same order (a version 1
        # manifest's segments were a tuple, and compare equal to it still).
        if isinstance(other, Segments) and self.same_columns(other):
            return bool(np.array_equal(self.positions(), other.positions()))
        if isinstance(other, (Segments, tuple, list)):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))
        return NotImplemented

    __hash__ = object.__hash__  # by identity, as before equality was defined

    def take(self, positions: Sequence[int] | np.ndarray) -> Segments:
        """These segments at ``positions`` (indices into this sequence), in that order."""
        return Segments(self._c, self.positions()[np.asarray(positions, dtype=np.int64)])

    def same_columns(self, other: Segments) -> bool:
        """Whether ``other`` reads the same manifest's columns (a selection of one slice)."""
        return self._c is other._c

    def summary(self) -> dict[str, Any]:
        """Counts of these segments: ``segments``, ``streams`` (name -> kind, rate_hz, shape,
        dtype, units, frame, quantity, codec where set, and the number of ``segments`` that
        have it), ``sites`` (sorted), ``start_ns``/``end_ns`` (ns), ``duration_ns`` (ns, the
        sum of the segments' durations) and ``nbytes`` (distinct blobs, bytes). A whole v2
        manifest answers from its root without reading a page."""
        if self._summary is None:
            self._summary = self._c.summary(self.rows)
        return self._summary

    def site_counts(self) -> dict[str, int]:
        """Segments per site, sorted by site."""
        counts = self.sites().value_counts()
        pairs = zip(
            counts.field("values").to_pylist(), counts.field("counts").to_pylist(), strict=True
        )
        return dict(sorted((str(v), int(n)) for v, n in pairs))

    def streams_with_blob(self, digest: str) -> list[str]:
        """Names of the streams of these segments that hold blob ``digest`` (for messages)."""
        c = self._c
        raw = np.frombuffer(bytes.fromhex(digest), dtype=np.uint8)
        hit = (c.hashes("blob_hash") == raw).all(axis=1) | (c.hashes("ts_hash") == raw).all(axis=1)
        if self.rows is not None:
            hit &= np.isin(c.stream_seg, self.rows)
        return sorted({c.name_list[k] for k in np.unique(c.name_code[hit])})

    def release_pages(self) -> None:
        """Unmap the manifest pages this process touched (column reads touch every row); the
        table stays usable (see :mod:`rayform.manifest._pagemap`)."""
        self._c.release()

    # -- columns ---------------------------------------------------------------------------
    def column(self, name: str) -> np.ndarray:
        """A segment column (``version``, ``start_ns``, ``end_ns``) for these segments."""
        values = self._c.col(name)
        return values if self.rows is None else values[self.rows]

    def ids(self) -> Any:
        """The segment IDs as an Arrow string array (no Python string per segment)."""
        ids = self._c.table.column("id")
        return ids if self.rows is None else ids.take(arrow_ints(self.rows))

    def sites(self) -> Any:
        """The sites as an Arrow string array."""
        sites = self._c.table.column("site").cast(_pa().string())
        return sites if self.rows is None else sites.take(arrow_ints(self.rows))

    def find(self, segment_ids: Sequence[str]) -> np.ndarray:
        """Positions (in this table) of ``segment_ids``; ``-1`` where absent."""
        pa = _pa()
        found = pa.compute.index_in(arrow_strings(list(segment_ids)), value_set=self.ids())
        return _ints_or(found, -1)

    def stream_names(self) -> list[str]:
        """Sorted names of the streams present in at least one of these segments."""
        c = self._c
        if c.layout is not None:
            return sorted(c.layout) if len(self) else []
        codes = c.name_code if self.rows is None else c.name_code[np.isin(c.stream_seg, self.rows)]
        return sorted(c.name_list[int(k)] for k in np.unique(codes))

    def stream_field(self, name: str, field: str) -> tuple[np.ndarray, np.ndarray]:
        """``(present (S,) bool, values (S,))`` of one stream's ``field`` in these segments."""
        c = self._c
        if name not in c.name_list:
            return np.zeros(len(self), dtype=bool), np.zeros(len(self), dtype=np.int64)
        column = c.stream_column(name, field)
        if column is not None:  # every segment has the stream, at the same place
            return np.ones(len(self), dtype=bool), column if self.rows is None else column[
                self.rows
            ]
        sel = c.name_code == c.name_list.index(name)
        raw = c.field(field)[sel]
        segs = c.stream_seg[sel]
        full = np.zeros(c.n, dtype=raw.dtype)
        present = np.zeros(c.n, dtype=bool)
        full[segs] = raw
        present[segs] = True
        if self.rows is not None:
            return present[self.rows], full[self.rows]
        return present, full

    def stream_values(self, name: str, field: str) -> set[str]:
        """The distinct values of one stream's string ``field`` (e.g. ``kind``) in these segments."""
        c = self._c
        if name not in c.name_list:
            return set()
        sel = c.name_code == c.name_list.index(name)
        if self.rows is not None:
            sel &= np.isin(c.stream_seg, self.rows)
        out: set[str] = set()
        start = 0
        for values, _ in c.stream_values():
            n = len(values)
            part = sel[start : start + n]
            start += n
            if part.any():
                col = values.field(field).take(arrow_ints(np.flatnonzero(part)))
                out.update(
                    str(x) for x in _pa().compute.unique(col.cast(_pa().string())).to_pylist()
                )
        return out

    def blobs(self, streams: Sequence[str] | None = None) -> dict[str, BlobRef]:
        """Unique blobs of these segments by hash (optionally only the named streams)."""
        digests, sizes = self._c.unique_blobs(streams, self.rows)
        hexes = [d.tobytes().hex() for d in digests]
        return {h: BlobRef(h, int(s)) for h, s in zip(hexes, sizes, strict=True)}

    def rendition_blobs(self, streams: Sequence[str] | None = None) -> dict[str, BlobRef]:
        """Unique rendition blobs of these segments by hash (optionally only the named streams)."""
        digests, sizes = self._c.unique_renditions(streams, self.rows)
        return {
            d.tobytes().hex(): BlobRef(d.tobytes().hex(), int(s))
            for d, s in zip(digests, sizes, strict=True)
        }

    @property
    def has_renditions(self) -> bool:
        """Whether these segments' streams can list renditions (a version 3 manifest, or a
        version 1 manifest with renditions); without, every camera reads its original."""
        return self._c.has_renditions

    @property
    def holds_objects(self) -> bool:
        """Whether these are a version 1 manifest's own :class:`Segment` objects (indexing is
        a tuple lookup, so a pass over them builds nothing); else rows of columnar pages."""
        return self._c.objects is not None

    def _stream_rows(self, streams: Sequence[str] | None) -> np.ndarray:
        """``int64 (K,)``: the stream rows (indices into every stream row) of the named streams
        (all if ``None``) of these segments, in the order a pass over them meets them: segment
        by segment in this table's order (a segment listed twice counts at its first place),
        each segment's streams in row order, as :class:`Segment` lists them."""
        c = self._c
        mask = c.stream_mask(streams)
        if self.rows is None:
            return np.flatnonzero(mask)
        # rank[p]: where segment position p first appears in this selection (-1: absent).
        rank = np.full(c.n, -1, dtype=np.int64)
        positions, first = np.unique(self.rows, return_index=True)
        rank[positions] = first
        seg_rank = rank[c.stream_seg]
        kept = np.flatnonzero(mask & (seg_rank >= 0))
        return kept[np.argsort(seg_rank[kept], kind="stable")]

    def first_kinds(self, streams: Sequence[str] | None = None) -> dict[str, str]:
        """``{name: kind}`` of the named streams (all if ``None``) in these segments: each
        name's ``kind`` in the first segment that has it (in this table's order), from the
        columns."""
        c = self._c
        rows = self._stream_rows(streams)
        codes, first = np.unique(c.name_code[rows], return_index=True)
        return {
            c.name_list[int(k)]: str(c.value_at("kind", int(rows[i])))
            for k, i in zip(codes, first, strict=True)
        }

    def chosen_blobs(
        self,
        streams: Sequence[str] | None,
        covers: Mapping[str, Callable[[int, int], bool]],
    ) -> dict[str, BlobRef]:
        """``{hash: BlobRef}`` of the named streams (all if ``None``) of these segments, with
        each video of a stream named in ``covers`` replaced by its first (smallest) rendition
        whose ``height`` x ``width`` (pixels) ``covers[name]`` accepts, where one does: from the
        columns, no :class:`Segment` built.

        Per stream row, exactly what a pass over the segments would collect: a video with a
        timestamps blob and a ``covers`` entry gives ``[chosen video, timestamps]``, any other
        row its own blobs (``[video, timestamps]`` or ``[table]``). The dict's order is that of
        each hash's first appearance in such a pass, and a hash listed twice keeps the size of
        its last appearance (what ``dict.update`` in that pass leaves).
        """
        c = self._c
        rows = self._stream_rows(streams)
        codes = c.name_code[rows]
        video = c.hashes("blob_hash")[rows]
        video_size = c.field("blob_size")[rows].astype(np.int64)
        ts = c.hashes("ts_hash")[rows]
        ts_size = c.field("ts_size")[rows].astype(np.int64)
        has_ts = ts.any(axis=1)
        targeted = np.array([name in covers for name in c.name_list], dtype=bool)
        choosing = np.flatnonzero(has_ts & targeted[codes])
        if len(choosing) and c.has_renditions:
            offsets, digests, sizes, heights, widths = c.renditions()
            chosen, item = _first_covering(
                offsets, heights, widths, rows[choosing], codes[choosing], c.name_list, covers
            )
            video[choosing[chosen]] = digests[item]
            video_size[choosing[chosen]] = sizes[item]
        # Each row's blobs in pass order: [video, timestamps], the latter only where present.
        keep = np.stack([np.ones(len(rows), dtype=bool), has_ts], axis=1).ravel()
        all_d = np.stack([video, ts], axis=1).reshape(-1, HASH_BYTES)[keep]
        all_s = np.stack([video_size, ts_size], axis=1).ravel()[keep]
        first, last = _first_last(all_d)
        order = np.argsort(first)
        out_d, out_s = all_d[first[order]], all_s[last[order]]
        text = out_d.tobytes().hex()  # one call, then slices: not one bytes.hex() per blob
        step = 2 * HASH_BYTES
        return {
            (h := text[i * step : (i + 1) * step]): BlobRef(h, size)
            for i, size in enumerate(out_s.tolist())
        }

    def duration_ns(self) -> int:
        return int((self.column("end_ns") - self.column("start_ns")).sum())

    def stream_name_lists(self) -> Any:
        """The sorted stream names of each of these segments (Arrow ``list<string>``), from the
        columns: no :class:`~rayform.manifest._model.Segment` is built."""
        c, pa = self._c, _pa()
        # Stream rows sorted by segment position, then name: each segment's names are one run.
        rank = np.argsort(np.argsort(c.name_list)).astype(np.int64)
        order = np.lexsort((rank[c.name_code], c.stream_seg))
        codes = c.name_code[order].astype(np.int64)
        per_pos = np.bincount(c.stream_seg, minlength=c.n)
        starts = np.concatenate([[0], np.cumsum(per_pos)[:-1]]).astype(np.int64)
        rows = self.positions()
        counts = per_pos[rows]
        offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
        # Each row's run, in this table's order (a selection may reorder positions).
        take = np.repeat(starts[rows] - offsets[:-1], counts) + np.arange(
            offsets[-1], dtype=np.int64
        )
        names = arrow_strings(c.name_list).take(arrow_ints(codes[take]))
        arrow_offsets = pa.Array.from_buffers(
            pa.int32(), len(offsets), [None, pa.py_buffer(offsets)]
        )
        return pa.ListArray.from_arrays(arrow_offsets, names)

    def segment_nbytes(self) -> np.ndarray:
        """``int64 (S,)``: the stored bytes of each of these segments, from the columns."""
        c = self._c
        sizes = c.field("blob_size").astype(np.int64) + c.field("ts_size").astype(np.int64)
        per_pos = np.bincount(c.stream_seg, weights=sizes, minlength=c.n).astype(np.int64)
        return per_pos if self.rows is None else per_pos[self.rows]


def _first_covering(
    offsets: np.ndarray,
    heights: np.ndarray,
    widths: np.ndarray,
    rows: np.ndarray,
    codes: np.ndarray,
    names: Sequence[str],
    covers: Mapping[str, Callable[[int, int], bool]],
) -> tuple[np.ndarray, np.ndarray]:
    """For the stream ``rows`` (with name ``codes`` into ``names``), the first of each row's
    renditions (``offsets``/``heights``/``widths`` of :meth:`_Columns.renditions`) that
    ``covers[name](height, width)`` accepts: ``(indices into rows that have one, the chosen
    rendition items)``. ``covers`` is called once per distinct (name, height, width), not per
    row: a manifest has a few rendition sizes and millions of rows."""
    counts = offsets[rows + 1] - offsets[rows]
    total = int(counts.sum())
    owner = np.repeat(np.arange(len(rows), dtype=np.int64), counts)
    # Item j of row k is offsets[rows[k]] + (j's place within the row).
    before = np.cumsum(counts) - counts
    item = np.repeat(offsets[rows] - before, counts) + np.arange(total, dtype=np.int64)
    item_code = np.repeat(codes, counts)
    ok = np.zeros(total, dtype=bool)
    for code in np.unique(item_code):
        at = np.flatnonzero(item_code == code)
        # Sides are below 2**31 (the page checks): one int64 key per (height, width).
        sizes, inverse = np.unique(
            (heights[item[at]] << 31) | widths[item[at]], return_inverse=True
        )
        test = covers[names[int(code)]]
        accepted = np.array([test(int(k >> 31), int(k & (2**31 - 1))) for k in sizes], bool)
        ok[at] = accepted[inverse.ravel()]
    hit = np.flatnonzero(ok)
    # Items are in row order and, within a row, smallest first: a row's first hit is its choice.
    chosen, first = np.unique(owner[hit], return_index=True)
    return chosen, item[hit[first]]


def _first_last(digests: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(first (U,), last (U,))`` int64: for each distinct row of ``digests`` ``(N, 32)``
    (in digest order), the index of its first and of its last occurrence."""
    if not len(digests):
        none = np.zeros(0, np.int64)
        return none, none
    keys = np.ascontiguousarray(digests).view(np.dtype((np.void, HASH_BYTES))).ravel()
    perm = np.argsort(keys, kind="stable")  # equal keys keep their order: first .. last
    ordered = keys[perm]
    starts = np.flatnonzero(np.concatenate([[True], ordered[1:] != ordered[:-1]]))
    ends = np.concatenate([starts[1:], [len(keys)]]) - 1
    return perm[starts].astype(np.int64), perm[ends].astype(np.int64)


def _segment(d: dict[str, Any]) -> Segment:
    streams = {}
    for s in d["streams"]:
        ts = BlobRef(s["ts_hash"].hex(), int(s["ts_size"])) if any(s["ts_hash"]) else None
        if (ts is None) != (s["kind"] == "table"):  # the page checks cannot see this per row
            raise ManifestError(
                f"segment {d['id']} stream {s['name']}: a video stream needs a "
                "timestamps blob and a table stream has none"
            )
        where = f"segment {d['id']} stream {s['name']}"
        renditions = parse_cells(s.get("renditions") or (), s["kind"], s["shape"], where)
        streams[s["name"]] = Stream(
            name=s["name"],
            kind=s["kind"],
            blob=BlobRef(s["blob_hash"].hex(), int(s["blob_size"])),
            rate_hz=float(s["rate_hz"]),
            shape=tuple(s["shape"]),
            dtype=s["dtype"],
            count=int(s["count"]),
            t0_ns=int(s["t0_ns"]),
            t1_ns=int(s["t1_ns"]),
            timestamps=ts,
            units=s["units"] or None,
            frame=s["frame"] or None,
            quantity=s["quantity"] or None,
            codec=s["codec"] or None,
            gop=s["gop"] or None,
            renditions=renditions,
        )
    return Segment(
        id=d["id"],
        version=int(d["version"]),
        site=d["site"],
        start_ns=int(d["start_ns"]),
        end_ns=int(d["end_ns"]),
        streams=streams,
    )


#: The name this model had when only version 2 manifests used it.
SegmentTable = Segments
