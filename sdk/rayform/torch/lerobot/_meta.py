"""The ``meta/`` files of an exported LeRobot dataset, written once every file group is done.

``info.json`` comes last: a dataset that has one is complete. Besides LeRobot's keys it holds
``rayform`` (the slice ID, manifest hash, selection and export options), and the episodes
table holds each episode's segment ID and version, so an exported dataset leads back to the
exact slice it came from.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from rayform import lerobot_layout as layout
from rayform.torch.lerobot import _format as fmt

if TYPE_CHECKING:
    from rayform.torch.dataset import EpisodeDataset
    from rayform.torch.lerobot._plan import Plan

__all__ = ["write_meta"]


def _video_feature(ds: EpisodeDataset, key: str, fps: float, pix_fmt: str) -> dict[str, Any]:
    _, h, w = ds.frame_shape(key)
    return {
        "dtype": layout.VIDEO,
        "shape": [h, w, 3],
        "names": ["height", "width", "channels"],
        "info": {
            "video.height": h,
            "video.width": w,
            "video.codec": "h264",
            "video.pix_fmt": pix_fmt,
            "video.is_depth_map": False,
            "video.fps": _number(fps),
            "video.channels": 3,
            "has_audio": False,
        },
    }


def _number(fps: float) -> int | float:
    return int(fps) if float(fps).is_integer() else float(fps)


def write_meta(
    root: Path,
    identity: dict[str, Any],
    plan: Plan,
    features: dict[str, dict[str, Any]],
    cameras: list[str],
    done: dict[int, dict[str, Any]],
    robot_type: str | None,
    ds: EpisodeDataset,
) -> None:
    """Write ``meta/`` (tasks, episodes, statistics, then ``info.json``)."""
    version = identity["version"]
    fps = identity["fps"]
    tasks: list[str] = identity["language"]["tasks"]
    episodes: dict[int, dict[str, Any]] = {}
    file_of: dict[int, int] = {}
    for unit in plan.units:
        for ep in done[unit.file]["episodes"]:
            episodes[ep["episode_index"]] = ep
            file_of[ep["episode_index"]] = unit.file
    pix = {
        k: "yuv420p" if all(v % 2 == 0 for v in ds.frame_shape(k)[1:]) else "yuv444p"
        for k in cameras
    }
    all_features = {
        **{k: _video_feature(ds, k, fps, pix[k]) for k in cameras},
        **features,
    }
    segs = ds.segments
    first = plan.first_index
    stats = {
        key: fmt.aggregate_stats([episodes[e]["stats"][key] for e in sorted(episodes)])
        for key in all_features
        if all_features[key]["dtype"] != layout.LANGUAGE  # text has no statistics
    }
    fmt.write_json(root / layout.STATS, stats)
    rows = []
    for e in sorted(episodes):
        seg = segs[plan.positions[e]]
        row: dict[str, Any] = {
            "episode_index": e,
            "tasks": [tasks[k] for k in episodes[e]["tasks"]],
            "length": plan.lengths[e],
        }
        if version == "3.0":
            file = file_of[e]
            start = sum(plan.lengths[x] for x in _unit_of(plan, e) if x < e)
            row.update(
                {
                    layout.DATA_CHUNK: file // layout.CHUNKS_SIZE,
                    layout.DATA_FILE: file % layout.CHUNKS_SIZE,
                    "dataset_from_index": first[e],
                    "dataset_to_index": first[e] + plan.lengths[e],
                }
            )
            for key in cameras:
                row[layout.video_column(key, "chunk_index")] = file // layout.CHUNKS_SIZE
                row[layout.video_column(key, "file_index")] = file % layout.CHUNKS_SIZE
                row[layout.video_column(key, "from_timestamp")] = start / fps
                row[layout.video_column(key, "to_timestamp")] = (start + plan.lengths[e]) / fps
            for key, entry in episodes[e]["stats"].items():
                for name, value in entry.items():
                    row[f"stats/{key}/{name}"] = value
            row["meta/episodes/chunk_index"] = 0
            row["meta/episodes/file_index"] = 0
        row["rayform/segment"] = seg.id
        row["rayform/segment_version"] = int(seg.version)
        rows.append(row)
    if version == "3.0":
        episodes_file = layout.EPISODES_V30.format(chunk_index=0, file_index=0)
        fmt.write_episodes(root / episodes_file, rows)
        fmt.write_tasks(root / layout.TASKS_V30, tasks)
    else:
        fmt.write_json(root / layout.EPISODES_V21, rows, lines=True)
        fmt.write_json(
            root / layout.TASKS_V21,
            [{"task_index": k, "task": t} for k, t in enumerate(tasks)],
            lines=True,
        )
        fmt.write_json(
            root / layout.EPISODES_STATS_V21,
            [{"episode_index": e, "stats": episodes[e]["stats"]} for e in sorted(episodes)],
            lines=True,
        )
    n_eps = len(episodes)
    info: dict[str, Any] = {
        "codebase_version": layout.codebase_version(version),
        "robot_type": robot_type,
        "total_episodes": n_eps,
        "total_frames": sum(plan.lengths),
        "total_tasks": len(tasks),
        "chunks_size": layout.CHUNKS_SIZE,
        "fps": _number(fps),
        "splits": {"train": f"0:{n_eps}"},
    }
    if version == "3.0":
        info.update(
            {
                "data_files_size_in_mb": 100,
                "video_files_size_in_mb": 200,
                "data_path": layout.DATA_PATH[version],
                "video_path": layout.VIDEO_PATH[version] if cameras else None,
            }
        )
    else:
        info.update(
            {
                "total_chunks": (n_eps - 1) // layout.CHUNKS_SIZE + 1,
                "total_videos": n_eps * len(cameras),
                "data_path": layout.DATA_PATH[version],
                "video_path": layout.VIDEO_PATH[version] if cameras else None,
            }
        )
    info["features"] = all_features
    info["rayform"] = {
        "slice": identity["slice"],
        "manifest": identity["manifest"],
        "selection": identity["selection"],
        "streams": identity["streams"],
        "fps": fps,
        "image_size": identity["image_size"],
        "resize": identity["resize"],
        # Everything the export was made from (a rerun with these arguments is a no-op).
        "export": identity,
    }
    fmt.write_json(root / layout.INFO, info)


def _unit_of(plan: Plan, e: int) -> tuple[int, ...]:
    for u in plan.units:
        if e in u.episodes:
            return u.episodes
    raise AssertionError(e)
