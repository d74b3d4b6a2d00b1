"""The one segment model: the segments of a manifest, mapped or in memory, as columns.

:class:`Segments` is the ``Sequence[Segment]`` over a manifest's
:class:`~rayform.manifest._columns.PageColumns` (a manifest's memory-mapped pages, or an in-memory
manifest's segments turned into the same table): a selection is an array of positions, and
indexing builds one :class:`~rayform.manifest._model.Segment` (keeping the last few thousand).

Its methods are what a user reads of a slice's segments. What the SDK alone needs (the blobs a
training resolution reads, the streams' kinds, giving back mapped pages) are the functions
below, exported by the package's face, not methods.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, overload

import numpy as np

from rayform.manifest._arrow import arrow_ints, arrow_strings, ints_or
from rayform.manifest._arrow import load as pyarrow
from rayform.manifest._blobchoice import choose_blobs
from rayform.manifest._blobchoice import first_kinds as _first_kinds
from rayform.manifest._columns import PageColumns
from rayform.manifest._display import SegmentColumns
from rayform.manifest._model import BlobRef, Segment
from rayform.manifest._pagerows import segment_of_row
from rayform.manifest._schema import HASH_BYTES, segments_to_table

__all__ = ["Segments", "chosen_blobs", "first_kinds", "release_pages"]


class Segments(SegmentColumns):
    """The segments of a slice (or of a selection of it), as columns: the one segment model,
    whatever the manifest's version.

    A ``Sequence[Segment]``: ``len`` and the column methods cost no Python per segment;
    indexing gives a :class:`~rayform.Segment` (an in-memory manifest's own object; for
    a mapped one one built from its page row, the last few thousand kept). Build one with
    :func:`~rayform.manifest.segments_of`; a selection is :meth:`take`.

    Args:
        columns: the whole manifest's columns, or :class:`Segment` objects (an in-memory
            manifest's: they become the same columns, and indexing returns them).
        rows: positions of the selected segments in manifest order (``None``: all).
    """

    _CACHE = 4096

    def __init__(
        self, columns: PageColumns | Iterable[Segment], rows: np.ndarray | None = None
    ) -> None:
        if not isinstance(columns, PageColumns):  # Segments([seg, ...]): a table of these segments
            objects = tuple(columns)
            columns = PageColumns([segments_to_table(objects)], objects=objects)
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
            seg = segment_of_row(self._c.row(row))
            self._made[row] = seg
            if len(self._made) > self._CACHE:
                self._made.popitem(last=False)
        return seg

    def __iter__(self) -> Iterator[Segment]:
        for i in range(len(self)):
            yield self[i]

    def __eq__(self, other: object) -> bool:
        # Equal to any tuple, list or Segments of equal segments in the same order (an in-memory
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

    def page_table(self) -> Any:
        """These segments as a ``pyarrow.Table`` of the manifest's page schema (
        3 with renditions), in this order: what a new manifest of them is written from
        (``table_to_pages``), so a selection's manifest references the same blobs."""
        pa = pyarrow()
        return self._c.table.take(pa.array(self.positions(), pa.int64()))

    def same_columns(self, other: Segments) -> bool:
        """Whether ``other`` reads the same manifest's columns (a selection of one slice)."""
        return self._c is other._c

    def summary(self) -> dict[str, Any]:
        """Counts of these segments: ``segments``, ``streams`` (name -> kind, rate_hz, shape,
        dtype, units, frame, quantity, codec where set, and the number of ``segments`` that
        have it), ``sites`` (sorted), ``start_ns``/``end_ns`` (ns), ``duration_ns`` (ns, the
        sum of the segments' durations) and ``nbytes`` (distinct blobs, bytes). A whole mapped
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
        sites = self._c.table.column("site").cast(pyarrow().string())
        return sites if self.rows is None else sites.take(arrow_ints(self.rows))

    def find(self, segment_ids: Sequence[str]) -> np.ndarray:
        """Positions (in this table) of ``segment_ids``; ``-1`` where absent."""
        pa = pyarrow()
        found = pa.compute.index_in(arrow_strings(list(segment_ids)), value_set=self.ids())
        return ints_or(found, -1)

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

    def stream_hashes(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        """``(present (S,) bool, digests (S, 32) uint8)``: the raw BLAKE3 digest of stream
        ``name``'s blob in each of these segments (zeros where the stream is absent), from the
        columns: no :class:`~rayform.manifest._model.Segment` is built."""
        c = self._c
        present = np.zeros(c.n, dtype=bool)
        digests = np.zeros((c.n, HASH_BYTES), dtype=np.uint8)
        if name in c.name_list:
            sel = c.name_code == c.name_list.index(name)
            segs = c.stream_seg[sel]
            digests[segs] = c.hashes("blob_hash")[sel]
            present[segs] = True
        if self.rows is not None:
            return present[self.rows], digests[self.rows]
        return present, digests

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
                    str(x)
                    for x in pyarrow().compute.unique(col.cast(pyarrow().string())).to_pylist()
                )
        return out

    def blobs(self, streams: Sequence[str] | None = None) -> dict[str, BlobRef]:
        """Unique blobs of these segments by hash (optionally only the named streams)."""
        digests, sizes = self._c.unique_blobs(streams, self.rows)
        hexes = [d.tobytes().hex() for d in digests]
        return {h: BlobRef(h, int(s)) for h, s in zip(hexes, sizes, strict=True)}

    def blob_counts(self, stream: str) -> list[tuple[BlobRef, int]]:
        """The distinct blobs of ``stream`` in these segments, each with how many segments hold
        it, most first (a text stream's blob is the same bytes wherever its records are: a
        slice with a task per episode holds one blob per distinct task)."""
        digests, sizes, counts = self._c.blob_counts(stream, self.rows)
        return [
            (BlobRef(d.tobytes().hex(), int(s)), int(n))
            for d, s, n in zip(digests, sizes, counts, strict=True)
        ]

    def blob_codes(self, stream: str) -> tuple[list[BlobRef], np.ndarray]:
        """Which blob of ``stream`` each of these segments holds, from the columns (no blob
        read): ``(blobs, codes (S,) int32)``, ``blobs`` the stream's distinct blobs in the
        whole manifest and ``codes[i]`` the index into them of segment ``i``'s, ``-1`` where it
        lacks the stream. A text stream's blob is the same bytes wherever its records are, so
        a slice with a task per episode reads its tasks per episode from one blob per task."""
        digests, sizes, codes = self._c.blob_codes(stream)
        blobs = [BlobRef(d.tobytes().hex(), int(s)) for d, s in zip(digests, sizes, strict=True)]
        return blobs, codes if self.rows is None else codes[self.rows]

    def rendition_blobs(self, streams: Sequence[str] | None = None) -> dict[str, BlobRef]:
        """Unique rendition blobs of these segments by hash (optionally only the named streams)."""
        digests, sizes = self._c.unique_renditions(streams, self.rows)
        return {
            d.tobytes().hex(): BlobRef(d.tobytes().hex(), int(s))
            for d, s in zip(digests, sizes, strict=True)
        }

    @property
    def has_renditions(self) -> bool:
        """Whether any of these segments' streams lists a rendition; without, every camera
        reads its original."""
        return self._c.has_renditions

    def duration_ns(self) -> int:
        return int((self.column("end_ns") - self.column("start_ns")).sum())

    def stream_name_lists(self) -> Any:
        """The sorted stream names of each of these segments (Arrow ``list<string>``), from the
        columns: no :class:`~rayform.manifest._model.Segment` is built."""
        c, pa = self._c, pyarrow()
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


def chosen_blobs(
    segments: Segments,
    streams: Sequence[str] | None,
    covers: Mapping[str, Callable[[int, int], bool]],
) -> dict[str, BlobRef]:
    """``{hash: BlobRef}`` of the named streams (all if ``None``) of ``segments``, each video
    of a stream named in ``covers`` replaced by its first rendition that ``covers[name](height,
    width)`` accepts (see :func:`rayform.manifest._blobchoice.choose_blobs`): what a dataset at
    a training resolution reads, for a pull."""
    return choose_blobs(segments._c, segments.rows, streams, covers)


def first_kinds(segments: Segments, streams: Sequence[str] | None = None) -> dict[str, str]:
    """``{name: kind}`` of the named streams (all if ``None``) in ``segments``: each name's
    ``kind`` in the first segment that has it, from the columns."""
    return _first_kinds(segments._c, segments.rows, streams)


def release_pages(segments: Segments) -> None:
    """Unmap the manifest pages this process touched through ``segments`` (column reads touch
    every row); they stay usable (see :mod:`rayform.manifest._pagemap`)."""
    segments._c.release()
