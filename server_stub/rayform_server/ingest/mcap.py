"""Ingest ROS 2 bags recorded as MCAP into a slice: one segment per file.

* ``sensor_msgs/msg/Image`` and ``CompressedImage`` topics become video streams: every
  message's ``header.stamp`` is that frame's timestamp (frames sorted by stamp; a message
  whose stamp repeats an earlier one is dropped, with a message).
* ``sensor_msgs/msg/JointState`` fields (``position``, ``velocity``, ``effort``) become table
  streams (``float64 (D,)``, stamped by ``header.stamp``).
* ``geometry_msgs/msg/PoseStamped`` and ``TransformStamped`` become pose streams
  ``(x, y, z, qx, qy, qz, qw)`` with ``frame="ros"``, ``quantity="pose"``, units ``m``.
* ``std_msgs/msg/String`` topics become text streams (a *state*: an instruction holds until
  the next one). A String has no header, so each message is timed by its **log time** (when
  the recorder received it).
* ``task``: one text stream per file with one record, at the file's first record time.

Default stream names (``--stream NAME=TOPIC[:FIELD]`` replaces them; when any is given, only
the named topics are ingested): the topic without its leading ``/``, with trailing
``image_raw``/``image_color``/``image_rect``/``image``/``compressed`` words dropped from
image topics, then ``/rgb`` (``/cam_top/image_raw/compressed`` -> ``cam_top/rgb``); for
joint states ``TOPIC/FIELD`` for every non-empty field (``/joint_states`` ->
``joint_states/position``, ...); for poses and strings the topic (``/ee_pose`` -> ``ee_pose``,
``/instruction`` -> ``instruction``).
Characters outside ``[a-z0-9_.-]`` become ``_``.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from mcap.reader import make_reader
from mcap_ros2.decoder import DecoderFactory

from rayform.errors import InvalidArgumentError
from rayform.format import ColumnarManifest, check_slice_id, hash_file
from rayform_server._video import DEFAULT_GOP
from rayform_server.builder import TableData, TextData, VideoData
from rayform_server.ingest import _ros
from rayform_server.ingest._common import (
    Progress,
    SegmentInput,
    check_jobs,
    commit_segments,
    nominal_rate_hz,
    run_jobs,
    sanitize_stream_name,
    segment_id_for,
)
from rayform_server.staging import Shard
from rayform_server.store import Store

__all__ = ["default_stream_names", "ingest_mcap"]

_IMAGE_SUFFIXES = {
    "image_raw",
    "image_color",
    "image_rect",
    "image_rect_color",
    "image",
    "compressed",
}
_UNITS = {"position": "rad", "velocity": "rad/s", "effort": "N*m"}


@dataclass(frozen=True)
class _Pick:
    name: str
    topic: str
    kind: str  # image, compressed, joint, pose, transform
    field: str | None = None


def default_stream_names(topic: str, kind: str) -> list[tuple[str, str | None]]:
    """``[(stream name, field)]`` a topic of this kind gets without ``--stream``."""
    words = [w for w in topic.split("/") if w]
    if kind in ("image", "compressed"):
        while len(words) > 1 and words[-1].lower() in _IMAGE_SUFFIXES:
            words.pop()
        return [(sanitize_stream_name([*words, "rgb"]), None)]
    if kind == "joint":
        return [(sanitize_stream_name([*words, f]), f) for f in _ros.JOINT_FIELDS]
    return [(sanitize_stream_name(words), None)]


_MCAP_MAGIC = b"\x89MCAP0\r\n"


def _mcap_reason(path: Path, exc: Exception) -> str:
    """Why the MCAP reader gave up, in words: its own exceptions are often empty."""
    try:
        with path.open("rb") as f:
            head = f.read(len(_MCAP_MAGIC))
    except OSError as err:
        return str(err)
    if not head:
        return "the file is empty (0 bytes)"
    if not _MCAP_MAGIC.startswith(head) and not head.startswith(_MCAP_MAGIC):
        return f"it does not start with the MCAP magic bytes (it starts with {head!r})"
    text = str(exc).strip()
    return text or f"{type(exc).__name__} while reading the header (truncated file?)"


def _open(path: Path) -> tuple[Any, Any]:
    try:
        f = path.open("rb")
    except OSError as exc:
        raise InvalidArgumentError(f"cannot open {path}: {exc}") from exc
    try:
        reader = make_reader(f, decoder_factories=[DecoderFactory()])
        reader.get_header()
    except Exception as exc:  # mcap raises many types (McapError, struct.error, ...)
        f.close()
        raise InvalidArgumentError(
            f"{path} is not a readable MCAP file: {_mcap_reason(path, exc)}; "
            "pass complete ROS 2 .mcap bags"
        ) from exc
    return f, reader


def _topics(path: Path) -> dict[str, str]:
    """``{topic: schema name}`` of a file (from its summary, else by scanning it)."""
    f, reader = _open(path)
    with f:
        try:
            summary = reader.get_summary()
            if summary is not None and summary.channels:
                return {
                    ch.topic: summary.schemas[ch.schema_id].name
                    if ch.schema_id in summary.schemas
                    else ""
                    for ch in summary.channels.values()
                }
            return {ch.topic: sch.name if sch else "" for sch, ch, _ in reader.iter_messages()}
        except Exception as exc:
            raise InvalidArgumentError(f"{path}: cannot read the MCAP index: {exc}") from exc


def _picks(path: Path, topics: dict[str, str], chosen: dict[str, str] | None) -> list[_Pick]:
    listing = ", ".join(f"{t} ({s})" for t, s in sorted(topics.items())) or "none"
    if chosen:
        picks = []
        for name, source in chosen.items():
            topic, _, field = source.partition(":")
            if topic not in topics:
                raise InvalidArgumentError(
                    f"--stream {name}={source}: {path} has no topic {topic!r}. Its topics: {listing}"
                )
            kind = _ros.schema_kind(topics[topic])
            if kind is None:
                raise InvalidArgumentError(
                    f"--stream {name}={source}: topic {topic} has type {topics[topic]!r}, which cannot "
                    "be ingested (Image, CompressedImage, JointState, PoseStamped, TransformStamped, "
                    "String can)"
                )
            if kind == "joint" and field not in _ros.JOINT_FIELDS:
                raise InvalidArgumentError(
                    f"--stream {name}={source}: a JointState topic needs a field: "
                    + ", ".join(f"{topic}:{f}" for f in _ros.JOINT_FIELDS)
                )
            if kind != "joint" and field:
                raise InvalidArgumentError(
                    f"--stream {name}={source}: topic {topic} ({topics[topic]}) has no selectable fields"
                )
            picks.append(_Pick(name, topic, kind, field or None))
        return picks
    picks = []
    for topic, schema in sorted(topics.items()):
        kind = _ros.schema_kind(schema)
        if kind is not None:
            picks += [_Pick(n, topic, kind, fld) for n, fld in default_stream_names(topic, kind)]
    if not picks:
        raise InvalidArgumentError(
            f"{path} has no topic of a supported type. Its topics: {listing}"
        )
    names = [p.name for p in picks]
    for p in picks:
        if names.count(p.name) > 1:
            raise InvalidArgumentError(
                f"two topics map to stream {p.name!r}: name them with --stream NAME=TOPIC"
            )
    return picks


def _read(path: Path, picks: list[_Pick]) -> dict[str, list[tuple[int, Any]]]:
    """``{topic: [(stamp_ns, decoded message)]}`` in file order for the picked topics."""
    kinds = {p.topic: p.kind for p in picks}
    out: dict[str, list[tuple[int, Any]]] = {t: [] for t in kinds}
    f, reader = _open(path)
    with f:
        try:
            for _, channel, message, msg in reader.iter_decoded_messages(topics=list(kinds)):
                # A String has no header: its log time is the only time it has.
                stamp = message.log_time if kinds[channel.topic] == "string" else None
                out[channel.topic].append((_ros.stamp_ns(msg) if stamp is None else stamp, msg))
        except Exception as exc:
            raise InvalidArgumentError(f"{path}: cannot read its messages: {exc}") from exc
    return out


def _sorted_unique(
    path: Path, topic: str, items: list[tuple[int, Any]], progress: Progress
) -> list[tuple[int, Any]]:
    if not items:
        raise InvalidArgumentError(f"{path}: topic {topic} has no messages")
    items = sorted(items, key=lambda it: it[0])
    kept = [items[0]]
    for it in items[1:]:
        if it[0] != kept[-1][0]:
            kept.append(it)
    if len(kept) < len(items):
        progress(
            f"{path.name} {topic}: dropped {len(items) - len(kept)} message(s) whose time "
            "(header.stamp; a String's log time) repeats an earlier one"
        )
    return kept


def _frames(topic: str, kind: str, msgs: Sequence[Any]) -> Iterator[np.ndarray]:
    size = None
    for i, msg in enumerate(msgs):
        img = _ros.image_rgb(msg) if kind == "image" else _ros.compressed_rgb(msg)
        if size is None:
            size = img.shape[:2]
        elif img.shape[:2] != size:
            raise InvalidArgumentError(
                f"topic {topic}: image {i} is {img.shape[1]}x{img.shape[0]} but earlier ones are "
                f"{size[1]}x{size[0]}: a video stream needs one image size. Split or resize the topic."
            )
        yield img


def _stream(
    path: Path, pick: _Pick, items: list[tuple[int, Any]]
) -> VideoData | TableData | TextData:
    t_ns = np.array([s for s, _ in items], dtype=np.int64)
    msgs = [m for _, m in items]
    rate = nominal_rate_hz(t_ns, fallback_hz=1.0 if pick.kind == "string" else 30.0)
    if pick.kind == "string":
        records = [{"content": str(m.data), "role": "user"} for m in msgs]
        return TextData(pick.name, t_ns, records, rate_hz=rate, timing="state")
    if pick.kind in ("image", "compressed"):
        return VideoData(pick.name, _frames(pick.topic, pick.kind, msgs), t_ns, rate_hz=rate)
    if pick.kind == "joint":
        rows = [_ros.joint_field(m, pick.field or "position") for m in msgs]
        widths = {r.size for r in rows}
        if len(widths) != 1 or 0 in widths:
            raise InvalidArgumentError(
                f"{path}: {pick.topic}:{pick.field} has rows of widths {sorted(widths)}: every message "
                "must carry the same number of joints (and at least one)"
            )
        return TableData(
            pick.name, t_ns, np.stack(rows), rate_hz=rate, units=_UNITS[pick.field or "position"]
        )
    values = np.stack([_ros.pose7(m, pick.kind) for m in msgs])
    return TableData(pick.name, t_ns, values, rate_hz=rate, units="m", frame="ros", quantity="pose")


def _file_streams(
    path: Path, streams: dict[str, str] | None, progress: Progress, task: str | None = None
) -> list[VideoData | TableData | TextData]:
    """Every chosen stream of one MCAP file, read and sorted by stamp (and ``task``)."""
    picks = _picks(path, _topics(path), streams)
    data = _read(path, picks)
    built: list[VideoData | TableData | TextData] = []
    for pick in picks:
        items = _sorted_unique(path, pick.topic, data[pick.topic], progress)
        if (
            pick.kind == "joint"
            and not streams
            and _ros.joint_field(items[0][1], pick.field or "").size == 0
        ):
            continue  # a field this robot does not publish (e.g. empty effort)
        built.append(_stream(path, pick, items))
    if task is not None:
        if any(s.name == "task" for s in built):
            raise InvalidArgumentError(
                f"{path}: --task adds a stream 'task', which a topic maps to already: rename it "
                "with --stream NAME=TOPIC"
            )
        start = min(int(np.asarray(s.t_ns)[0]) for s in built)
        record = {"content": task, "role": "user", "style": "task"}
        built.append(TextData("task", np.array([start]), [record], rate_hz=1.0))
    return built


def ingest_mcap(
    store: Store,
    files: Sequence[str | os.PathLike[str]],
    slice_id: str,
    *,
    streams: dict[str, str] | None = None,
    site: str = "local",
    progress: Progress | None = None,
    gop: int = DEFAULT_GOP,
    stage: str | None = None,
    shard: Shard | None = None,
    jobs: int = 1,
    renditions: tuple[int, ...] = (),
    ray: str | None = None,
    task: str | None = None,
) -> ColumnarManifest | None:
    """Ingest ROS 2 MCAP bags as slice ``slice_id`` of ``store``, one segment per file.

    Args:
        store: the data root.
        files: MCAP files; segment ID = ``seg_`` + BLAKE3("mcap", BLAKE3 of the file)[:16],
            so the same bytes always give the same segment wherever the file lies.
        slice_id: e.g. ``"slc_7c1e04aa"``; an existing slice of that ID is replaced.
        streams: ``{stream name: "TOPIC" or "TOPIC:FIELD"}``; ``None`` ingests every supported
            topic under its default name (:func:`default_stream_names`). Joint-state topics
            take a field: ``position``, ``velocity`` or ``effort``.
        site: the site recorded in every segment.
        progress: where progress lines go (default: stderr).
        gop: keyframe interval of the stored videos in frames (see docs/video-encoding.md).
        stage: one worker of a distributed ingest: stage this worker's files in this batch
            instead of committing (``rayform-server commit`` makes the slice).
        shard: with ``stage``, this worker's share of ``files`` (default: all of them).
        jobs: files ingested in parallel processes (1: in this process); the slice is the
            same either way.
        renditions: heights (even, pixels) of smaller copies of every camera video to store
            too (docs/manifest.md), rendered by whichever process ingests the file.

        ray: run the shards as Ray tasks on this cluster (one per source file; ``""``:
            ``RAY_ADDRESS`` or a local Ray), then commit once (docs/ray.md).
        task: the task of every file: a ``task`` text stream with one record at the file's
            first record time (``None``: no task stream).

    Returns:
        The committed manifest (written only at the end, with the slice reference), or
        ``None`` when staging.

    Raises:
        InvalidArgumentError: unreadable file, unknown topic or field, unsupported type,
            topic without messages, mixed image sizes or joint counts.
    """
    check_slice_id(slice_id, new=True)
    check_jobs(jobs, stage)
    if ray is not None and (stage is not None or jobs > 1):
        raise InvalidArgumentError(
            "--ray runs the shards as Ray tasks and commits once: drop --stage, --shard and --jobs"
        )
    progress = progress or Progress()
    if not files:
        raise InvalidArgumentError("no MCAP files given")
    if task is not None and (not isinstance(task, str) or not task.strip()):
        raise InvalidArgumentError(f"--task {task!r}: give the task as a non-empty string")
    description = "ROS 2 bags: " + ", ".join(Path(f).name for f in files)
    if jobs > 1 or ray is not None:
        worker = functools.partial(
            _staging_worker,
            str(store.root),
            [str(f) for f in files],
            slice_id,
            streams,
            site,
            gop,
            renditions,
            task,
        )
        if ray is not None:
            from rayform_server.ingest._ray import group_by_file, run_on_ray

            groups = group_by_file([str(f) for f in files])
            return run_on_ray(
                store, slice_id, groups, description, progress, worker, address=ray or None
            )
        return run_jobs(store, slice_id, min(jobs, len(files)), description, progress, worker)

    def segments() -> Iterator[SegmentInput]:
        for i, file in enumerate(files):
            if shard is not None and not shard.mine(i):
                continue
            path = Path(file)
            if not path.is_file():
                raise InvalidArgumentError(f"{path} does not exist or is not a file")
            seg_id = segment_id_for("mcap", hash_file(path))
            built = _file_streams(path, streams, progress, task)
            summary = ", ".join(f"{s.name} ({len(s.t_ns)})" for s in built)
            yield SegmentInput(
                seg_id,
                str(path),
                built,
                f"{path.name} -> {seg_id} ({i + 1}/{len(files)}): {summary}",
                i,
            )

    return commit_segments(
        store,
        slice_id,
        segments(),
        site=site,
        gop=gop,
        progress=progress,
        description=description,
        stage=stage,
        renditions=renditions,
    )


def _staging_worker(
    root: str,
    files: list[str],
    slice_id: str,
    streams: dict[str, str] | None,
    site: str,
    gop: int,
    renditions: tuple[int, ...],
    task: str | None,
    batch: str,
    shard: Shard,
    verbose: bool,
) -> None:
    """One process of ``ingest_mcap(jobs=N)``: stage this shard's files (and their renditions) in ``batch``."""
    ingest_mcap(
        Store(root),
        files,
        slice_id,
        streams=streams,
        site=site,
        gop=gop,
        stage=batch,
        shard=shard,
        progress=Progress(sys.stderr if verbose else None),
        renditions=renditions,
        task=task,
    )
