"""Read the on-disk layout of a LeRobot dataset (v2.1 or v3.0) without the ``lerobot`` package.

* **v3.0**: ``meta/info.json``; ``meta/episodes/chunk-*/file-*.parquet`` (one row per episode:
  ``episode_index``, ``length``, ``data/chunk_index``, ``data/file_index``, and per video key
  ``videos/KEY/chunk_index``, ``videos/KEY/file_index``, ``videos/KEY/from_timestamp``,
  ``videos/KEY/to_timestamp``); ``data/`` parquet files shared by many episodes; ``videos/``
  MP4 files shared by many episodes, each episode starting at its ``from_timestamp``.
* **v2.1**: ``meta/info.json``; ``meta/episodes.jsonl`` (``episode_index``, ``length``); one
  parquet file and one MP4 per episode and video key, found through the ``data_path`` and
  ``video_path`` templates of ``info.json`` (chunk = episode_index // chunks_size).

The task strings behind the per-frame ``task_index`` are in ``meta/tasks.parquet`` (v3.0: a
pandas frame indexed by the task string, column ``task_index``) or ``meta/tasks.jsonl`` (v2.1:
``{"task_index", "task"}`` per line).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from rayform.errors import InvalidArgumentError

__all__ = ["BOOKKEEPING", "LANGUAGE_COLUMNS", "Episode", "LeRobotLayout", "open_layout"]

#: Columns every LeRobot dataset has that are not recorded signals.
BOOKKEEPING = ("timestamp", "frame_index", "episode_index", "index", "task_index")
#: LeRobot's per-frame language columns (feature dtype ``"language"``): rows that hold from
#: their ``timestamp`` until replaced, and rows present only on the frame they were emitted on.
LANGUAGE_COLUMNS = ("language_persistent", "language_events")
_VECTOR_DTYPES = (
    "float16",
    "float32",
    "float64",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint8",
    "bool",
)
_V21_DATA = "data/chunk-{episode_chunk:03d}/episode_{episode_index:06d}.parquet"
_V21_VIDEO = "videos/chunk-{episode_chunk:03d}/{video_key}/episode_{episode_index:06d}.mp4"


@dataclass
class Episode:
    """Where one episode's rows and frames are.

    Attributes:
        index: LeRobot's ``episode_index``.
        length: number of frames (rows).
        data_file: parquet file holding its rows (filtered by ``episode_index``).
        videos: per video key, ``(mp4 file, offset in seconds of the episode's first frame)``.
    """

    index: int
    length: int
    data_file: Path
    videos: dict[str, tuple[Path, float]] = field(default_factory=dict)


@dataclass
class LeRobotLayout:
    """A LeRobot dataset on disk: version, fps, features and episodes (sorted by index)."""

    root: Path
    version: str
    fps: float
    features: dict[str, dict[str, Any]]
    episodes: list[Episode]
    #: ``task_index`` -> task string; ``None`` when the dataset has no tasks table.
    tasks: dict[int, str] | None = None

    @property
    def language_keys(self) -> list[str]:
        """The language columns the dataset has (of :data:`LANGUAGE_COLUMNS`)."""
        return [k for k in LANGUAGE_COLUMNS if k in self.features]

    @property
    def video_keys(self) -> list[str]:
        return [k for k, f in self.features.items() if f.get("dtype") == "video"]

    @property
    def vector_keys(self) -> list[str]:
        return [
            k
            for k, f in self.features.items()
            if k not in BOOKKEEPING and f.get("dtype") in _VECTOR_DTYPES
        ]

    def read_rows(self, episode: Episode, columns: list[str]) -> pa.Table:
        """The episode's rows (``columns`` + ``timestamp``), sorted by ``frame_index``."""
        want = sorted({*columns, "timestamp", "frame_index", "episode_index"})
        try:
            table = pq.read_table(
                episode.data_file, columns=want, filters=[("episode_index", "=", episode.index)]
            )
        except (OSError, pa.ArrowException) as exc:
            raise InvalidArgumentError(
                f"cannot read {episode.data_file}: {exc}. Is the dataset complete?"
            ) from exc
        order = np.argsort(table.column("frame_index").to_numpy(), kind="stable")
        return table.take(pa.array(order))


def _load_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise InvalidArgumentError(f"cannot read {path}: {exc}") from exc


def open_layout(path: str | os.PathLike[str]) -> LeRobotLayout:
    """Read a LeRobot dataset's metadata.

    Raises:
        InvalidArgumentError: ``path`` is not a LeRobot dataset (no ``meta/info.json``), is of
            an unsupported ``codebase_version``, or its metadata is unreadable.
    """
    root = Path(path)
    info_path = root / "meta" / "info.json"
    if not info_path.is_file():
        raise InvalidArgumentError(
            f"{root} is not a LeRobot dataset: {info_path} is missing. Pass the dataset's root "
            "directory (the one that holds meta/, data/ and videos/)."
        )
    info = _load_json(info_path)
    version = str(info.get("codebase_version", ""))
    features = info.get("features")
    if not isinstance(features, dict) or "fps" not in info:
        raise InvalidArgumentError(
            f"{info_path} has no 'features' or 'fps': not a LeRobot info.json"
        )
    if version.startswith("v3"):
        episodes = _episodes_v30(root, info)
    elif version.startswith("v2"):
        episodes = _episodes_v21(root, info)
    else:
        raise InvalidArgumentError(
            f"{root}: LeRobot codebase_version {version!r} is not supported (v2.1 and v3.0 are). "
            "Convert it with LeRobot's conversion script first."
        )
    if not episodes:
        raise InvalidArgumentError(f"{root}: the dataset has no episodes")
    return LeRobotLayout(root, version, float(info["fps"]), features, episodes, tasks=_tasks(root))


def _tasks(root: Path) -> dict[int, str] | None:
    """``task_index`` -> task string, from ``meta/tasks.parquet`` or ``meta/tasks.jsonl``."""
    parquet, jsonl = root / "meta" / "tasks.parquet", root / "meta" / "tasks.jsonl"
    if parquet.is_file():
        try:
            table = pq.read_table(parquet)
        except (OSError, pa.ArrowException) as exc:
            raise InvalidArgumentError(f"cannot read {parquet}: {exc}") from exc
        # The task string is the pandas index: a column named "task" or "__index_level_0__".
        texts = [
            n
            for n in table.column_names
            if n != "task_index" and pa.types.is_string(table.schema.field(n).type)
        ]
        if "task_index" not in table.column_names or len(texts) != 1:
            raise InvalidArgumentError(
                f"{parquet}: expected a task_index column and one task string column (the "
                f"frame's index), got columns {table.column_names}"
            )
        index = table.column("task_index").to_pylist()
        return dict(zip(index, table.column(texts[0]).to_pylist(), strict=True))
    if jsonl.is_file():
        try:
            rows = [json.loads(ln) for ln in jsonl.read_text().splitlines() if ln.strip()]
            return {int(r["task_index"]): str(r["task"]) for r in rows}
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise InvalidArgumentError(
                f'cannot read {jsonl}: {exc} (expected lines of {{"task_index", "task"}})'
            ) from exc
    return None


def _episodes_v30(root: Path, info: dict[str, Any]) -> list[Episode]:
    files = sorted((root / "meta" / "episodes").glob("chunk-*/file-*.parquet"))
    if not files:
        raise InvalidArgumentError(
            f"{root} says v3.0 but has no meta/episodes/chunk-*/file-*.parquet: the dataset is "
            "incomplete (was LeRobotDataset.finalize() called?)"
        )
    video_keys = [k for k, f in info["features"].items() if f.get("dtype") == "video"]
    data_tpl = info.get("data_path", "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet")
    video_tpl = info.get(
        "video_path", "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"
    )
    cols = ["episode_index", "length", "data/chunk_index", "data/file_index"]
    for key in video_keys:
        cols += [
            f"videos/{key}/chunk_index",
            f"videos/{key}/file_index",
            f"videos/{key}/from_timestamp",
        ]
    try:
        rows = pa.concat_tables([pq.read_table(f, columns=cols) for f in files]).to_pylist()
    except (OSError, pa.ArrowException) as exc:
        raise InvalidArgumentError(f"cannot read the episodes metadata of {root}: {exc}") from exc
    episodes = []
    for r in sorted(rows, key=lambda r: r["episode_index"]):
        data = root / data_tpl.format(
            chunk_index=r["data/chunk_index"], file_index=r["data/file_index"]
        )
        videos = {
            key: (
                root
                / video_tpl.format(
                    video_key=key,
                    chunk_index=r[f"videos/{key}/chunk_index"],
                    file_index=r[f"videos/{key}/file_index"],
                ),
                float(r[f"videos/{key}/from_timestamp"]),
            )
            for key in video_keys
        }
        episodes.append(Episode(int(r["episode_index"]), int(r["length"]), data, videos))
    return episodes


def _episodes_v21(root: Path, info: dict[str, Any]) -> list[Episode]:
    path = root / "meta" / "episodes.jsonl"
    try:
        lines = [ln for ln in path.read_text().splitlines() if ln.strip()]
        rows = [json.loads(ln) for ln in lines]
    except (OSError, ValueError) as exc:
        raise InvalidArgumentError(f"cannot read {path}: {exc} (a v2.1 dataset needs it)") from exc
    video_keys = [k for k, f in info["features"].items() if f.get("dtype") == "video"]
    data_tpl = info.get("data_path", _V21_DATA)
    video_tpl = info.get("video_path") or _V21_VIDEO
    chunks = int(info.get("chunks_size", 1000))
    episodes = []
    for r in sorted(rows, key=lambda r: r["episode_index"]):
        ep = int(r["episode_index"])
        fmt = {"episode_chunk": ep // chunks, "episode_index": ep}
        videos = {k: (root / video_tpl.format(video_key=k, **fmt), 0.0) for k in video_keys}
        episodes.append(Episode(ep, int(r["length"]), root / data_tpl.format(**fmt), videos))
    return episodes
