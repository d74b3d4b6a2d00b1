"""The language of a LeRobot episode as text streams: its tasks and its language columns.

* **Tasks.** Every frame has a ``task_index`` into the tasks table; an episode may hold
  several. The ``task`` stream (a *state*) has one record per run of frames with the same
  task, at the run's first frame: the record in force at a frame's time is that frame's task.
* **``language_persistent``** (LeRobot 0.6.1): per frame, rows ``{role, content, style,
  timestamp, camera, tool_calls}`` that hold from their ``timestamp`` (s, episode-relative)
  until replaced. The distinct rows of the episode become one *state* stream per ``style``
  (``language/subtask``, ``language/plan``...), each row at its ``timestamp``.
* **``language_events``**: per frame, rows ``{role, content, style, camera, tool_calls}``
  emitted on that frame. They become one *events* stream per ``style``
  (``language/interjection``, ``language/vqa``...), each row at its frame's time.

A ``timestamp`` within ``SNAP_TOLERANCE_S`` of a frame (``k / fps``) is stored at that
frame's time in ns, as the frames are, so a subtask that starts on a frame is in force on it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from rayform.errors import InvalidArgumentError
from rayform.lerobot_layout import LANGUAGE_COLUMNS
from rayform_server.builder import TextData
from rayform_server.ingest._common import sanitize_stream_name

__all__ = ["TEXT_FEATURES", "episode_text_streams"]

#: What ``--stream NAME=FEATURE`` may name besides video and vector features: ``task`` (NAME is
#: the stream), and a language column or ``language`` for both (NAME is the prefix of their
#: per-style streams).
TEXT_FEATURES = ("task", "language", *LANGUAGE_COLUMNS)
_FIELDS = ("role", "style", "camera", "tool_calls")


def _record(row: dict[str, Any], where: str) -> dict[str, Any]:
    content = row.get("content")
    # LeRobot's schema lets content be null: a row that is only a tool call (its speech rows,
    # the ``say`` tool) has none, and keeps it null here.
    if content is not None and not isinstance(content, str):
        raise InvalidArgumentError(
            f"{where}: a language row's content must be a string or null, got "
            f"{type(content).__name__}"
        )
    out: dict[str, Any] = {"content": content}
    for key in _FIELDS:
        value = row.get(key)
        if key == "tool_calls":
            # LeRobot writes a list of calls; anything else is kept as the one call.
            value = value if value is None or isinstance(value, list) else [value]
        elif value is not None:
            value = str(value)
        out[key] = value
    return out


def _times_ns(seconds: np.ndarray, fps: float, snap: bool, tolerance_s: float) -> np.ndarray:
    k = np.rint(seconds * fps)
    on_grid = np.abs(seconds - k / fps) <= tolerance_s
    exact = np.rint(seconds * 1e9).astype(np.int64)
    if not snap:
        return exact
    # Same arithmetic as the frames' snapped times (_row_times_ns).
    return np.where(on_grid, np.rint(k * (1e9 / fps)).astype(np.int64), exact)


def _task_stream(
    name: str, rows: pa.Table, t_ns: np.ndarray, tasks: dict[int, str], fps: float, where: str
) -> TextData:
    index = rows.column("task_index").to_numpy().astype(np.int64)
    starts = np.flatnonzero(np.r_[True, index[1:] != index[:-1]])
    records: list[dict[str, object]] = []
    for i in starts.tolist():
        task = tasks.get(int(index[i]))
        if task is None:
            raise InvalidArgumentError(
                f"{where}: frame {i} has task_index {int(index[i])}, which the tasks table "
                f"lacks (it holds {sorted(tasks)[:20]})"
            )
        records.append({"content": task, "role": "user", "style": "task"})
    return TextData(name, t_ns[starts], records, rate_hz=fps, timing="state")


def _by_style(
    prefix: str, items: Sequence[tuple[int, dict[str, Any]]], timing: str, fps: float
) -> list[TextData]:
    styles: dict[str | None, list[tuple[int, dict[str, Any]]]] = {}
    for t, record in items:
        styles.setdefault(record["style"], []).append((t, record))
    out = []
    for style, rows in styles.items():
        rows.sort(key=lambda tr: tr[0])  # stable: rows of one time keep their order
        word = style or ("persistent" if timing == "state" else "events")
        out.append(
            TextData(
                sanitize_stream_name([*prefix.split("/"), word]),
                np.array([t for t, _ in rows], dtype=np.int64),
                [r for _, r in rows],
                rate_hz=fps,
                timing=timing,
            )
        )
    return out


def episode_text_streams(
    streams: dict[str, str],
    rows: pa.Table,
    t_ns: np.ndarray,
    *,
    tasks: dict[int, str] | None,
    fps: float,
    snap: bool,
    tolerance_s: float,
    where: str,
) -> list[TextData]:
    """The text streams of one episode.

    Args:
        streams: ``{name: feature}`` of the text features to ingest (:data:`TEXT_FEATURES`).
        rows: the episode's rows, in frame order, with ``task_index`` and the language columns.
        t_ns: ``int64 (N,)`` the rows' times, ns.
        tasks: the tasks table (``None``: the dataset has none).
        fps: the dataset's rate, Hz.
        snap: whether the rows' times were snapped onto ``frame_index / fps``.
        tolerance_s: how near a frame a persistent row's ``timestamp`` snaps onto it.
        where: names the episode in errors.
    """
    out: list[TextData] = []
    for name, feature in streams.items():
        if feature == "task":
            if tasks is None:
                raise InvalidArgumentError(
                    f"{where}: the dataset has no meta/tasks.parquet or meta/tasks.jsonl to "
                    "read its tasks from; drop the task stream"
                )
            out.append(_task_stream(name, rows, t_ns, tasks, fps, where))
            continue
        both = [c for c in LANGUAGE_COLUMNS if c in rows.column_names]
        for column_name in both if feature == "language" else [feature]:
            out += _language_streams(name, column_name, rows, t_ns, fps, snap, tolerance_s, where)
    names = [d.name for d in out]
    for d in out:
        if names.count(d.name) > 1:
            raise InvalidArgumentError(
                f"{where}: language_persistent and language_events both have style rows that "
                f"map to stream {d.name!r}: give them different prefixes, e.g. --stream "
                "language=language_persistent --stream events=language_events"
            )
    return out


def _language_streams(
    name: str,
    feature: str,
    rows: pa.Table,
    t_ns: np.ndarray,
    fps: float,
    snap: bool,
    tolerance_s: float,
    where: str,
) -> list[TextData]:
    """The per-style streams of one language column, named ``name/<style>``."""
    column = rows.column(feature).to_pylist()
    items: list[tuple[int, dict[str, Any]]] = []
    if feature == "language_persistent":
        seen: dict[str, tuple[float, dict[str, Any]]] = {}
        for frame in column:
            for row in frame or ():
                ts = row.get("timestamp")
                if isinstance(ts, bool) or not isinstance(ts, (int, float)):
                    raise InvalidArgumentError(
                        f"{where}: a language_persistent row needs a timestamp (s), got {ts!r}"
                    )
                record = _record(row, where)
                # Each frame repeats the rows in force; one record per distinct row.
                seen.setdefault(json.dumps([ts, record], sort_keys=True), (ts, record))
        times = _times_ns(
            np.array([ts for ts, _ in seen.values()], np.float64), fps, snap, tolerance_s
        )
        items = list(zip(times.tolist(), [r for _, r in seen.values()], strict=True))
        return _by_style(name, items, "state", fps)
    for i, frame in enumerate(column):
        items += [(int(t_ns[i]), _record(row, where)) for row in frame or ()]
    return _by_style(name, items, "events", fps)
