"""Read the on-disk layout of a LeRobot dataset (v2.1 or v3.0) without the ``lerobot`` package.

The layout (paths and their templates, chunks, ``info.json`` keys, the episodes and tasks
tables, feature dtypes) is :mod:`rayform.lerobot_layout`, the one the export writes; this
module finds a dataset's episodes in it:

* **v3.0**: the rows of ``meta/episodes/chunk-*/file-*.parquet`` say each episode's data file
  and, per video key, its MP4 file and ``from_timestamp`` (the episode's first frame in it);
  data and video files are shared by many episodes.
* **v2.1**: ``meta/episodes.jsonl`` lists the episodes; each has its own parquet file and MP4
  per video key, at the ``data_path`` and ``video_path`` templates of ``info.json``.

The task strings behind the per-frame ``task_index`` are in ``meta/tasks.parquet`` (v3.0) or
``meta/tasks.jsonl`` (v2.1).
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

from rayform import lerobot_layout as layout
from rayform.errors import InvalidArgumentError

__all__ = ["Episode", "LeRobotLayout", "open_layout"]


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
        """The language columns the dataset has (of LeRobot's ``LANGUAGE_COLUMNS``)."""
        return [k for k in layout.LANGUAGE_COLUMNS if k in self.features]

    @property
    def video_keys(self) -> list[str]:
        return [k for k, f in self.features.items() if f.get("dtype") == layout.VIDEO]

    @property
    def vector_keys(self) -> list[str]:
        return [
            k
            for k, f in self.features.items()
            if k not in layout.BOOKKEEPING_FEATURES and f.get("dtype") in layout.VECTOR_DTYPES
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
    info_path = root / layout.INFO
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
    if layout.layout_version(version) == "3.0":
        episodes = _episodes_v30(root, info)
    elif layout.layout_version(version) == "2.1":
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
    parquet, jsonl = root / layout.TASKS_V30, root / layout.TASKS_V21
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
    files = sorted(root.glob(layout.EPISODES_V30_GLOB))
    if not files:
        raise InvalidArgumentError(
            f"{root} says v3.0 but has no meta/episodes/chunk-*/file-*.parquet: the dataset is "
            "incomplete (was LeRobotDataset.finalize() called?)"
        )
    video_keys = [k for k, f in info["features"].items() if f.get("dtype") == layout.VIDEO]
    data_tpl = info.get("data_path", layout.DATA_PATH["3.0"])
    video_tpl = info.get("video_path", layout.VIDEO_PATH["3.0"])
    where = ("chunk_index", "file_index", "from_timestamp")
    cols = ["episode_index", "length", layout.DATA_CHUNK, layout.DATA_FILE]
    cols += [layout.video_column(key, name) for key in video_keys for name in where]
    try:
        rows = pa.concat_tables([pq.read_table(f, columns=cols) for f in files]).to_pylist()
    except (OSError, pa.ArrowException) as exc:
        raise InvalidArgumentError(f"cannot read the episodes metadata of {root}: {exc}") from exc
    episodes = []
    for r in sorted(rows, key=lambda r: r["episode_index"]):
        data = root / data_tpl.format(
            chunk_index=r[layout.DATA_CHUNK], file_index=r[layout.DATA_FILE]
        )
        videos = {
            key: (
                root
                / video_tpl.format(
                    video_key=key,
                    chunk_index=r[layout.video_column(key, "chunk_index")],
                    file_index=r[layout.video_column(key, "file_index")],
                ),
                float(r[layout.video_column(key, "from_timestamp")]),
            )
            for key in video_keys
        }
        episodes.append(Episode(int(r["episode_index"]), int(r["length"]), data, videos))
    return episodes


def _episodes_v21(root: Path, info: dict[str, Any]) -> list[Episode]:
    path = root / layout.EPISODES_V21
    try:
        lines = [ln for ln in path.read_text().splitlines() if ln.strip()]
        rows = [json.loads(ln) for ln in lines]
    except (OSError, ValueError) as exc:
        raise InvalidArgumentError(f"cannot read {path}: {exc} (a v2.1 dataset needs it)") from exc
    video_keys = [k for k, f in info["features"].items() if f.get("dtype") == layout.VIDEO]
    data_tpl = info.get("data_path", layout.DATA_PATH["2.1"])
    video_tpl = info.get("video_path") or layout.VIDEO_PATH["2.1"]
    chunks = int(info.get("chunks_size", layout.CHUNKS_SIZE))
    episodes = []
    for r in sorted(rows, key=lambda r: r["episode_index"]):
        ep = int(r["episode_index"])
        fmt = {"episode_chunk": ep // chunks, "episode_index": ep}
        videos = {k: (root / video_tpl.format(video_key=k, **fmt), 0.0) for k in video_keys}
        episodes.append(Episode(ep, int(r["length"]), root / data_tpl.format(**fmt), videos))
    return episodes
