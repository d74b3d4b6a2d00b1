"""LeRobot's on-disk dataset layout, v3.0 and v2.1: paths, chunks, ``info.json`` keys, dtypes.

One definition for both directions, neither of which needs the ``lerobot`` package: the export
(``rayform export --format lerobot``, :mod:`rayform.torch.lerobot`) writes this layout and the
server stub's ingest (``rayform-server ingest lerobot``) reads it. It is what LeRobot 0.4.4
reads for v3.0 (``lerobot/datasets/utils.py``) and LeRobot 0.3.x for v2.1:

* both: ``meta/info.json`` (:data:`INFO`) with ``codebase_version`` (``"v3.0"``, ``"v2.1"``),
  ``fps``, ``features`` (each ``dtype``, ``shape``, ``names``; a video feature also ``info``),
  ``chunks_size`` and the path templates ``data_path`` and ``video_path``; ``meta/stats.json``.
* v3.0: ``data/chunk-CCC/file-FFF.parquet`` (many episodes per file),
  ``videos/KEY/chunk-CCC/file-FFF.mp4`` (episodes back to back, each from its
  ``from_timestamp``), ``meta/episodes/chunk-CCC/file-FFF.parquet`` (one row per episode:
  ``episode_index``, ``length``, :data:`DATA_CHUNK`, :data:`DATA_FILE` and per video key
  the columns :func:`video_column` names), ``meta/tasks.parquet`` (a pandas frame indexed by the task string,
  column ``task_index``). File ``n`` is file ``n % 1000`` of chunk ``n // 1000``.
* v2.1: one parquet file and one MP4 per episode and video key
  (``data/chunk-CCC/episode_EEEEEE.parquet``, ``videos/chunk-CCC/KEY/episode_EEEEEE.mp4``,
  chunk = episode index // ``chunks_size``), ``meta/episodes.jsonl`` (``episode_index``,
  ``length``), ``meta/tasks.jsonl`` (``{"task_index", "task"}`` per line) and
  ``meta/episodes_stats.jsonl``.

Every dataset has the :data:`BOOKKEEPING_FEATURES` columns after its recorded features; a
feature's ``dtype`` is a numpy dtype (:data:`VECTOR_DTYPES`), ``"video"`` or ``"language"``
(LeRobot 0.6.1's :data:`LANGUAGE_COLUMNS`).
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "BOOKKEEPING_FEATURES",
    "CHUNKS_SIZE",
    "DATA_CHUNK",
    "DATA_FILE",
    "DATA_PATH",
    "EPISODES_STATS_V21",
    "EPISODES_V21",
    "EPISODES_V30",
    "EPISODES_V30_GLOB",
    "INFO",
    "LANGUAGE",
    "LANGUAGE_COLUMNS",
    "STATS",
    "TASKS_V21",
    "TASKS_V30",
    "VECTOR_DTYPES",
    "VERSIONS",
    "VIDEO",
    "VIDEO_PATH",
    "codebase_version",
    "data_path",
    "layout_version",
    "video_column",
    "video_path",
]

#: The layout versions, newest first (``info.json``'s ``codebase_version`` without its ``v``).
VERSIONS = ("3.0", "2.1")
#: Files (v3.0) or episodes (v2.1) per chunk directory (LeRobot's ``DEFAULT_CHUNK_SIZE``).
CHUNKS_SIZE = 1000

INFO = "meta/info.json"
STATS = "meta/stats.json"
EPISODES_V21 = "meta/episodes.jsonl"
EPISODES_STATS_V21 = "meta/episodes_stats.jsonl"
TASKS_V21 = "meta/tasks.jsonl"
TASKS_V30 = "meta/tasks.parquet"
EPISODES_V30 = "meta/episodes/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
EPISODES_V30_GLOB = "meta/episodes/chunk-*/file-*.parquet"
#: ``info.json``'s ``data_path`` template of each version (a dataset may give its own).
DATA_PATH = {
    "3.0": "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet",
    "2.1": "data/chunk-{episode_chunk:03d}/episode_{episode_index:06d}.parquet",
}
#: ``info.json``'s ``video_path`` template of each version (a dataset may give its own).
VIDEO_PATH = {
    "3.0": "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4",
    "2.1": "videos/chunk-{episode_chunk:03d}/{video_key}/episode_{episode_index:06d}.mp4",
}
#: The v3.0 episodes table's columns naming an episode's data file.
DATA_CHUNK = "data/chunk_index"
DATA_FILE = "data/file_index"

#: The columns every LeRobot dataset has that are not recorded signals, after the recorded ones.
BOOKKEEPING_FEATURES: dict[str, dict[str, Any]] = {
    "timestamp": {"dtype": "float32", "shape": [1], "names": None},
    "frame_index": {"dtype": "int64", "shape": [1], "names": None},
    "episode_index": {"dtype": "int64", "shape": [1], "names": None},
    "index": {"dtype": "int64", "shape": [1], "names": None},
    "task_index": {"dtype": "int64", "shape": [1], "names": None},
}
#: The ``dtype`` of a camera feature (an MP4 per file group) and of a language column.
VIDEO = "video"
LANGUAGE = "language"
#: LeRobot's per-frame language columns: rows that hold from their ``timestamp`` until
#: replaced, and rows present only on the frame they were emitted on.
LANGUAGE_COLUMNS = ("language_persistent", "language_events")
#: The ``dtype`` of a vector (or scalar) feature: a parquet column of these.
VECTOR_DTYPES = (
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


def codebase_version(version: str) -> str:
    """``info.json``'s ``codebase_version`` of layout ``version`` (``"3.0"`` -> ``"v3.0"``)."""
    return f"v{version}"


def layout_version(codebase: str) -> str | None:
    """The layout of a dataset whose ``codebase_version`` is ``codebase``: ``"3.0"`` for any
    ``v3.x``, ``"2.1"`` for any ``v2.x``, None for another."""
    if codebase.startswith("v3"):
        return "3.0"
    if codebase.startswith("v2"):
        return "2.1"
    return None


def _fields(version: str, file: int, episode: int) -> dict[str, int]:
    if version == "2.1":
        return {"episode_chunk": episode // CHUNKS_SIZE, "episode_index": episode}
    return {"chunk_index": file // CHUNKS_SIZE, "file_index": file % CHUNKS_SIZE}


def data_path(version: str, file: int, episode: int) -> str:
    """Path of the data parquet file of file number ``file`` (v3.0) or of episode ``episode``
    (v2.1), relative to the dataset root."""
    return DATA_PATH[version].format(**_fields(version, file, episode))


def video_path(version: str, key: str, file: int, episode: int) -> str:
    """Path of camera feature ``key``'s MP4 of file number ``file`` (v3.0) or of episode
    ``episode`` (v2.1), relative to the dataset root."""
    return VIDEO_PATH[version].format(video_key=key, **_fields(version, file, episode))


def video_column(key: str, name: str) -> str:
    """The v3.0 episodes table's column ``name`` of camera feature ``key``: ``chunk_index``,
    ``file_index``, ``from_timestamp`` or ``to_timestamp``."""
    return f"videos/{key}/{name}"
