"""One segment row of a manifest page, read from the page's column buffers directly.

pyarrow's ``table.slice(i, 1).to_pylist()`` is slow for one row of nested columns (it builds
converters for every nested field on each call; docs/benchmarks.md has the numbers), and a
shuffled epoch over a fleet slice builds one ``Segment`` per sample. :class:`PageRows` instead
reads just the bytes of row ``i`` from each column buffer (offsets, fixed-width values,
dictionary indices: about 25 small reads) and assembles the same dict as ``to_pylist``.

For a memory-mapped page the reads are ``os.pread`` calls on the page file (one descriptor per
page whose rows are read, opened on the first and closed with the page; ``pread`` takes its
offset as an argument, so threads and forked workers share it safely), not accesses to the
map: a mapped
access maps whole folios (up to 2 MiB) into the process, so reading rows through the map would
leave most of a fleet manifest resident in every DataLoader worker (or cost an unmap and a
refault per row). A page built in memory is read with ``ctypes.string_at``.

It accepts only pages of the page schema without nulls, which is
what the writer produces; anything else is read by pyarrow (:meth:`PageRows.of` returns ``None``).
"""

from __future__ import annotations

import ctypes
import os
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from rayform.errors import ManifestError
from rayform.manifest._model import TEXT_DTYPE, TEXT_TIMINGS, BlobRef, Segment, Stream
from rayform.manifest._rendcols import parse_cells
from rayform.manifest._schema import page_schema

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["PageRows", "Read", "segment_of_row"]

#: ``read(address, nbytes) -> bytes``: bytes at an address inside the page's buffers.
Read = Callable[[int, int], bytes]

_WORDS = ("name", "kind", "dtype", "units", "frame", "quantity", "codec")
_INTS = ("blob_size", "ts_size", "count", "t0_ns", "t1_ns", "gop")
_HASHES = ("blob_hash", "ts_hash")
#: The order of a stream row's keys in ``to_pylist`` (the page schema's field order).
_STREAM_KEYS = (
    "name",
    "kind",
    "blob_hash",
    "blob_size",
    "ts_hash",
    "ts_size",
    "rate_hz",
    "shape",
    "dtype",
    "count",
    "t0_ns",
    "t1_ns",
    "units",
    "frame",
    "quantity",
    "codec",
    "gop",
)
_RENDITION_INTS = ("blob_size", "height", "width")
_I32, _I64, _F64 = np.dtype("<i4"), np.dtype("<i8"), np.dtype("<f8")


def _memory(address: int, nbytes: int) -> bytes:
    return ctypes.string_at(address, nbytes)


class _Column:
    """Where element ``k`` of a fixed-width array (or its offsets) lies: ``address + k * width``."""

    def __init__(self, arr: pa.Array, buffer: int, width: int) -> None:
        self.address = arr.buffers()[buffer].address + arr.offset * width
        self.width = width


class PageRows:
    """Rows of one page (a ``pyarrow.Table`` of the page schema, one chunk per column).

    Args:
        page: the page's table.
        mapped_from: ``(path, start address)`` when the page's buffers lie in a memory map of
            that file (read with ``os.pread``); ``None`` reads them from memory.
    """

    def __init__(self, page: pa.Table, mapped_from: tuple[str, int] | None = None) -> None:
        self._file = mapped_from
        if mapped_from is not None:
            path, start = mapped_from
            fd = os.open(path, os.O_RDONLY)
            weakref.finalize(self, os.close, fd)
            self._read: Read = lambda address, nbytes: os.pread(fd, nbytes, address - start)
        else:
            self._read = _memory
        col = {name: page.column(name).chunks[0] for name in page.column_names}
        ids = col["id"]
        self._id_offsets = _Column(ids, 1, 4)
        self._id_data = ids.buffers()[2].address
        self._version, self._start, self._end = (
            _Column(col[k], 1, 8) for k in ("version", "start_ns", "end_ns")
        )
        self._site = self._words(col["site"])
        lists = col["streams"]
        self._stream_offsets = _Column(lists, 1, 4)
        values = lists.values  # offsets of ``lists`` index into it from its start
        self._word_cols = {k: self._words(values.field(k)) for k in _WORDS}
        self._int_cols = {k: _Column(values.field(k), 1, 8) for k in _INTS}
        self._rate = _Column(values.field("rate_hz"), 1, 8)
        self._hash_cols = {
            k: _Column(values.field(k), 1, values.field(k).type.byte_width) for k in _HASHES
        }
        shape = values.field("shape")
        self._shape_offsets, self._shape_values = _Column(shape, 1, 4), _Column(shape.values, 1, 8)
        # None where no stream row of the page lists a rendition (most pages): a row then
        # reads no renditions offset at all.
        self._renditions: tuple[_Column, _Column, dict[str, _Column]] | None = None
        lists = values.field("renditions")
        items = lists.values
        if len(items):
            self._renditions = (
                _Column(lists, 1, 4),
                _Column(items.field("blob_hash"), 1, 32),
                {k: _Column(items.field(k), 1, 8) for k in _RENDITION_INTS},
            )

    @staticmethod
    def _words(arr: pa.DictionaryArray) -> tuple[_Column, list[str]]:
        return _Column(arr.indices, 1, 4), [str(w) for w in arr.dictionary.to_pylist()]

    @classmethod
    def of(cls, page: pa.Table, mapped_from: tuple[str, int] | None = None) -> PageRows | None:
        """Rows of ``page``, or ``None`` if it is not a null-free single-chunk page of the
        dictionary-encoded page schema (then ``to_pylist`` reads it)."""
        if not page.schema.equals(page_schema()):
            return None
        for column in page.columns:
            if column.num_chunks != 1 or column.null_count:
                return None
        values = page.column("streams").chunks[0].values
        if (
            any(values.field(k).null_count for k in _STREAM_KEYS)
            or values.field("shape").values.null_count
        ):
            return None
        lists = values.field("renditions")
        items = lists.values
        if lists.null_count or any(
            items.field(k).null_count for k in ("blob_hash", *_RENDITION_INTS)
        ):
            return None
        return cls(page, mapped_from)

    def row(self, i: int) -> dict[str, Any]:
        """Row ``i`` of the page, as ``to_pylist`` gives it."""
        read = self._read

        def get(c: _Column, k: int, n: int, dtype: np.dtype) -> np.ndarray:
            return np.frombuffer(read(c.address + k * c.width, n * c.width), dtype=dtype)

        a, b = get(self._id_offsets, i, 2, _I32).tolist()
        r0, r1 = get(self._stream_offsets, i, 2, _I32).tolist()
        n = r1 - r0
        fields: dict[str, list[Any]] = {}
        for k, (codes, words) in self._word_cols.items():
            fields[k] = [words[c] for c in get(codes, r0, n, _I32).tolist()]
        for k, c in self._int_cols.items():
            fields[k] = get(c, r0, n, _I64).tolist()
        fields["rate_hz"] = get(self._rate, r0, n, _F64).tolist()
        for k, c in self._hash_cols.items():
            raw = read(c.address + r0 * c.width, n * c.width)
            fields[k] = [raw[j * c.width : (j + 1) * c.width] for j in range(n)]
        bounds = get(self._shape_offsets, r0, n + 1, _I32).tolist()
        dims = get(self._shape_values, bounds[0], bounds[-1] - bounds[0], _I64).tolist()
        fields["shape"] = [
            dims[s - bounds[0] : e - bounds[0]]
            for s, e in zip(bounds[:-1], bounds[1:], strict=True)
        ]
        streams = [{k: fields[k][j] for k in _STREAM_KEYS} for j in range(n)]
        if self._renditions is not None:
            offsets, hashes, ints = self._renditions
            bounds = get(offsets, r0, n + 1, _I32).tolist()
            first, m = bounds[0], bounds[-1] - bounds[0]
            raw = read(hashes.address + first * 32, m * 32)
            cols = {k: get(c, first, m, _I64).tolist() for k, c in ints.items()}
            items = [
                {
                    "blob_hash": raw[j * 32 : (j + 1) * 32],
                    **{k: cols[k][j] for k in _RENDITION_INTS},
                }
                for j in range(m)
            ]
            for j, stream in enumerate(streams):
                stream["renditions"] = items[bounds[j] - first : bounds[j + 1] - first]
        else:
            for stream in streams:
                stream["renditions"] = []
        site_codes, site_words = self._site
        return {
            "id": read(self._id_data + a, b - a).decode(),
            "version": int(get(self._version, i, 1, _I64)[0]),
            "site": site_words[int(get(site_codes, i, 1, _I32)[0])],
            "start_ns": int(get(self._start, i, 1, _I64)[0]),
            "end_ns": int(get(self._end, i, 1, _I64)[0]),
            "streams": streams,
        }


def segment_of_row(d: dict[str, Any]) -> Segment:
    """The :class:`Segment` of a page row (a dict as :meth:`PageRows.row` or pyarrow's
    ``to_pylist`` gives it).

    Raises:
        ManifestError: a video stream without a timestamps blob, or a table with one.
    """
    streams = {}
    for s in d["streams"]:
        ts = BlobRef(s["ts_hash"].hex(), int(s["ts_size"])) if any(s["ts_hash"]) else None
        if (ts is None) != (s["kind"] != "video"):  # the page checks cannot see this per row
            raise ManifestError(
                f"segment {d['id']} stream {s['name']}: a video stream needs a "
                "timestamps blob and a table or text stream has none"
            )
        where = f"segment {d['id']} stream {s['name']}"
        if (s["kind"] == "text") != (s["quantity"] in TEXT_TIMINGS) or (
            (s["kind"] == "text") != (s["dtype"] == TEXT_DTYPE)
        ):
            raise ManifestError(
                f"{where}: a text stream has dtype {TEXT_DTYPE!r} and a quantity of "
                f"{TEXT_TIMINGS}, and no other stream has either"
            )
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
