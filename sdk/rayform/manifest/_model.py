"""The manifest's records: segments (episodes), their streams and blobs, in memory.

A manifest lists segments; each segment lists its streams. On the wire and on disk it is one
format (``rayform.manifest``, ``format_version`` :data:`FORMAT_VERSION`: a canonical-JSON root
listing Arrow pages, ``rayform.manifest._columnar``); this module holds the records its pages
are read into (:class:`Segment`, :class:`Stream`, :class:`BlobRef`, :class:`Rendition`), the
in-memory :class:`Manifest` of a list of them, and their checks. See ``docs/manifest.md``.

All times are integers in nanoseconds; rates are in Hz.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from rayform import _html
from rayform._hashing import hash_bytes
from rayform._ids import HASH_RE, SEGMENT_ID_RE, STREAM_NAME_RE
from rayform._untrusted import loads, shown
from rayform.errors import ManifestError
from rayform.units import human_bytes

__all__ = [
    "FORMAT",
    "FORMAT_VERSION",
    "FRAME_CONVENTIONS",
    "MAX_MANIFEST_BYTES",
    "BlobRef",
    "Manifest",
    "Rendition",
    "Segment",
    "Stream",
    "TEXT_DTYPE",
    "TEXT_TIMINGS",
]

FORMAT = "rayform.manifest"
#: The one manifest format version read and written (older ones: ``rayform.manifest._legacy``).
FORMAT_VERSION = 3
STREAM_KINDS = ("video", "table", "text")
#: What a stream's shape must be, by kind (what a dataset reads a frame or row as).
SHAPE_RULE = {
    "video": "a video stream's shape is [height, width, channels], each at least 1",
    "table": "a table stream's shape has at least one dimension (a row of D values is [D])",
    "text": "a text stream's shape is [1] (one string per record)",
}
#: How a text stream's records are timed (its ``quantity``): a *state* (a task, a subtask, a
#: plan) holds from its time until the next record; an *event* (an interjection, a VQA turn)
#: exists only in the grid step it was emitted in.
TEXT_TIMINGS = ("state", "events")
#: A text stream's ``dtype``.
TEXT_DTYPE = "str"


def _shape_fits(kind: str, shape: tuple[int, ...]) -> bool:
    if kind == "video":
        return len(shape) == 3 and min(shape) >= 1
    if kind == "text":
        return shape == (1,)
    return len(shape) >= 1


#: Coordinate conventions a Cartesian stream may be stored in.
FRAME_CONVENTIONS = ("ros", "opencv")
#: What a Cartesian stream holds: position (x, y, z), quaternion (x, y, z, w), or pose
#: (x, y, z, qx, qy, qz, qw).
CARTESIAN_QUANTITIES = {"position": 3, "quaternion": 4, "pose": 7}
#: The most bytes a manifest root or one page may take; the client reads no more.
MAX_MANIFEST_BYTES = 64 * 2**20
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
#: Timestamps (ns) lie within +-2**62, so that any difference of two fits an int64.
TIME_MIN, TIME_MAX = -(2**62), 2**62
#: A numpy dtype name (``uint8``, ``float32``...); shown, never evaluated.
DTYPE_RE = re.compile(r"[a-z][a-z0-9_]{0,31}")
#: Free-form words (``units``, ``codec``, ``site``) longer than this break the schema.
MAX_WORD_CHARS = 256


@dataclass(frozen=True, slots=True)
class BlobRef:
    """A content-addressed blob: BLAKE3 hex digest and size in bytes."""

    hash: str
    size: int

    def to_json(self) -> dict[str, Any]:
        return {"hash": self.hash, "size": self.size}


@dataclass(frozen=True, slots=True)
class Rendition:
    """A smaller copy of a camera stream, stored at ingest: the same frames (count, order,
    timestamps blob and keyframe interval as the original), ``height`` x ``width`` pixels.

    Attributes:
        blob: the video file (H.264 in MP4, like the original).
        height: frame rows, even and below the original's.
        width: frame columns, even: the original's aspect ratio, rounded to even.
    """

    blob: BlobRef
    height: int
    width: int

    def to_json(self) -> dict[str, Any]:
        return {"blob": self.blob.to_json(), "height": self.height, "width": self.width}


@dataclass(frozen=True, slots=True)
class Stream:
    """One recorded stream of a segment.

    Attributes:
        name: e.g. ``"cam0/rgb"`` or ``"joints/position"``.
        kind: ``"video"`` (H.264 in MP4, frames ``(H, W, 3) uint8``), ``"table"``
            (time series, records ``(D,)``) or ``"text"`` (timed strings: a task, a subtask,
            events; shape ``[1]``, dtype ``"str"``, :func:`rayform.format.decode_text`).
        blob: the video file or the table blob.
        timestamps: video only: blob of per-frame presentation times (ns, int64).
        rate_hz: nominal rate in Hz (the real timestamps jitter around it).
        shape: shape of one record: ``[H, W, 3]`` for video, ``[D]`` for tables.
        dtype: numpy dtype name of one record (``"uint8"``, ``"float32"``, ...).
        count: number of records (frames or rows).
        t0_ns: timestamp of the first record, ns.
        t1_ns: timestamp of the last record, ns.
        units: e.g. ``"rad"``, ``"m"``; ``None`` if unitless.
        frame: coordinate convention of a Cartesian stream (``"ros"`` or ``"opencv"``),
            ``None`` for joint-space and image streams.
        quantity: for Cartesian streams: ``"position"``, ``"quaternion"`` or ``"pose"``;
            for text streams, how records are timed: ``"state"`` (in force until the next
            record) or ``"events"`` (only in the grid step they were emitted in).
        codec: video only, e.g. ``"h264"``.
        gop: video only: keyframe interval in frames.
        renditions: video only: smaller copies of the video, smallest first (an empty list in
            the pages, no key in :meth:`to_json`, when there are none). :meth:`blobs` lists the
            original only.
    """

    name: str
    kind: Literal["video", "table", "text"]
    blob: BlobRef
    rate_hz: float
    shape: tuple[int, ...]
    dtype: str
    count: int
    t0_ns: int
    t1_ns: int
    timestamps: BlobRef | None = None
    units: str | None = None
    frame: str | None = None
    quantity: str | None = None
    codec: str | None = None
    gop: int | None = None
    renditions: tuple[Rendition, ...] = ()

    def blobs(self) -> list[BlobRef]:
        """Every blob this stream needs (video + timestamps, or the table)."""
        return [self.blob] if self.timestamps is None else [self.blob, self.timestamps]

    @property
    def nbytes(self) -> int:
        """Total stored size in bytes."""
        return sum(b.size for b in self.blobs())

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "kind": self.kind,
            "blob": self.blob.to_json(),
            "rate_hz": self.rate_hz,
            "shape": list(self.shape),
            "dtype": self.dtype,
            "count": self.count,
            "t0_ns": self.t0_ns,
            "t1_ns": self.t1_ns,
        }
        for key in ("units", "frame", "quantity", "codec", "gop"):
            value = getattr(self, key)
            if value is not None:
                out[key] = value
        if self.timestamps is not None:
            out["timestamps"] = self.timestamps.to_json()
        if self.renditions:
            out["renditions"] = [r.to_json() for r in self.renditions]
        return out


@dataclass(frozen=True, slots=True)
class Segment:
    """One episode: an ID, a version, the site it was recorded at, and its streams.

    ``start_ns``/``end_ns`` bound every record of every stream (half-open is not implied:
    both are real record times).
    """

    id: str
    version: int
    site: str
    start_ns: int
    end_ns: int
    streams: dict[str, Stream] = field(default_factory=dict)

    @property
    def duration_s(self) -> float:
        return (self.end_ns - self.start_ns) / 1e9

    @property
    def nbytes(self) -> int:
        return sum(s.nbytes for s in self.streams.values())

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "version": self.version,
            "site": self.site,
            "start_ns": self.start_ns,
            "end_ns": self.end_ns,
            "streams": {name: s.to_json() for name, s in sorted(self.streams.items())},
        }

    def __repr__(self) -> str:
        # Short: the dataclass repr nests every Stream and BlobRef (~2,000 characters). The site
        # is free server text: escaped and cut, as the HTML repr escapes it.
        return (
            f"<Segment {self.id} version={self.version} site={shown(self.site, 80)} "
            f"start={_html.utc(self.start_ns)} duration={self.duration_s:.2f}s "
            f"streams=[{', '.join(sorted(self.streams))}] size={human_bytes(self.nbytes)}>"
        )

    def _repr_html_(self) -> str:
        facts = _html.kv_table(
            [
                ("version", self.version),
                ("site", self.site),
                ("start", _html.utc(self.start_ns)),
                ("end", _html.utc(self.end_ns)),
                ("duration", f"{self.duration_s:.3f} s"),
                ("size", human_bytes(self.nbytes)),
            ]
        )
        rows = [
            (
                name,
                st.kind,
                f"{st.rate_hz:g}",
                "x".join(map(str, st.shape)),
                st.dtype,
                st.count,
                f"{(st.t0_ns - self.start_ns) / 1e9:.3f}",
                f"{(st.t1_ns - self.start_ns) / 1e9:.3f}",
                human_bytes(st.nbytes),
                ", ".join(str(v) for v in (st.units, st.frame, st.quantity, st.codec) if v),
            )
            for name, st in sorted(self.streams.items())
        ]
        streams = _html.table(
            (
                "stream",
                "kind",
                "rate (Hz)",
                "shape",
                "dtype",
                "records",
                "first (s)",
                "last (s)",
                "size",
                "units, frame, quantity, codec",
            ),
            rows,
        )
        return _html.wrap(_html.header(f"Segment {self.id}"), facts, streams)


@dataclass(frozen=True, slots=True)
class Manifest:
    """Segments in memory, in slice order: what a manifest lists, before it is written as
    pages (``rayform.format.segments_to_table``) or after its pages are read
    (``ColumnarManifest.to_v1``)."""

    segments: tuple[Segment, ...]
    description: str = ""

    def to_json(self) -> dict[str, Any]:
        """The segments as JSON (``{"description", "segments"}``; ``from_json`` reads it)."""
        return {
            "description": self.description,
            "segments": [s.to_json() for s in self.segments],
        }

    def __repr__(self) -> str:
        # Short, as ColumnarManifest's: the dataclass repr listed every segment and the whole
        # description.
        return f"<Manifest segments={len(self.segments)}>"

    def blobs(self, streams: list[str] | None = None) -> dict[str, BlobRef]:
        """Unique blobs by hash, optionally only for the named streams."""
        out: dict[str, BlobRef] = {}
        for seg in self.segments:
            for name, stream in seg.streams.items():
                if streams is None or name in streams:
                    for ref in stream.blobs():
                        out[ref.hash] = ref
        return out

    def stream_names(self) -> list[str]:
        names: set[str] = set()
        for seg in self.segments:
            names.update(seg.streams)
        return sorted(names)

    @classmethod
    def from_json(cls, doc: Any) -> Manifest:
        """Segments from JSON (``{"description"?, "segments": [...]}``, as ``to_json``
        writes; other keys are ignored), each field checked.

        Raises:
            ManifestError: a field breaks the schema, or a segment is listed twice.
        """
        if not isinstance(doc, dict):
            raise ManifestError("manifest JSON must be an object with a segments list")
        try:
            if not isinstance(doc["segments"], list):
                raise ManifestError("manifest segments must be a list")
            segments = tuple(_parse_segment(s) for s in doc["segments"])
            description = doc.get("description", "")
            if not isinstance(description, str):
                raise ManifestError("manifest description must be a string")
        except ManifestError:
            raise
        except (KeyError, TypeError, ValueError, AttributeError, IndexError, OverflowError) as exc:
            raise ManifestError(
                f"manifest breaks the schema: {type(exc).__name__}: {shown(exc)}"
            ) from exc
        seen: set[str] = set()
        for seg in segments:
            if seg.id in seen:
                raise ManifestError(f"manifest lists segment {seg.id} twice")
            seen.add(seg.id)
        return cls(segments=segments, description=description)


def canonical_json(doc: Mapping[str, Any]) -> bytes:
    """UTF-8 JSON with sorted keys and no whitespace: the bytes that get hashed."""
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def _int(
    d: dict[str, Any], key: str, where: str, low: int = INT64_MIN, high: int = INT64_MAX
) -> int:
    """``d[key]``, an integer from ``low`` to ``high`` (an int64: numpy holds it later)."""
    value = d[key]
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ManifestError(
            f"{where}: {key} must be an integer from {low} to {high}, got {shown(repr(value), 40)}"
        )
    return value


def _word(value: object, key: str, where: str, optional: bool = True) -> str | None:
    """A short string (or ``None`` when ``optional``)."""
    if (value is None and optional) or (isinstance(value, str) and len(value) <= MAX_WORD_CHARS):
        return value
    raise ManifestError(
        f"{where}: {key} must be a string of at most {MAX_WORD_CHARS} characters, "
        f"got {shown(repr(value), 40)}"
    )


def _required_word(value: object, key: str, where: str) -> str:
    """A short string, never ``None``."""
    word = _word(value, key, where, optional=False)
    assert word is not None  # _word raised for None
    return word


def _parse_blob(d: Any, where: str) -> BlobRef:
    h = d["hash"]
    if not isinstance(h, str) or not HASH_RE.fullmatch(h):
        raise ManifestError(f"{where}: malformed blob hash {shown(repr(h), 80)}")
    return BlobRef(h, _int(d, "size", f"{where} blob", 0))


def _parse_stream(name: str, d: dict[str, Any], where: str) -> Stream:
    if not STREAM_NAME_RE.fullmatch(name) or ".." in name:
        raise ManifestError(f"{where}: malformed stream name {shown(repr(name), 80)}")
    where = f"{where} stream {name}"
    kind = d["kind"]
    if kind not in STREAM_KINDS:
        raise ManifestError(
            f"{where}: unknown kind {shown(repr(kind), 40)} (expected one of {STREAM_KINDS})"
        )
    timestamps = _parse_blob(d["timestamps"], where) if kind == "video" else None
    frame, quantity = d.get("frame"), d.get("quantity")
    if frame is not None and frame not in FRAME_CONVENTIONS:
        raise ManifestError(f"{where}: unknown frame convention {shown(repr(frame), 40)}")
    if kind == "text":
        if quantity not in TEXT_TIMINGS or frame is not None:
            raise ManifestError(
                f"{where}: a text stream's quantity is one of {TEXT_TIMINGS} and it has no "
                f"frame, got quantity {shown(repr(quantity), 40)}"
            )
    elif quantity is not None and quantity not in CARTESIAN_QUANTITIES:
        raise ManifestError(f"{where}: unknown Cartesian quantity {shown(repr(quantity), 40)}")
    dims = d["shape"]
    if not isinstance(dims, list) or len(dims) > 8:
        raise ManifestError(
            f"{where}: shape must be a list of at most 8 sizes, got {shown(repr(dims), 40)}"
        )
    shape = tuple(_int({"shape": x}, "shape", where, 0, 2**31 - 1) for x in dims)
    if not _shape_fits(kind, shape):
        raise ManifestError(f"{where}: {SHAPE_RULE[kind]}, got {shown(repr(list(shape)), 40)}")
    if kind != "text" and quantity is not None and shape != (CARTESIAN_QUANTITIES[quantity],):
        raise ManifestError(
            f"{where}: a {quantity} stream must have shape ({CARTESIAN_QUANTITIES[quantity]},)"
        )
    count = _int(d, "count", where, 1)
    t0, t1 = (
        _int(d, "t0_ns", where, TIME_MIN, TIME_MAX),
        _int(d, "t1_ns", where, TIME_MIN, TIME_MAX),
    )
    if count < 1 or t1 < t0:
        raise ManifestError(f"{where}: needs at least one record and t0_ns <= t1_ns")
    rate = d["rate_hz"]
    if (
        isinstance(rate, bool)
        or not isinstance(rate, (int, float))
        or not (math.isfinite(rate) and rate > 0)
    ):
        raise ManifestError(
            f"{where}: rate_hz must be a positive number, got {shown(repr(rate), 40)}"
        )
    dtype = d["dtype"]
    if not isinstance(dtype, str) or not DTYPE_RE.fullmatch(dtype):
        raise ManifestError(
            f"{where}: dtype must be a numpy type name such as 'float32', got {shown(repr(dtype), 40)}"
        )
    if (kind == "text") != (dtype == TEXT_DTYPE):
        raise ManifestError(f"{where}: dtype {TEXT_DTYPE!r} is for text streams, and only them")
    gop = d.get("gop")
    if gop is not None:
        gop = _int(d, "gop", where, 1)
    return Stream(
        name=name,
        kind=kind,
        blob=_parse_blob(d["blob"], where),
        rate_hz=float(rate),
        shape=shape,
        dtype=dtype,
        count=count,
        t0_ns=t0,
        t1_ns=t1,
        timestamps=timestamps,
        units=_word(d.get("units"), "units", where),
        frame=frame,
        quantity=quantity,
        codec=_word(d.get("codec"), "codec", where),
        gop=gop,
        renditions=_parse_renditions(d.get("renditions"), kind, shape, where),
    )


def _parse_renditions(
    d: Any, kind: str, shape: tuple[int, ...], where: str
) -> tuple[Rendition, ...]:
    if d is None:
        return ()
    if kind != "video" or not isinstance(d, list) or not d:
        raise ManifestError(f"{where}: renditions must be a non-empty list, on a video stream only")
    if len(d) > 16:
        raise ManifestError(f"{where}: at most 16 renditions per stream, got {len(d)}")
    out = []
    for item in d:
        h, w = (
            _int(item, "height", f"{where} rendition", 2, 2**31 - 1),
            _int(item, "width", f"{where} rendition", 2, 2**31 - 1),
        )
        height, width = shape[:2] if len(shape) == 3 else (0, 0)
        if not (h < height and w <= width and h % 2 == 0 and w % 2 == 0):
            raise ManifestError(
                f"{where}: rendition {w}x{h} must have even sides, below the original's {width}x{height}"
            )
        out.append(Rendition(_parse_blob(item["blob"], f"{where} rendition {w}x{h}"), h, w))
    if [r.height for r in out] != sorted({r.height for r in out}):
        raise ManifestError(f"{where}: renditions must be listed smallest first, one per height")
    return tuple(out)


def _parse_segment(d: dict[str, Any]) -> Segment:
    seg_id = d["id"]
    if not isinstance(seg_id, str) or not SEGMENT_ID_RE.fullmatch(seg_id):
        raise ManifestError(f"malformed segment ID {shown(repr(seg_id), 80)} in manifest")
    where = f"segment {seg_id}"
    version = _int(d, "version", where, 1)
    streams = {name: _parse_stream(name, s, where) for name, s in d["streams"].items()}
    return Segment(
        id=seg_id,
        version=version,
        site=_required_word(d["site"], "site", where),
        start_ns=_int(d, "start_ns", where, TIME_MIN, TIME_MAX),
        end_ns=_int(d, "end_ns", where, TIME_MIN, TIME_MAX),
        streams=streams,
    )


def parse_manifest_json(data: bytes, expected_hash: str | None) -> Any:
    """The JSON document of manifest bytes of any version, checked against ``expected_hash``.

    Raises:
        ManifestError: the bytes fail ``expected_hash`` or are not JSON.
    """
    if expected_hash is not None and hash_bytes(data) != expected_hash:
        raise ManifestError(
            f"manifest bytes do not match their hash {expected_hash[:12]}...: the copy is "
            "corrupt. Run `rayform cache verify` and fetch the slice again."
        )
    try:
        return loads(data)
    except ValueError as exc:  # also nesting, NaN/Infinity, oversized numbers
        raise ManifestError(f"manifest is not valid JSON: {exc}") from None
