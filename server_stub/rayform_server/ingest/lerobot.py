"""Ingest a LeRobot dataset (v2.1 or v3.0 layout on local disk) into a slice.

Every episode becomes one segment; every video feature becomes a video stream (decoded and
re-encoded as H.264 with a short keyframe interval, one frame per dataset row; see
``docs/ingest-lerobot.md`` for the measurements behind re-encoding); every vector feature
becomes a table stream. Both use the dataset's row times in ns, episode-relative (the first
frame of every episode is at 0 ns): ``frame_index / fps`` exactly when the float32
``timestamp`` column agrees with it within 1e-4 s, else the column itself (see
``_row_times_ns``).

Default stream names (``--stream NAME=FEATURE`` replaces them; when any is given, only the
named features are ingested):

* video ``observation.images.top`` -> ``top/rgb`` (``observation.`` and ``images.`` dropped,
  other dots become ``/``, then ``/rgb``);
* vector ``observation.state`` -> ``observation/state``, ``action`` -> ``action`` (dots
  become ``/``); characters outside ``[a-z0-9_.-]`` become ``_``;
* the per-frame tasks -> the text stream ``task`` (``--stream NAME=task`` renames it), and
  the language columns -> ``language/<style>`` (``--stream PREFIX=language`` for both,
  ``PREFIX=language_persistent`` or ``PREFIX=language_events`` for one): see ``_lerobot_text``.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa

from rayform.errors import InvalidArgumentError
from rayform.format import ColumnarManifest, check_slice_id
from rayform_server._video import DEFAULT_GOP
from rayform_server.builder import TableData, TextData, VideoData
from rayform_server.ingest._common import (
    Progress,
    SegmentInput,
    check_jobs,
    commit_segments,
    run_jobs,
    sanitize_stream_name,
    segment_id_for,
)
from rayform_server.ingest._frames import frames_at
from rayform_server.ingest._lerobot_layout import Episode, LeRobotLayout, open_layout
from rayform_server.ingest._lerobot_text import TEXT_FEATURES, episode_text_streams
from rayform_server.staging import Shard
from rayform_server.store import Store

__all__ = ["SNAP_TOLERANCE_S", "default_stream_name", "ingest_lerobot"]

#: Rows whose ``timestamp`` is within this of ``frame_index / fps`` (s) are snapped onto it
#: (LeRobot's own ``tolerance_s`` default).
SNAP_TOLERANCE_S = 1e-4


def default_stream_name(feature: str, is_video: bool) -> str:
    """The stream name a feature gets without ``--stream`` (see the module docstring)."""
    words = feature.split(".")
    if is_video:
        if words[:1] == ["observation"] and len(words) > 1:
            words = words[1:]
        if words[:1] in (["images"], ["image"]) and len(words) > 1:
            words = words[1:]
        return sanitize_stream_name([*words, "rgb"])
    return sanitize_stream_name(words)


def _pick_streams(layout: LeRobotLayout, chosen: dict[str, str] | None) -> dict[str, str]:
    """``{stream name: feature}`` to ingest."""
    videos, vectors = layout.video_keys, layout.vector_keys
    languages = layout.language_keys
    texts = (["task"] if layout.tasks is not None else []) + (
        ["language", *languages] if languages else []
    )
    if chosen:
        for name, feature in chosen.items():
            if feature not in videos and feature not in vectors and feature not in texts:
                why = (
                    " (it has no meta/tasks.parquet or meta/tasks.jsonl)"
                    if feature == "task"
                    else ""
                )
                raise InvalidArgumentError(
                    f"--stream {name}={feature}: the dataset has no video, vector or text "
                    f"feature {feature!r}{why}. Its features are: "
                    f"{', '.join(videos + vectors + texts)}"
                )
        return dict(chosen)
    out: dict[str, str] = {}
    for feature in videos + vectors:
        name = default_stream_name(feature, feature in videos)
        if name in out:
            raise InvalidArgumentError(
                f"features {out[name]!r} and {feature!r} both map to stream {name!r}: name them "
                f"with --stream, e.g. --stream {name}2={feature}"
            )
        out[name] = feature
    for feature in texts[: 2 if layout.tasks is not None else 1]:  # task, both language columns
        if feature in out:
            raise InvalidArgumentError(
                f"feature {out[feature]!r} maps to stream {feature!r}, which the dataset's "
                f"{feature} needs: name them with --stream"
            )
        out[feature] = feature
    if not out:
        raise InvalidArgumentError(f"{layout.root}: the dataset has no video or vector features")
    return out


def _vectors(column: pa.ChunkedArray, n: int, feature: str) -> np.ndarray:
    """A parquet column (scalars or fixed/variable-size lists) as ``(N, D)``."""
    col = column.combine_chunks()
    if (
        pa.types.is_list(col.type)
        or pa.types.is_fixed_size_list(col.type)
        or pa.types.is_large_list(col.type)
    ):
        flat = col.flatten().to_numpy(zero_copy_only=False)
        if n == 0 or flat.size % n:
            raise InvalidArgumentError(f"feature {feature!r}: rows do not all have the same length")
        return flat.reshape(n, flat.size // n)
    return col.to_numpy(zero_copy_only=False).reshape(n, 1)


def _row_times_ns(
    ts_s: np.ndarray, frame_index: np.ndarray, fps: float, episode: int, note: Progress
) -> np.ndarray:
    """Row times in ns, episode-relative: ``timestamp`` snapped to ``frame_index / fps``.

    LeRobot writes ``timestamp = frame_index / fps`` as float32 and itself treats rows as
    on that grid (tolerance ``SNAP_TOLERANCE_S``). When every row is within the tolerance,
    row ``k`` gets ``rint(k * (1e9 / fps))`` ns: the exact arithmetic of
    ``rayform.torch._index.grid_offsets_ns``, so an ``EpisodeDataset`` at ``fps`` returns
    row ``k`` at grid step ``k``. Otherwise the real times ``rint(timestamp * 1e9)`` are
    kept and a note is printed.

    Args:
        ts_s: ``float64 (N,)`` the ``timestamp`` column, seconds.
        frame_index: ``int (N,)`` the ``frame_index`` column.
        fps: the dataset's rate, Hz.
        episode: episode index (for the note).
        note: where the note goes.

    Returns:
        ``int64 (N,)`` times in ns.
    """
    k = frame_index.astype(np.float64)
    if np.all(np.abs(ts_s - k / fps) <= SNAP_TOLERANCE_S):
        # Same expression as grid_offsets_ns (kept in sync; tests compare them).
        return np.rint(k * (1e9 / fps)).astype(np.int64)
    worst = float(np.max(np.abs(ts_s - k / fps)))
    note(
        f"episode {episode}: timestamps are up to {worst * 1e3:.3f} ms off frame_index / fps "
        f"(tolerance {SNAP_TOLERANCE_S * 1e3:g} ms); keeping the recorded times"
    )
    return np.rint(ts_s * 1e9).astype(np.int64)


def _episode_streams(
    layout: LeRobotLayout, ep: Episode, streams: dict[str, str], note: Progress
) -> list[VideoData | TableData | TextData]:
    vector_features = [f for f in streams.values() if f not in layout.video_keys]
    columns = [
        c
        for f in vector_features
        for c in (
            ["task_index"] if f == "task" else layout.language_keys if f == "language" else [f]
        )
    ]
    rows = layout.read_rows(ep, columns)
    n = rows.num_rows
    if n == 0:
        raise InvalidArgumentError(f"episode {ep.index}: no rows in {ep.data_file}")
    ts_s = rows.column("timestamp").to_numpy().astype(np.float64)
    t_ns = _row_times_ns(ts_s, rows.column("frame_index").to_numpy(), layout.fps, ep.index, note)
    if n > 1 and not np.all(np.diff(t_ns) > 0):
        raise InvalidArgumentError(
            f"episode {ep.index}: the timestamp column is not strictly increasing"
        )
    out: list[VideoData | TableData | TextData] = []
    texts = {n: f for n, f in streams.items() if f in TEXT_FEATURES}
    for name, feature in streams.items():
        if feature in texts.values():
            continue
        if feature in layout.video_keys:
            path, offset_s = ep.videos[feature]
            if not path.is_file():
                raise InvalidArgumentError(f"episode {ep.index}: video file {path} is missing")
            shape = layout.features[feature].get("shape") or [None, None]
            frames = frames_at(
                path,
                list(offset_s + ts_s),
                tolerance_s=0.5 / layout.fps,
                shape=(int(shape[0]), int(shape[1])) if shape[0] else None,
            )
            out.append(VideoData(name, frames, t_ns, rate_hz=layout.fps))
        else:
            values = _vectors(rows.column(feature), n, feature)
            out.append(TableData(name, t_ns, values, rate_hz=layout.fps))
    if texts:
        k = rows.column("frame_index").to_numpy().astype(np.float64)
        out += episode_text_streams(
            texts,
            rows,
            t_ns,
            tasks=layout.tasks,
            fps=layout.fps,
            snap=bool(np.array_equal(t_ns, np.rint(k * (1e9 / layout.fps)).astype(np.int64))),
            tolerance_s=SNAP_TOLERANCE_S,
            where=f"episode {ep.index}",
        )
    return out


def ingest_lerobot(
    store: Store,
    path: str | os.PathLike[str],
    slice_id: str,
    *,
    streams: dict[str, str] | None = None,
    site: str = "local",
    dataset_id: str | None = None,
    progress: Progress | None = None,
    gop: int = DEFAULT_GOP,
    stage: str | None = None,
    shard: Shard | None = None,
    jobs: int = 1,
    renditions: tuple[int, ...] = (),
    ray: str | None = None,
) -> ColumnarManifest | None:
    """Ingest the LeRobot dataset at ``path`` as slice ``slice_id`` of ``store``.

    Args:
        store: the data root.
        path: the dataset's root directory (holding ``meta/info.json``).
        slice_id: e.g. ``"slc_7c1e04aa"``; an existing slice of that ID is replaced.
        streams: ``{stream name: feature}``; ``None`` ingests every video and vector feature
            under its default name (:func:`default_stream_name`).
        site: the site recorded in every segment.
        dataset_id: identifies the dataset in segment IDs (default: the directory's name);
            segment ID = ``seg_`` + BLAKE3("lerobot", dataset_id, episode_index)[:16].
        progress: where progress lines go (default: stderr).
        gop: keyframe interval of the stored videos in frames (see docs/video-encoding.md).
        stage: one worker of a distributed ingest: stage this worker's episodes in this batch
            instead of committing (``rayform-server commit`` makes the slice).
        shard: with ``stage``, this worker's share of the episodes (default: all of them).
        jobs: episodes ingested in parallel processes (1: in this process); the slice is the
            same either way.
        renditions: heights (even, pixels) of smaller copies of every camera video to store
            too (docs/manifest.md), rendered by whichever process ingests the episode.

        ray: run the shards as Ray tasks on this cluster (one per source file; ``""``:
            ``RAY_ADDRESS`` or a local Ray), then commit once (docs/ray.md).

    Returns:
        The committed manifest (``None`` when staging). Blobs are written episode by episode;
        the manifest and the slice reference only at the end, so a failure never leaves a
        half-written slice.

    Raises:
        InvalidArgumentError: not a LeRobot dataset, unknown feature, unreadable or
            inconsistent files.
    """
    check_slice_id(slice_id, new=True)
    check_jobs(jobs, stage)
    if ray is not None and (stage is not None or jobs > 1):
        raise InvalidArgumentError(
            "--ray runs the shards as Ray tasks and commits once: drop --stage, --shard and --jobs"
        )
    progress = progress or Progress()
    layout = open_layout(path)
    chosen = _pick_streams(layout, streams)
    ds_id = dataset_id or Path(path).resolve().name
    progress(
        f"LeRobot {layout.version} dataset {ds_id}: {len(layout.episodes)} episodes at "
        f"{layout.fps:g} fps; streams: " + ", ".join(f"{n} <- {f}" for n, f in chosen.items())
    )

    description = f"LeRobot dataset {ds_id} ({layout.version})"
    if jobs > 1 or ray is not None:
        worker = functools.partial(
            _staging_worker,
            str(store.root),
            str(path),
            slice_id,
            chosen,
            site,
            ds_id,
            gop,
            renditions,
        )
        if ray is not None:
            from rayform_server.ingest._ray import group_by_file, run_on_ray

            groups = group_by_file([ep.data_file for ep in layout.episodes])
            return run_on_ray(
                store, slice_id, groups, description, progress, worker, address=ray or None
            )
        return run_jobs(
            store, slice_id, min(jobs, len(layout.episodes)), description, progress, worker
        )

    def segments() -> Iterator[SegmentInput]:
        for i, ep in enumerate(layout.episodes):
            if shard is not None and not shard.mine(i):
                continue
            seg_id = segment_id_for("lerobot", ds_id, str(ep.index))
            yield SegmentInput(
                seg_id,
                f"episode {ep.index}",
                _episode_streams(layout, ep, chosen, progress),
                f"episode {ep.index} -> {seg_id} ({i + 1}/{len(layout.episodes)}, {ep.length} frames)",
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
    path: str,
    slice_id: str,
    streams: dict[str, str],
    site: str,
    dataset_id: str,
    gop: int,
    renditions: tuple[int, ...],
    batch: str,
    shard: Shard,
    verbose: bool,
) -> None:
    """One process of ``ingest_lerobot(jobs=N)``: stage this shard's episodes (and their renditions) in ``batch``."""
    ingest_lerobot(
        Store(root),
        path,
        slice_id,
        streams=streams,
        site=site,
        dataset_id=dataset_id,
        gop=gop,
        stage=batch,
        shard=shard,
        progress=Progress(sys.stderr if verbose else None),
        renditions=renditions,
    )
