"""Turn recorded arrays and frames into segments, a manifest and a slice.

This is the Python API the demo generator and the ingesters use::

    store = Store("data/")
    b = SliceBuilder(store, description="pick and place, lab A")
    b.add_segment(
        "seg_0a1b2c3d", site="lab-a", version=1,
        streams=[
            VideoData("cam0/rgb", frames, t_ns, rate_hz=30),
            TableData("joints/position", t_ns, values, rate_hz=200, units="rad"),
        ],
    )
    manifest = b.commit("slc_7c1e04aa")

Blobs are written as segments are added; the manifest and the slice reference are written
only by :meth:`SliceBuilder.commit`, so an interrupted build never leaves a half-written slice.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from rayform.errors import InvalidArgumentError
from rayform.format import (
    PAGE_ROWS,
    ColumnarManifest,
    build_root,
    check_segment_id,
    check_slice_id,
    check_stream_name,
    encode_table,
    encode_text,
    encode_timestamps,
    segments_to_table,
    table_to_pages,
)
from rayform.manifest import (
    CARTESIAN_QUANTITIES,
    FRAME_CONVENTIONS,
    TEXT_DTYPE,
    TEXT_TIMINGS,
    Rendition,
    Segment,
    Stream,
)
from rayform_server._renditions import check_heights, keyframe_interval, render, rendition_sizes
from rayform_server._video import DEFAULT_CRF, DEFAULT_GOP, encode_video
from rayform_server.store import Store

__all__ = [
    "SliceBuilder",
    "TableData",
    "TextData",
    "VideoData",
    "commit_segments",
    "commit_table",
]


@dataclass
class VideoData:
    """A camera stream to encode.

    Attributes:
        name: stream name, e.g. ``"cam0/rgb"``.
        frames: frames ``(H, W, 3) uint8`` in capture order (an array ``(N, H, W, 3)`` or any
            iterable, so long recordings need not sit in memory).
        t_ns: capture time of each frame, ns, ``int64 (N,)`` strictly increasing.
        rate_hz: nominal rate in Hz.
        gop: keyframe interval in frames (``None``: the builder's ``gop``).
        crf: x264 quality.
        video_file: an already-encoded MP4 to store as is instead of encoding ``frames``
            (its frame ``i`` must be the ``i``-th capture and its frame rate constant);
            ``shape`` must then be given.
        shape: ``(H, W, 3)``, required with ``video_file``.
    """

    name: str
    frames: Iterable[np.ndarray] | None
    t_ns: np.ndarray
    rate_hz: float
    gop: int | None = None
    crf: int = DEFAULT_CRF
    video_file: str | os.PathLike[str] | None = None
    shape: tuple[int, int, int] | None = None
    codec: str = "h264"


@dataclass
class TableData:
    """A time-series stream.

    Attributes:
        name: stream name, e.g. ``"joints/position"``.
        t_ns: record times, ns, ``int64 (N,)`` strictly increasing.
        values: records ``(N, D)``.
        rate_hz: nominal rate in Hz.
        units: e.g. ``"rad"``.
        frame: for Cartesian streams, the convention they are stored in (``"ros"``/``"opencv"``).
        quantity: for Cartesian streams: ``"position"``, ``"quaternion"`` or ``"pose"``.
    """

    name: str
    t_ns: np.ndarray
    values: np.ndarray
    rate_hz: float
    units: str | None = None
    frame: str | None = None
    quantity: str | None = None


@dataclass
class TextData:
    """A text stream: timed strings (a task, subtasks, events).

    Attributes:
        name: stream name, e.g. ``"task"`` or ``"language/subtask"``.
        t_ns: record times, ns, ``int64 (N,)``, non-decreasing (events may share a time).
        records: ``N`` dicts with ``content`` and optionally ``role``, ``style``, ``camera``,
            ``tool_calls`` (``rayform.format.encode_text``).
        rate_hz: nominal rate in Hz (LeRobot's ``fps`` for per-frame tasks).
        timing: ``"state"`` (holds until the next record: tasks, subtasks, plans) or
            ``"events"`` (only in the grid step it was emitted in: interjections, VQA).
    """

    name: str
    t_ns: np.ndarray
    records: Sequence[Mapping[str, object]]
    rate_hz: float
    timing: str = "state"


class SliceBuilder:
    """Accumulates segments, then commits them as one manifest and a slice reference.

    Args:
        store: the data root.
        description: the slice's description.
        gop: keyframe interval of the videos it encodes, in frames.
        renditions: heights in pixels (even) of smaller copies to store beside every camera
            video (``rayform_server._renditions``); a height at or above a video's own is
            skipped with a warning.
    """

    def __init__(
        self,
        store: Store,
        description: str = "",
        *,
        gop: int = DEFAULT_GOP,
        renditions: tuple[int, ...] = (),
    ) -> None:
        if gop < 1:
            raise InvalidArgumentError(
                f"gop (keyframe interval in frames) must be at least 1, got {gop}"
            )
        self.store = store
        self.description = description
        self.gop = gop
        self.renditions = check_heights(renditions)
        self.segments: list[Segment] = []

    def add_segment(
        self,
        segment_id: str,
        *,
        site: str,
        streams: Sequence[VideoData | TableData | TextData],
        version: int = 1,
    ) -> Segment:
        """Store a segment's blobs and remember it for :meth:`commit`.

        Raises:
            InvalidArgumentError: bad IDs, names, timestamps, shapes or conventions.
        """
        check_segment_id(segment_id)
        if any(s.id == segment_id for s in self.segments):
            raise InvalidArgumentError(f"segment {segment_id} was already added")
        if not streams:
            raise InvalidArgumentError(f"segment {segment_id} has no streams")
        built: dict[str, Stream] = {}
        for data in streams:
            check_stream_name(data.name)
            if data.name in built:
                raise InvalidArgumentError(f"segment {segment_id}: stream {data.name} given twice")
            t_ns = np.asarray(data.t_ns, dtype=np.int64)
            if t_ns.ndim != 1 or t_ns.size == 0:
                raise InvalidArgumentError(f"{data.name}: t_ns must be a non-empty 1-D array")
            if isinstance(data, TextData):
                built[data.name] = self._text(data, t_ns)
                continue
            if t_ns.size > 1 and not np.all(np.diff(t_ns) > 0):
                raise InvalidArgumentError(f"{data.name}: t_ns must be strictly increasing")
            if isinstance(data, VideoData):
                built[data.name] = self._video(data, t_ns)
            else:
                built[data.name] = self._table(data, t_ns)
        seg = Segment(
            id=segment_id,
            version=int(version),
            site=site,
            start_ns=min(s.t0_ns for s in built.values()),
            end_ns=max(s.t1_ns for s in built.values()),
            streams=built,
        )
        self.segments.append(seg)
        return seg

    def _video(self, data: VideoData, t_ns: np.ndarray) -> Stream:
        gop: int | None
        if data.video_file is not None:
            if data.shape is None:
                raise InvalidArgumentError(f"{data.name}: shape is required with video_file")
            gop = data.gop  # an MP4 stored as is keeps its keyframe interval (None: unknown)
            ref = self.store.put_file(data.video_file)
            count, shape = int(t_ns.size), tuple(data.shape)
            renditions = self._renditions(data, Path(data.video_file), shape, count, gop)
        else:
            if data.frames is None:
                raise InvalidArgumentError(f"{data.name}: give the frames or an encoded video_file")
            gop = data.gop if data.gop is not None else self.gop
            fd, tmp = tempfile.mkstemp(dir=self.store.root / "tmp", suffix=".mp4")
            os.close(fd)
            try:
                count, h, w = encode_video(
                    data.frames, tmp, rate_hz=data.rate_hz, gop=gop, crf=data.crf
                )
                # Rendered from the local file, before it moves into the store (maybe S3).
                renditions = self._renditions(data, Path(tmp), (h, w, 3), count, gop)
                ref = self.store.put_file(tmp, move=True)
            finally:
                Path(tmp).unlink(missing_ok=True)
            shape = (h, w, 3)
            if count != t_ns.size:
                raise InvalidArgumentError(
                    f"{data.name}: {count} frames but {t_ns.size} timestamps"
                )
        ts = self.store.put_bytes(encode_timestamps(t_ns))
        return Stream(
            name=data.name,
            kind="video",
            blob=ref,
            timestamps=ts,
            rate_hz=float(data.rate_hz),
            shape=shape,
            dtype="uint8",
            count=count,
            t0_ns=int(t_ns[0]),
            t1_ns=int(t_ns[-1]),
            codec=data.codec,
            gop=gop,
            renditions=renditions,
        )

    def _renditions(
        self, data: VideoData, original: Path, shape: tuple[int, ...], count: int, gop: int | None
    ) -> tuple[Rendition, ...]:
        """Render, store and list the builder's renditions of the local video ``original``."""
        sizes = rendition_sizes(shape[0], shape[1], self.renditions, data.name)
        if not sizes:
            return ()
        # Structured like the original: its keyframe interval (read from the file when it was
        # stored as is) and rate; frame i at i / rate_hz, as the original.
        gop = gop if gop is not None else keyframe_interval(original)
        out = []
        for size in sizes:
            fd, tmp = tempfile.mkstemp(dir=self.store.root / "tmp", suffix=".mp4")
            os.close(fd)
            try:
                render(
                    original,
                    size,
                    Path(tmp),
                    rate_hz=data.rate_hz,
                    gop=gop,
                    count=count,
                    name=data.name,
                )
                out.append(Rendition(self.store.put_file(tmp, move=True), *size))
            finally:
                Path(tmp).unlink(missing_ok=True)
        return tuple(out)

    def _table(self, data: TableData, t_ns: np.ndarray) -> Stream:
        values = np.asarray(data.values)
        if values.ndim == 1:
            values = values[:, None]
        if values.ndim != 2 or values.shape[0] != t_ns.size:
            raise InvalidArgumentError(
                f"{data.name}: values must be (N, D) with N={t_ns.size}, got {values.shape}"
            )
        if data.frame is not None and data.frame not in FRAME_CONVENTIONS:
            raise InvalidArgumentError(
                f"{data.name}: frame must be one of {FRAME_CONVENTIONS}, got {data.frame!r}"
            )
        if data.quantity is not None:
            want = CARTESIAN_QUANTITIES.get(data.quantity)
            if want is None or values.shape[1] != want or data.frame is None:
                raise InvalidArgumentError(
                    f"{data.name}: quantity {data.quantity!r} needs a frame convention and "
                    f"values of width {want}"
                )
        ref = self.store.put_bytes(encode_table(t_ns, values))
        return Stream(
            name=data.name,
            kind="table",
            blob=ref,
            rate_hz=float(data.rate_hz),
            shape=(int(values.shape[1]),),
            dtype=str(values.dtype),
            count=int(t_ns.size),
            t0_ns=int(t_ns[0]),
            t1_ns=int(t_ns[-1]),
            units=data.units,
            frame=data.frame,
            quantity=data.quantity,
        )

    def _text(self, data: TextData, t_ns: np.ndarray) -> Stream:
        if data.timing not in TEXT_TIMINGS:
            raise InvalidArgumentError(
                f"{data.name}: timing must be one of {TEXT_TIMINGS}, got {data.timing!r}"
            )
        ref = self.store.put_bytes(encode_text(t_ns, data.records))
        return Stream(
            name=data.name,
            kind="text",
            blob=ref,
            rate_hz=float(data.rate_hz),
            shape=(1,),
            dtype=TEXT_DTYPE,
            count=int(t_ns.size),
            t0_ns=int(t_ns[0]),
            t1_ns=int(t_ns[-1]),
            quantity=data.timing,
        )

    def commit(self, slice_id: str) -> ColumnarManifest:
        """Write the manifest and point ``slice_id`` at it. Returns the manifest.

        Args:
            slice_id: the slice to create or replace.
        """
        check_slice_id(slice_id)
        if not self.segments:
            raise InvalidArgumentError("a slice needs at least one segment")
        digest = commit_segments(self.store, self.segments, self.description)
        self.store.set_slice(slice_id, digest, self.description)
        return self.store.load_manifest(digest)


def commit_segments(store: Store, segments: Sequence[Segment], description: str) -> str:
    """Store ``segments`` as one manifest (pages first, root last); returns its hash. Points
    no slice at it.

    Args:
        store: the data root.
        segments: the manifest's segments, in order.
        description: the manifest's description.
    """
    return commit_table(store, segments_to_table(segments), description)


def commit_table(store: Store, table: object, description: str, page_rows: int = PAGE_ROWS) -> str:
    """Store a segment table (``pyarrow.Table`` of the page schema) as a manifest; returns
    its hash. Pages first, root last: a crash leaves no root naming a missing page."""
    pages = table_to_pages(table, page_rows)  # type: ignore[arg-type]
    return store.put_pages_and_root(build_root(table, pages, description, page_rows), pages)  # type: ignore[arg-type]
