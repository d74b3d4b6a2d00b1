"""What the viewer's page asks for, as JSON-able answers (no HTTP here).

Every argument arrives as text from a query string: it is validated here, and a bad one raises
:class:`ViewError` with the HTTP status the server answers with. Blobs are resolved through
the slice (its client's cache, fetched on demand when online), only for streams of segments of
this slice, so nothing else on disk or on the server can be asked for.
"""

from __future__ import annotations

import json
import re
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

import numpy as np

from rayform._ids import SEGMENT_ID_RE, STREAM_NAME_RE
from rayform.curation import Labels
from rayform.curation import parse_filter as text_filter
from rayform.errors import ConflictError, InvalidArgumentError, NotFoundError, OfflineError
from rayform.format import decode_table, decode_text, decode_timestamps
from rayform.manifest import Segment, Stream
from rayform.uri import selection_expression
from rayform.view._index import EpisodeFilter, EpisodeIndex

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from rayform._seams import ViewSource

__all__ = ["MAX_PAGE", "MAX_POINTS", "MAX_RECORDS", "ViewAPI", "ViewError", "dimension_names"]

#: Most episodes one list request returns.
MAX_PAGE = 500
#: Most points per table stream sent to a plot (longer tables are strided down to this).
MAX_POINTS = 4000
#: Most records of a text stream sent to the page (the first ones, in time order).
MAX_RECORDS = 2000
_SITE_RE = re.compile(r"\A[^\x00-\x1f\x7f]{1,256}\Z")  # free text, no control characters
_PREFIX_RE = re.compile(r"\A[a-z0-9_]{0,64}\Z")


class ViewError(Exception):
    """A request the viewer refuses; ``status`` is the HTTP status to answer with."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def _int(
    query: dict[str, str],
    name: str,
    default: int | None,
    lo: int | None = None,
    hi: int | None = None,
) -> int | None:
    text = query.get(name, "")
    if text == "":
        return default
    if not re.fullmatch(r"-?[0-9]{1,20}", text):
        raise ViewError(400, f"{name}={text!r} is not an integer")
    value = int(text)
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        raise ViewError(400, f"{name}={value} is out of range [{lo}, {hi}]")
    return value


def parse_filter(query: dict[str, str]) -> EpisodeFilter:
    """The list filter of a query string (``sites`` comma-separated, ``prefix``, ``start_ns``,
    ``end_ns``, ``where``: a text filter on episode fields and labels)."""
    # Each site percent-encoded, then joined by commas (a site name is free text).
    sites = tuple(unquote(s) for s in query.get("sites", "").split(",") if s)
    bad = [s for s in sites if not _SITE_RE.fullmatch(s)]
    if bad:
        raise ViewError(400, f"site {bad[0][:80]!r} is not a site name")
    prefix = query.get("prefix", "")
    if not _PREFIX_RE.fullmatch(prefix):
        raise ViewError(400, f"prefix {prefix[:80]!r}: use the start of a segment ID, e.g. seg_2a")
    where = query.get("where", "").strip()
    if where:
        try:
            where = text_filter(where).text
        except InvalidArgumentError as exc:
            raise ViewError(400, str(exc)) from None
    if where and prefix:
        raise ViewError(400, "filter with an ID prefix or with a filter, not both")
    return EpisodeFilter(
        tuple(sorted(set(sites))),
        prefix,
        _int(query, "start_ns", None),
        _int(query, "end_ns", None),
        where,
    )


@dataclass(frozen=True)
class BlobFile:
    """A verified blob on disk and how to serve it."""

    path: Path
    content_type: str


class ViewAPI:
    """The viewer's answers for one slice.

    Args:
        slice_: the :class:`~rayform.Slice` to show.
        frames: serve every camera as decoded JPEG frames instead of its video file.
    """

    def __init__(self, slice_: ViewSource, *, frames: bool = False) -> None:
        self.slice = slice_
        self.frames = frames
        self.index = EpisodeIndex(
            slice_.segments, self.labels, lambda ref: slice_.blob_path(ref).read_bytes()
        )
        self._lock = threading.Lock()  # Slice.segment builds and caches Segment objects

    def labels(self) -> Labels | None:
        """The slice's latest labels, or ``None`` if its source keeps none (or offline and
        never pulled)."""
        try:
            read = getattr(self.slice, "labels", None)
        except (InvalidArgumentError, NotFoundError, OfflineError):
            return None  # a slice read without a client, a server before labels, never pulled
        return read if isinstance(read, Labels) else None

    def label(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """``POST /api/label``: label one episode through the slice's client (its token must be
        a write token, docs/curation.md). The body is ``{"segment", "values": {key: value or
        null}, "kinds": {key: kind}}`` (``kinds`` optional: a new key's kind, e.g. text), or
        ``{"segment", "span": {"key", "t0_s", "t1_s", "name"}}`` to add a time range in
        seconds from the episode's start (the page's clock: a browser's numbers cannot hold ns
        since the epoch exactly), or ``{"segment", "unspan": {"key", "index"}}`` to remove
        one of a spans label's ranges (by its position in :meth:`episode`'s ``spans``)."""
        seg_id, values = body.get("segment"), body.get("values")
        if not isinstance(seg_id, str) or not SEGMENT_ID_RE.fullmatch(seg_id):
            raise ViewError(400, f"segment={str(seg_id)[:80]!r} is not a segment ID")
        if "span" in body or "unspan" in body:
            values = self._span_values(seg_id, body)
        if not isinstance(values, dict) or not values:
            raise ViewError(400, 'values: give {"key": value}, e.g. {"success": true}')
        kinds = body.get("kinds")
        if kinds is not None and not isinstance(kinds, dict):
            raise ViewError(400, 'kinds: give {"key": kind}, e.g. {"note": "text"}')
        write = getattr(self.slice, "label", None)
        if write is None:
            raise ViewError(400, "this slice keeps no labels (open it with rayform.Client)")
        try:
            with self._lock:
                labels = write(seg_id, kinds=kinds or None, **values)
        except ConflictError:
            raise  # answered 409, with its message: read again and decide
        except InvalidArgumentError as exc:
            raise ViewError(400, str(exc)) from None
        return {
            "segment": seg_id,
            "labels": labels[seg_id],
            "version": labels.version,
            "spans": self._spans_of(labels, seg_id),
        }

    def _span_values(self, seg_id: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """The ``values`` of a write that adds (``span``) or removes (``unspan``) a range."""
        seg = self._segment({"segment": seg_id})
        op = body.get("span") if "span" in body else body.get("unspan")
        key = op.get("key") if isinstance(op, dict) else None
        if not isinstance(key, str):
            raise ViewError(
                400, 'span: give {"key", "t0_s", "t1_s", "name"}; unspan: {"key", "index"}'
            )
        labels = self.labels()
        current = labels.spans(seg_id, key) if labels is not None else []
        assert isinstance(op, dict)
        if "span" in body:
            t0, t1, name = op.get("t0_s"), op.get("t1_s"), op.get("name")
            if not all(isinstance(t, (int, float)) and not isinstance(t, bool) for t in (t0, t1)):
                raise ViewError(400, f"span: t0_s={t0!r}, t1_s={t1!r}: give seconds from the start")
            lo, hi = sorted((float(t0), float(t1)))  # type: ignore[arg-type]  # checked above
            start = seg.start_ns + round(max(lo, 0.0) * 1e9)
            end = min(seg.start_ns + round(hi * 1e9), seg.end_ns + 1)
            spans: list[Any] = [*current, (start, end, name)]
        else:
            index = op.get("index")
            if not isinstance(index, int) or not 0 <= index < len(current):
                raise ViewError(400, f"unspan: index={index!r} is not one of {len(current)} ranges")
            spans = [s for i, s in enumerate(current) if i != index]
        return {key: [list(s) for s in spans] or None}

    def _spans_of(self, labels: Labels, seg_id: str) -> dict[str, list[list[Any]]]:
        """Each spans label of the episode: ``[[t0_s, t1_s, name], ...]`` from its start."""
        seg = self.slice.segment(seg_id)
        return {
            key: [[(a - seg.start_ns) / 1e9, (b - seg.start_ns) / 1e9, n] for a, b, n in
                  labels.spans(seg_id, key)]
            for key, kind in sorted(labels.kinds.items())
            if kind == "spans" and key in labels[seg_id]
        }  # fmt: skip

    # -- the slice and its list ------------------------------------------------------------
    def slice_info(self) -> dict[str, Any]:
        """ID, counts, sites, time range and streams of the slice."""
        t0, t1 = self.index.time_range()
        return {
            "id": self.slice.id,
            "manifest": self.slice.manifest_hash,
            "segments": len(self.index),
            "sites": self.index.site_list(),
            "start_ns": str(t0),
            "end_ns": str(t1),
            "streams": list(self.slice.streams),
            "frames": self.frames,
        }

    def episodes(self, query: dict[str, str]) -> dict[str, Any]:
        """One page of the filtered episode list (``offset``, ``limit`` and the filter)."""
        f = parse_filter(query)
        offset = _int(query, "offset", 0, 0, 10**12) or 0
        limit = _int(query, "limit", 50, 1, MAX_PAGE) or 50
        total, rows = self.index.page(f, offset, limit)
        return {"total": total, "offset": offset, "episodes": [_summary(s) for s in rows]}

    def selection(self, query: dict[str, str]) -> dict[str, Any]:
        """The ``slice_.select(...)`` call for a filter and marked episodes (``segments``,
        comma-separated), checked by running it on this slice."""
        f = parse_filter(query)
        marked = sorted({s for s in query.get("segments", "").split(",") if s})
        bad = [s for s in marked if not SEGMENT_ID_RE.fullmatch(s)]
        if bad:
            raise ViewError(400, f"{bad[0][:80]!r} is not a segment ID")
        kwargs: dict[str, Any] = {}
        if marked:
            kwargs["segments"] = marked
        if f.sites:
            kwargs["sites"] = list(f.sites)
        if f.start_ns is not None:
            kwargs["start_ns"] = f.start_ns
        if f.end_ns is not None:
            kwargs["end_ns"] = f.end_ns
        if f.where:
            kwargs["where"] = f.where
        prefix = f.prefix
        if not kwargs and not prefix:
            return {
                "code": "view = slice_  # no filter: the whole slice",
                # A view served as it is keeps its own selection (None for a whole slice).
                "expression": selection_expression(self.slice.selection),
                "count": len(self.index),
                "marked": 0,
            }
        if prefix:

            def where(c: dict[str, np.ndarray]) -> np.ndarray:
                return np.array([str(i).startswith(prefix) for i in c["id"]], dtype=bool)

            kwargs_run: dict[str, Any] = {**kwargs, "where": where}
        else:
            kwargs_run = kwargs
        try:
            with self._lock:
                view = self.slice.select(**kwargs_run)
        except (InvalidArgumentError, NotFoundError) as exc:
            raise ViewError(400, str(exc)) from exc
        args = [f"{k}={v!r}" for k, v in kwargs.items()]
        if prefix:
            args.append(f"where=lambda c: np.array([i.startswith({prefix!r}) for i in c['id']])")
        code = "view = slice_.select(" + ", ".join(args) + ")"
        if prefix:
            code = "import numpy as np\n" + code
        return {
            "code": code,
            "expression": selection_expression(view.selection),
            "count": len(view),
            "marked": len(marked),
        }

    # -- one episode -----------------------------------------------------------------------
    def _segment(self, query: dict[str, str]) -> Segment:
        seg_id = query.get("segment", "")
        if not SEGMENT_ID_RE.fullmatch(seg_id):
            raise ViewError(400, f"segment={seg_id[:80]!r} is not a segment ID, e.g. seg_0a1b2c3d")
        try:
            with self._lock:
                return self.slice.segment(seg_id)
        except NotFoundError as exc:
            raise ViewError(404, str(exc)) from exc

    def _stream(self, query: dict[str, str], kind: str) -> tuple[Segment, Stream]:
        seg = self._segment(query)
        name = query.get("stream", "")
        if not STREAM_NAME_RE.fullmatch(name):
            raise ViewError(400, f"stream={name[:80]!r} is not a stream name, e.g. cam0/rgb")
        stream = seg.streams.get(name)
        if stream is None:
            raise ViewError(
                404,
                f"segment {seg.id} has no stream {name!r}; it has {', '.join(sorted(seg.streams))}",
            )
        if stream.kind != kind:
            raise ViewError(400, f"stream {name!r} is a {stream.kind} stream, not a {kind} stream")
        return seg, stream

    def episode(self, query: dict[str, str]) -> dict[str, Any]:
        """Everything the episode view needs but the video bytes and the table values: per
        camera its per-frame capture times (seconds from the episode's start)."""
        seg = self._segment(query)
        streams = []
        for name, st in sorted(seg.streams.items()):
            doc: dict[str, Any] = {
                "name": name,
                "kind": st.kind,
                "rate_hz": st.rate_hz,
                "shape": list(st.shape),
                "count": st.count,
                "units": st.units,
                "t0_s": (st.t0_ns - seg.start_ns) / 1e9,
                "t1_s": (st.t1_ns - seg.start_ns) / 1e9,
            }
            if st.kind == "video":
                assert st.timestamps is not None
                t_ns = decode_timestamps(self.slice.blob_path(st.timestamps).read_bytes())
                doc["times"] = _seconds(t_ns, seg.start_ns)
                doc["codec"] = st.codec or "h264"
                doc["mode"] = "frames" if self.frames else "video"
            if st.kind == "text":
                doc["timing"] = st.quantity or "state"
            streams.append(doc)
        labels = self.labels()
        marks = (
            {
                "labels": labels[seg.id],
                "labels_version": labels.version,
                "spans": self._spans_of(labels, seg.id),
                "kinds": dict(labels.kinds),
            }
            if labels is not None
            else {}
        )
        return {**_summary(seg), "streams": streams, **marks}

    def table(self, query: dict[str, str]) -> dict[str, Any]:
        """A table stream's times (seconds from the episode's start) and values, strided down
        to at most :data:`MAX_POINTS` rows, and a name for each of its dimensions."""
        seg, st = self._stream(query, "table")
        t_ns, values = decode_table(self.slice.blob_path(st.blob).read_bytes(), f"table {st.name}")
        step = max(1, -(-len(t_ns) // MAX_POINTS))
        t_ns, values = (
            t_ns[::step],
            np.asarray(values[::step], dtype=np.float64).reshape(len(t_ns[::step]), -1),
        )
        values = np.where(np.isfinite(values), values, np.nan)
        rows = [[None if np.isnan(v) else round(float(v), 6) for v in row] for row in values]
        return {
            "name": st.name,
            "units": st.units,
            "times": _seconds(t_ns, seg.start_ns),
            "values": rows,
            "stride": step,
            "dims": dimension_names(st.quantity, values.shape[1]),
        }

    def text(self, query: dict[str, str]) -> dict[str, Any]:
        """A text stream's records: ``timing`` (``state``: each holds until the next, the page
        shows the one in force at the playhead; ``events``: marks on the timeline) and, per
        record, its time (seconds from the episode's start), ``content``, ``role`` and
        ``style``; at most :data:`MAX_RECORDS` (``truncated`` says when there were more)."""
        seg, st = self._stream(query, "text")
        t_ns, records = decode_text(self.slice.blob_path(st.blob).read_bytes(), st.t0_ns)
        times = _seconds(t_ns[:MAX_RECORDS], seg.start_ns)
        return {
            "name": st.name,
            "timing": st.quantity or "state",
            "records": [
                {"t_s": t, "content": r["content"], "role": r["role"], "style": r["style"]}
                for t, r in zip(times, records[:MAX_RECORDS], strict=True)
            ],
            "truncated": len(records) > MAX_RECORDS,
        }

    def video(self, query: dict[str, str]) -> BlobFile:
        """The MP4 file of a camera stream."""
        _, st = self._stream(query, "video")
        return BlobFile(self.slice.blob_path(st.blob), "video/mp4")

    def frame_source(self, query: dict[str, str]) -> tuple[Path, int, float]:
        """``(video file, frame index, rate_hz)`` of one frame asked for with ``i``."""
        _, st = self._stream(query, "video")
        i = _int(query, "i", None, 0, st.count - 1)
        if i is None:
            raise ViewError(400, "i= (the frame index) is required")
        return self.slice.blob_path(st.blob), i, st.rate_hz


#: The components of a Cartesian stream, by its manifest ``quantity`` (docs/manifest.md).
COMPONENTS = {
    "position": ("x", "y", "z"),
    "quaternion": ("qx", "qy", "qz", "qw"),
    "pose": ("x", "y", "z", "qx", "qy", "qz", "qw"),
}


def dimension_names(quantity: str | None, dims: int) -> list[str]:
    """A legend's name for each of a table's ``dims`` dimensions: the components of its
    Cartesian ``quantity`` where the manifest names one, else ``[0]``, ``[1]``, ... (the
    index a sample's vector has)."""
    names = COMPONENTS.get(quantity or "", ())
    return list(names) if len(names) == dims else [f"[{d}]" for d in range(dims)]


def _seconds(t_ns: np.ndarray, start_ns: int) -> list[float]:
    return [round(float(x), 6) for x in (np.asarray(t_ns, dtype=np.int64) - start_ns) / 1e9]


def _summary(seg: Segment) -> dict[str, Any]:
    # Times as strings: ns since 1970 do not fit a JavaScript number exactly.
    return {
        "id": seg.id,
        "version": seg.version,
        "site": seg.site,
        "start_ns": str(seg.start_ns),
        "end_ns": str(seg.end_ns),
        "duration_s": round(seg.duration_s, 3),
        "streams": {n: st.kind for n, st in sorted(seg.streams.items())},
    }


def dumps(doc: Mapping[str, Any] | Sequence[Any]) -> bytes:
    """Compact JSON bytes of an answer."""
    return json.dumps(doc, separators=(",", ":"), allow_nan=False).encode()
