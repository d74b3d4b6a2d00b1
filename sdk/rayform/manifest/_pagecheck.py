"""Checks of a manifest's root and pages against what the rest of the SDK assumes.

A page's bytes match its hash, but the server chose them: a correctly hashed page may still
hold a dictionary index out of range, invalid UTF-8, an offset past its buffer, a body that
the Arrow reader decompressed into memory (so its buffers are not in the file the fast row
reader reads with ``pread``), a negative size or a non-finite rate. Everything is checked once,
when the manifest is opened, so that nothing later (``dataset[i]``, ``slice.blobs()``) can
fail with an ``IndexError`` or ``UnicodeDecodeError``: the checks are whole-column reductions
(Arrow's own full validation, min/max), a few tens of milliseconds for 1,000,000 segments.

Both raise :class:`~rayform.errors.ManifestError` naming the field; values from the server
appear in messages only through :func:`~rayform._untrusted.shown`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from rayform._ids import HASH_RE, STREAM_NAME_RE
from rayform._untrusted import JSON, shown
from rayform.errors import ManifestError
from rayform.manifest._arrow import load as pyarrow
from rayform.manifest._model import (
    CARTESIAN_QUANTITIES,
    DTYPE_RE,
    FRAME_CONVENTIONS,
    INT64_MAX,
    MAX_MANIFEST_BYTES,
    MAX_WORD_CHARS,
    SHAPE_RULE,
    STREAM_KINDS,
    TEXT_TIMINGS,
    TIME_MAX,
    TIME_MIN,
)
from rayform.manifest._rendcols import check_renditions

if TYPE_CHECKING:
    import pyarrow as pa
    from typing_extensions import TypeIs

__all__ = ["MAX_PAGE_BYTES", "check_page", "check_root", "check_stream_names"]

#: The most bytes one page may take (pages of the default 16,384 rows take ~15 MB).
MAX_PAGE_BYTES = 2 * MAX_MANIFEST_BYTES
#: Pages one root may list (1,000,000 segments take 62).
_MAX_PAGES = 100_000
_INT_FIELDS = {  # stream-row field: (lowest, highest) allowed
    "blob_size": (0, INT64_MAX),
    "ts_size": (0, INT64_MAX),
    "count": (1, INT64_MAX),
    "gop": (0, INT64_MAX),
}


def _is_int(value: JSON, low: int = TIME_MIN, high: int = INT64_MAX) -> TypeIs[int]:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def _bad(field: str, value: JSON, expected: str) -> ManifestError:
    return ManifestError(f"manifest root: {field} is {shown(repr(value), 80)}, expected {expected}")


def check_root(doc: JSON) -> None:
    """Check a root document's page references and summary (types and ranges).

    Raises:
        ManifestError: the first field that breaks the root's schema.
    """
    if not isinstance(doc, dict):
        raise _bad("the document", type(doc).__name__, "an object")
    pages = doc.get("pages")
    if not isinstance(pages, list) or not 0 < len(pages) <= _MAX_PAGES:
        raise _bad('"pages"', type(pages).__name__, f"a list of 1 to {_MAX_PAGES} page references")
    listed = 0  # segments the pages hold
    seen: dict[str, int] = {}  # hash -> first page listing it
    for i, p in enumerate(pages):
        if not isinstance(p, dict):
            raise _bad(f"page reference {i}", p, "an object")
        digest, count = p.get("hash"), p.get("segments")
        if not isinstance(digest, str) or not HASH_RE.fullmatch(digest):
            raise _bad(f"page {i} hash", digest, "64 lowercase hex digits")
        # One page twice would hold its segments twice; refused before anything is fetched
        # (a root listing one hash 100,000 times would otherwise be 100,000 requests).
        if seen.setdefault(digest, i) != i:
            raise _bad(f"page {i} hash", digest, f"a page not listed before (page {seen[digest]})")
        if not _is_int(p.get("size"), 1, MAX_PAGE_BYTES):
            raise _bad(f"page {i} size", p.get("size"), f"a byte count from 1 to {MAX_PAGE_BYTES}")
        if not _is_int(count, 0, 2**31 - 1):
            raise _bad(f"page {i} segments", count, "a segment count")
        listed += count
    if not isinstance(doc.get("description", ""), str):
        raise _bad('"description"', doc.get("description"), "a string")
    summary = doc.get("summary")
    if not isinstance(summary, dict):
        raise _bad('"summary"', type(summary).__name__, "an object")
    for key, low in (
        ("segments", 0),
        ("start_ns", TIME_MIN),
        ("end_ns", TIME_MIN),
        ("duration_ns", 0),
        ("nbytes", 0),
    ):
        required = key in ("segments", "nbytes")
        if (required or key in summary) and not _is_int(summary.get(key), low):
            raise _bad(f"summary.{key}", summary.get(key), "an integer")
    if summary["segments"] != listed:
        raise _bad("summary.segments", summary["segments"], "the sum of the pages' segments")
    sites = summary.get("sites", [])
    if not isinstance(sites, list) or not all(
        isinstance(s, str) and len(s) <= MAX_WORD_CHARS for s in sites
    ):
        raise _bad("summary.sites", sites, "a list of site names")
    streams = summary.get("streams")
    if not isinstance(streams, dict):
        raise _bad("summary.streams", type(streams).__name__, "an object")
    for name, info in streams.items():
        _check_stream_summary(name, info)


def _check_stream_summary(name: str, info: JSON) -> None:
    if not STREAM_NAME_RE.fullmatch(name) or ".." in name:
        raise _bad("a summary stream name", name, "a stream name such as 'cam0/rgb'")
    where = f"summary.streams[{name}]"
    if not isinstance(info, dict):
        raise _bad(where, info, "an object")
    if info.get("kind") not in STREAM_KINDS:
        raise _bad(f"{where}.kind", info.get("kind"), f"one of {STREAM_KINDS}")
    rate = info.get("rate_hz", 1.0)
    if (
        isinstance(rate, bool)
        or not isinstance(rate, (int, float))
        or not (math.isfinite(rate) and rate > 0)
    ):
        raise _bad(f"{where}.rate_hz", rate, "a positive number")
    shape = info.get("shape", [])
    if (
        not isinstance(shape, list)
        or len(shape) > 8
        or not all(_is_int(x, 0, 2**31 - 1) for x in shape)
    ):
        raise _bad(f"{where}.shape", shape, "a list of at most 8 sizes")
    dtype = info.get("dtype", "float32")
    if not isinstance(dtype, str) or not DTYPE_RE.fullmatch(dtype):
        raise _bad(f"{where}.dtype", dtype, "a numpy type name")
    for key in ("units", "frame", "quantity", "codec"):
        value = info.get(key, "")
        if not isinstance(value, str) or len(value) > MAX_WORD_CHARS:
            raise _bad(f"{where}.{key}", value, "a string")
    if not _is_int(info.get("segments", 0), 0):
        raise _bad(f"{where}.segments", info.get("segments"), "a segment count")


def _words(arr: pa.Array, field: str, ok: Callable[[str], bool]) -> None:
    """Check a dictionary-encoded column: its indices within its dictionary (valid UTF-8),
    and every word with ``ok(word)``."""
    try:
        arr.dictionary.validate(full=True)  # a few words: UTF-8 and offsets
    except pyarrow().ArrowException as exc:
        raise ManifestError(
            f"manifest page: the {field} dictionary is invalid: {shown(exc)}"
        ) from None
    codes = _fixed(arr.indices, np.int32).view(np.uint32)  # one pass: negatives are huge here
    if len(codes) and int(codes.max()) >= len(arr.dictionary):
        raise ManifestError(f"manifest page: a {field} index lies outside its dictionary")
    for word in arr.dictionary.to_pylist():
        if not ok(word):
            raise ManifestError(f"manifest page: {field} {shown(repr(word), 80)} is not allowed")


def _fixed(arr: pa.Array, dtype: type) -> np.ndarray:
    """The values of a fixed-width array (no copy; its buffer's size is checked by
    ``validate``)."""
    width = np.dtype(dtype).itemsize
    return np.frombuffer(arr.buffers()[1], dtype=dtype, count=len(arr), offset=arr.offset * width)


def _offsets(arr: pa.Array, child_len: int, field: str) -> int:
    """Check that the offsets of a string or list array never decrease and stay within the
    child; returns the longest element."""
    offs = np.frombuffer(
        arr.buffers()[1], dtype=np.int32, count=len(arr) + 1, offset=arr.offset * 4
    )
    lengths = np.diff(offs)
    if offs[0] < 0 or offs[-1] > child_len or (len(lengths) and int(lengths.min()) < 0):
        raise ManifestError(f"manifest page: the {field} offsets are out of order or out of range")
    return int(lengths.max()) if len(lengths) else 0


def _within(values: np.ndarray, field: str, low: float, high: float) -> None:
    if low == 0 and len(values):  # one pass: negatives are huge as unsigned
        if int(values.view(np.uint64).max()) > high:
            raise ManifestError(
                f"manifest page: {field} ranges from {values.min()} to {values.max()}, "
                f"allowed are {low} to {high}"
            )
        return
    if len(values) and not (low <= values.min() and values.max() <= high):
        raise ManifestError(
            f"manifest page: {field} ranges from {values.min()} to {values.max()}, "
            f"allowed are {low} to {high}"
        )


def check_page(table: pa.Table, span: tuple[int, int]) -> None:
    """Check one page (a table of the page schema, its schema already checked) in full.

    Arrow's own full validation reads every value (~0.3 s for 1,000,000 segments); this reads
    only what can break a reader: offsets, dictionary indices, ranges, and the dictionaries'
    UTF-8 (segment IDs are checked as ASCII by the caller's ID pattern).

    Args:
        table: the page as mapped.
        span: ``(address, size)`` of the page's file in memory: every buffer must lie inside
            (a compressed page's buffers would not, and the row reader reads the file).

    Raises:
        ManifestError: invalid Arrow data, a value out of range, or a buffer outside the file.
    """
    pa = pyarrow()
    try:
        table.validate()  # buffer sizes against lengths: what the views below rely on
    except pa.ArrowException as exc:
        raise ManifestError(f"manifest page holds invalid Arrow data: {shown(exc)}") from None
    base, size = span
    for column in table.columns:
        if column.num_chunks != 1:
            raise ManifestError("manifest page: a column is split into several record batches")
        for arr in _with_dictionaries(column.chunks[0]):
            for buf in arr.buffers():
                if (
                    buf is not None
                    and buf.size
                    and not base <= buf.address <= base + size - buf.size
                ):
                    raise ManifestError(
                        "manifest page holds a buffer outside its file (a compressed "
                        "Arrow IPC file?): pages are written uncompressed"
                    )
    ids = table.column("id").chunks[0]
    _offsets(ids, ids.buffers()[2].size if ids.buffers()[2] is not None else 0, "segment ID")
    _within(_fixed(table.column("version").chunks[0], np.int64), "segment version", 1, INT64_MAX)
    for key in ("start_ns", "end_ns"):
        _within(_fixed(table.column(key).chunks[0], np.int64), key, TIME_MIN, TIME_MAX)
    _words(table.column("site").chunks[0], "site", lambda w: len(w) <= MAX_WORD_CHARS)
    lists = table.column("streams").chunks[0]
    values = lists.values
    _offsets(lists, len(values), "stream list")
    for name, (low, high) in _INT_FIELDS.items():
        _within(_fixed(values.field(name), np.int64), name, low, high)
    rate = _fixed(values.field("rate_hz"), np.float64)
    if len(rate) and not bool(((rate > 0) & (rate < np.inf)).all()):
        raise ManifestError("manifest page: a stream's rate_hz is not a positive finite number")
    # t0 >= TIME_MIN, t1 <= TIME_MAX and t1 >= t0 bound both: three passes, not five.
    t0, t1 = _fixed(values.field("t0_ns"), np.int64), _fixed(values.field("t1_ns"), np.int64)
    if len(t0) and not (int(t0.min()) >= TIME_MIN and int(t1.max()) <= TIME_MAX):
        raise ManifestError(
            f"manifest page: a stream's t0_ns/t1_ns lies outside {TIME_MIN} to {TIME_MAX}"
        )
    if not bool((t1 >= t0).all()):
        raise ManifestError("manifest page: a stream ends (t1_ns) before it starts (t0_ns)")
    shape = values.field("shape")
    if _offsets(shape, len(shape.values), "shape") > 8:
        raise ManifestError("manifest page: a stream's shape has more than 8 dimensions")
    _within(_fixed(shape.values, np.int64), "shape", 0, 2**31 - 1)
    _words(values.field("kind"), "kind", lambda w: w in STREAM_KINDS)
    _check_shapes(values.field("kind"), shape)
    _words(
        values.field("name"), "name", lambda w: bool(STREAM_NAME_RE.fullmatch(w)) and ".." not in w
    )
    _words(values.field("dtype"), "dtype", lambda w: bool(DTYPE_RE.fullmatch(w)))
    _words(values.field("frame"), "frame", lambda w: w in ("", *FRAME_CONVENTIONS))
    _words(
        values.field("quantity"),
        "quantity",
        lambda w: w in ("", *CARTESIAN_QUANTITIES, *TEXT_TIMINGS),
    )
    for field in ("units", "codec"):
        _words(values.field(field), field, lambda w: len(w) <= MAX_WORD_CHARS)
    check_renditions(values, _fixed, _offsets, _within)


def _check_shapes(kinds: pa.Array, shape: pa.Array) -> None:
    """Every video row's shape is ``[H, W, C]`` with sizes >= 1, every text row's is ``[1]``,
    every table row's has a dimension (what a dataset reads a frame or a row as): vectorised over the rows."""
    words = kinds.dictionary.to_pylist()
    codes = _fixed(kinds.indices, np.int32)
    is_video = codes == (words.index("video") if "video" in words else -1)
    is_text = codes == (words.index("text") if "text" in words else -1)
    offs = np.frombuffer(
        shape.buffers()[1], dtype=np.int32, count=len(shape) + 1, offset=shape.offset * 4
    )
    lengths = np.diff(offs)
    for kind, rows in (("video", is_video), ("text", is_text), ("table", ~(is_video | is_text))):
        dims = lengths[rows]
        bad = dims != 3 if kind == "video" else dims != 1 if kind == "text" else dims < 1
        if kind != "table" and len(dims) and not bad.any():
            starts = offs[:-1][rows]
            sizes = _fixed(shape.values, np.int64)[starts[:, None] + np.arange(int(dims[0]))]
            bad = (sizes < 1).any(axis=1) if kind == "video" else (sizes != 1).any(axis=1)
        if bad.any():
            raise ManifestError(f"manifest page: {SHAPE_RULE[kind]}")


def check_stream_names(tables: list[Any], doc: dict[str, Any]) -> None:
    """The root's ``summary.streams`` names exactly the streams the pages hold (what a slice
    lists comes from the summary, what a dataset reads from the pages).

    Raises:
        ManifestError: the two differ.
    """
    held: set[str] = set()
    for table in tables:
        held.update(table.column("streams").chunks[0].values.field("name").dictionary.to_pylist())
    listed = set(doc["summary"]["streams"])
    if held != listed:
        raise ManifestError(
            f"manifest root: summary.streams lists {shown(sorted(listed), 200)}, the pages "
            f"hold {shown(sorted(held), 200)}"
        )


def _with_dictionaries(arr: pa.Array) -> list[Any]:
    """``arr`` and the dictionaries of its dictionary-encoded children (``buffers()`` omits
    them)."""
    pa = pyarrow()
    out = [arr]
    t = arr.type
    if pa.types.is_dictionary(t):
        out.append(arr.dictionary)
    elif pa.types.is_list(t):
        out += _with_dictionaries(arr.values)[1:]
    elif pa.types.is_struct(t):
        for i in range(t.num_fields):
            out += _with_dictionaries(arr.field(i))[1:]
    return out
