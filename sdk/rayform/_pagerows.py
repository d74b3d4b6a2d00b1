"""One segment row of a manifest page, read from zero-copy views of the page's columns.

pyarrow's ``table.slice(i, 1).to_pylist()`` costs about 190 us for a segment of five streams
(it builds converters for every nested field on each call), and a shuffled epoch over a fleet
slice builds one ``Segment`` per sample. :class:`PageRows` instead keeps numpy views of the
page's buffers (offsets, fixed-width values, dictionary indices; nothing is copied, and only
the bytes of the rows read are touched) and assembles the same dict as ``to_pylist`` in a few
microseconds. It accepts only pages of the v2 page schema without nulls, which is what the
writer produces; anything else is read by pyarrow (:func:`PageRows.of` returns ``None``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["PageRows"]

_WORDS = ("name", "kind", "dtype", "units", "frame", "quantity", "codec")
_INTS = ("blob_size", "ts_size", "count", "t0_ns", "t1_ns", "gop")
_HASHES = ("blob_hash", "ts_hash")
#: The order of a stream row's keys in ``to_pylist`` (the page schema's field order).
_STREAM_KEYS = ("name", "kind", "blob_hash", "blob_size", "ts_hash", "ts_size", "rate_hz", "shape", "dtype",
                "count", "t0_ns", "t1_ns", "units", "frame", "quantity", "codec", "gop")


def _fixed(arr: Any, dtype: str) -> np.ndarray:
    """A numpy view of a fixed-width array's values (its offset applied)."""
    dt = np.dtype(dtype)
    return np.frombuffer(arr.buffers()[1], dtype=dt, count=len(arr) + arr.offset)[arr.offset:]


def _offsets(arr: Any) -> np.ndarray:
    """The ``int32`` offsets of a list or string array (``len + 1``, its offset applied)."""
    return np.frombuffer(arr.buffers()[1], dtype=np.int32, count=len(arr) + arr.offset + 1)[arr.offset:]


class _Words:
    """A dictionary-encoded string column: indices (a view) into a few Python strings."""

    def __init__(self, arr: Any) -> None:
        self.codes = _fixed(arr.indices, "int32")
        self.words = [str(w) for w in arr.dictionary.to_pylist()]

    def __getitem__(self, i: int) -> str:
        return self.words[int(self.codes[i])]


class PageRows:
    """Rows of one page (a ``pyarrow.Table`` of the v2 page schema, one chunk per column)."""

    def __init__(self, page: Any) -> None:
        col = {name: page.column(name).chunks[0] for name in page.column_names}
        ids = col["id"]
        self._id_offsets, self._id_data = _offsets(ids), ids.buffers()[2]
        self._version = _fixed(col["version"], "int64")
        self._start, self._end = _fixed(col["start_ns"], "int64"), _fixed(col["end_ns"], "int64")
        self._site = _Words(col["site"])
        lists = col["streams"]
        self._stream_offsets = _offsets(lists)
        values = lists.values
        self._words = {k: _Words(values.field(k)) for k in _WORDS}
        self._ints = {k: _fixed(values.field(k), "int64") for k in _INTS}
        self._rate = _fixed(values.field("rate_hz"), "float64")
        self._hashes = {k: self._hash_view(values.field(k)) for k in _HASHES}
        shape = values.field("shape")
        self._shape_offsets, self._shape_values = _offsets(shape), _fixed(shape.values, "int64")

    @staticmethod
    def _hash_view(arr: Any) -> np.ndarray:
        width = arr.type.byte_width
        raw = np.frombuffer(arr.buffers()[1], dtype=np.uint8, count=(len(arr) + arr.offset) * width)
        return raw[arr.offset * width:].reshape(len(arr), width)

    @classmethod
    def of(cls, page: Any) -> PageRows | None:
        """Fast rows for ``page``, or ``None`` if it is not a null-free single-chunk page of
        the dictionary-encoded page schema (then ``to_pylist`` reads it)."""
        from rayform._columnar import page_schema

        if not page.schema.equals(page_schema()):
            return None
        for column in page.columns:
            if column.num_chunks != 1 or column.null_count:
                return None
        values = page.column("streams").chunks[0].values
        if any(values.field(k).null_count for k in _STREAM_KEYS) or values.field("shape").values.null_count:
            return None
        return cls(page)

    def row(self, i: int) -> dict[str, Any]:
        """Row ``i`` of the page as ``to_pylist`` gives it."""
        a, b = int(self._id_offsets[i]), int(self._id_offsets[i + 1])
        streams = []
        for r in range(int(self._stream_offsets[i]), int(self._stream_offsets[i + 1])):
            s0, s1 = int(self._shape_offsets[r]), int(self._shape_offsets[r + 1])
            value: dict[str, Any] = {
                "blob_hash": self._hashes["blob_hash"][r].tobytes(),
                "ts_hash": self._hashes["ts_hash"][r].tobytes(),
                "rate_hz": float(self._rate[r]),
                "shape": [int(x) for x in self._shape_values[s0:s1]],
            }
            value.update((k, self._words[k][r]) for k in _WORDS)
            value.update((k, int(self._ints[k][r])) for k in _INTS)
            streams.append({k: value[k] for k in _STREAM_KEYS})
        return {"id": self._id_data[a:b].to_pybytes().decode(), "version": int(self._version[i]),
                "site": self._site[i], "start_ns": int(self._start[i]), "end_ns": int(self._end[i]),
                "streams": streams}
