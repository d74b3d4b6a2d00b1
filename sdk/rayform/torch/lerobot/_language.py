"""A slice's text streams in an exported LeRobot dataset: its tasks and language columns.

* **Tasks.** The ``task`` text stream (a state) gives each row the task in force at the
  row's time (the dataset's own rule); ``meta/tasks`` lists the slice's distinct tasks, most
  episodes first (``Slice.tasks()``' order), and a row before an episode's first task record
  (or in an episode without one) gets the fallback task (``task=``, default: the slice ID).
  ``task=`` given without a task stream, or given explicitly, is every row's task, as before.
* **``language_persistent``** (LeRobot 0.6.1): every row of an episode lists the episode's
  records of every other state text stream (``language/subtask``, ``language/plan``...): each
  ``{role, content, style, timestamp, camera, tool_calls}``, ``timestamp`` in s from the
  episode's first row (the record in force at the first row is at 0).
* **``language_events``**: row ``k`` lists the records of every events text stream in its
  grid step, ``(t_{k-1}, t_k]``, without a timestamp.

A record's ``style`` is kept; a record without one gets its stream's last word
(``language/vqa`` -> ``vqa``). ``tool_calls`` are strings in the parquet file: a call that is
not a string is written as its JSON.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from rayform.errors import InvalidArgumentError
from rayform.format import decode_text
from rayform.lerobot_layout import LANGUAGE, LANGUAGE_COLUMNS
from rayform.torch._text import events_in, state_at

if TYPE_CHECKING:
    from rayform._seams import BlobSource
    from rayform.manifest import Segment, Stream
    from rayform.slice import Slice

#: ``stream -> (t_ns (N,), records)``: a text stream's blob read and decoded.
TextLoader = Callable[["Stream"], tuple[np.ndarray, list[dict[str, Any]]]]

__all__ = ["LANGUAGE_FEATURES", "Language", "language_column", "pick_language"]

_ROW = [
    ("role", pa.string()),
    ("content", pa.string()),
    ("style", pa.string()),
    ("timestamp", pa.float32()),
    ("camera", pa.string()),
    ("tool_calls", pa.list_(pa.string())),
]
#: Arrow types of LeRobot 0.6.1's language columns (one list of rows per frame).
LANGUAGE_TYPES = dict(
    zip(
        LANGUAGE_COLUMNS,  # language_persistent, language_events
        (
            pa.list_(pa.struct(_ROW)),
            pa.list_(pa.struct([f for f in _ROW if f[0] != "timestamp"])),
        ),
        strict=True,
    )
)
#: Their ``info.json`` features.
LANGUAGE_FEATURES = {k: {"dtype": LANGUAGE, "shape": [1], "names": None} for k in LANGUAGE_TYPES}
_TARGETS = ("task", *LANGUAGE_TYPES)


@dataclass(frozen=True)
class Language:
    """What an export writes of the slice's text streams.

    Attributes:
        task_stream: the state stream the rows' tasks come from (``None``: every row has the
            fallback task).
        tasks: the task stream's distinct tasks, in ``task_index`` order.
        fallback: the task of a row without one, last in the tasks table; ``None`` when no
            row needs it.
        persistent: state streams listed in ``language_persistent``.
        events: events streams listed in ``language_events``.
    """

    task_stream: str | None
    tasks: tuple[str, ...]
    fallback: str | None
    persistent: tuple[str, ...] = ()
    events: tuple[str, ...] = ()

    @property
    def table(self) -> list[str]:
        """``meta/tasks``: the tasks, then the fallback where a row needs it."""
        return [*self.tasks, *([self.fallback] if self.fallback is not None else [])]

    def needing_fallback(self, segments: list[Segment], start_ns: list[int]) -> Language:
        """This, with the fallback kept only if an episode (``segments``, their first row
        times ``start_ns``) has a row before its first task record, or no task stream."""
        if self.task_stream is None:
            return self
        needed = any(
            self.task_stream not in seg.streams or seg.streams[self.task_stream].t0_ns > t0
            for seg, t0 in zip(segments, start_ns, strict=True)
        )
        return dataclasses.replace(self, fallback=self.fallback if needed else None)

    @property
    def columns(self) -> dict[str, dict[str, Any]]:
        """The language features the rows have."""
        return {
            k: v
            for k, v in LANGUAGE_FEATURES.items()
            if (self.persistent if k == "language_persistent" else self.events)
        }

    def to_json(self) -> dict[str, Any]:
        return {
            "task_stream": self.task_stream,
            "tasks": self.table,
            "persistent": list(self.persistent),
            "events": list(self.events),
        }

    def rows(
        self, seg: Segment, t: np.ndarray, t_prev: np.ndarray, load: TextLoader
    ) -> dict[str, np.ndarray]:
        """One episode's ``task_index (N,) int64`` and language columns (object arrays of
        per-row lists) at its row times ``t`` (``t_prev``: each row's previous grid time)."""
        index = {task: i for i, task in enumerate(self.tasks)}
        out: dict[str, np.ndarray] = {}
        if self.task_stream is None or self.task_stream not in seg.streams:
            out["task_index"] = np.full(len(t), len(self.tasks), dtype=np.int64)
        else:
            t_rec, records = load(seg.streams[self.task_stream])
            names = state_at(t_rec, records, t)
            out["task_index"] = np.array(
                [index[n] if n else len(self.tasks) for n in names], dtype=np.int64
            )
        if self.persistent:
            rows: list[dict[str, Any]] = []
            for name in self.persistent:
                if name not in seg.streams:
                    continue
                t_rec, records = load(seg.streams[name])
                # From the record in force at the first row on (earlier ones never show).
                first = max(int(np.searchsorted(t_rec, t[0], side="right")) - 1, 0)
                for when, r in zip(t_rec[first:].tolist(), records[first:], strict=True):
                    seconds = max(when - int(t[0]), 0) / 1e9
                    rows.append(_row(r, name, timestamp=seconds))
            rows.sort(key=lambda r: r["timestamp"])
            out["language_persistent"] = _per_row([rows] * len(t))
        if self.events:
            steps: list[list[dict[str, Any]]] = [[] for _ in range(len(t))]
            for name in self.events:
                if name not in seg.streams:
                    continue
                t_rec, records = load(seg.streams[name])
                for k, found in enumerate(events_in(t_rec, records, t_prev, t)):
                    steps[k] += [_row(r, name) for r in found]
            out["language_events"] = _per_row(steps)
        return out


def _per_row(values: list[list[dict[str, Any]]]) -> np.ndarray:
    out = np.empty(len(values), dtype=object)
    out[:] = values
    return out


def _style_of(stream: str) -> str | None:
    """The style a record without one takes from its stream's name (``language/subtask``:
    ``subtask``); none from the names ingest gives rows that came without a style."""
    word = stream.rsplit("/", 1)[-1]
    return None if word in ("events", "persistent") else word


def _row(record: Mapping[str, Any], stream: str, **extra: object) -> dict[str, Any]:
    calls = record.get("tool_calls")
    return {
        "role": record.get("role"),
        "content": record["content"],
        "style": record.get("style") or _style_of(stream),
        **extra,
        "camera": record.get("camera"),
        "tool_calls": None
        if calls is None
        else [c if isinstance(c, str) else json.dumps(c, sort_keys=True) for c in calls],
    }


def language_column(key: str, values: np.ndarray) -> pa.Array:
    """A language column of the data parquet file from its per-row lists."""
    return pa.array(list(values), type=LANGUAGE_TYPES[key])


def pick_language(
    slice_: Slice, streams: Mapping[str, str] | None, task: str | None
) -> tuple[Language, set[str]]:
    """The export's :class:`Language`, and the text streams it uses (which the features do
    not export).

    ``streams`` (``{stream: feature}``) may map a text stream to ``task``,
    ``language_persistent`` or ``language_events``; without ``streams``, the ``task`` stream
    is the task and every other text stream goes to the language column of its timing.

    Raises:
        InvalidArgumentError: a text stream mapped elsewhere, a task or events stream mapped to
            the wrong column, or two task streams.
    """
    texts = slice_.text_streams()
    timing = {n: _timing(slice_, n) for n in texts}
    if streams:
        chosen = {s: f for s, f in streams.items() if s in timing}
        for name, feature in chosen.items():
            if feature not in _TARGETS:
                raise InvalidArgumentError(
                    f"--stream {name}={feature}: {name!r} is a text stream; map it to one of "
                    f"{', '.join(_TARGETS)}"
                )
    else:
        chosen = {
            n: "task" if n == "task" else f"language_{'persistent' if t == 'state' else 'events'}"
            for n, t in timing.items()
        }
    task_streams = [n for n, f in chosen.items() if f == "task"]
    if len(task_streams) > 1:
        raise InvalidArgumentError(f"streams {task_streams} are all mapped to task: map one")
    for name, feature in chosen.items():
        want = "events" if feature == "language_events" else "state"
        if timing[name] != want:
            raise InvalidArgumentError(
                f"--stream {name}={feature}: {name!r} holds {timing[name]}, and {feature} "
                f"holds {want} records; map it to "
                f"{'language_events' if timing[name] == 'events' else 'task or language_persistent'}"
            )
    fallback = task or slice_.id
    lang_task: str | None = None
    tasks: tuple[str, ...] = ()
    if task is None and task_streams:
        lang_task = task_streams[0]
        tasks = tuple(t for t, _ in slice_.tasks(lang_task))
    language = Language(
        lang_task,
        tasks,
        fallback,
        tuple(n for n, f in chosen.items() if f == "language_persistent"),
        tuple(n for n, f in chosen.items() if f == "language_events"),
    )
    return language, set(chosen)


def _timing(slice_: Slice, name: str) -> str:
    values = slice_.segments.stream_values(name, "quantity")
    return "events" if values == {"events"} else "state"


def load_text(slice_: BlobSource) -> TextLoader:
    """``stream -> (t_ns (N,), records)`` of a text stream of ``slice_`` (its blob read)."""

    def load(stream: Stream) -> tuple[np.ndarray, list[dict[str, Any]]]:
        data = slice_.blob_path(stream.blob).read_bytes()
        return decode_text(data, stream.t0_ns, what=f"text blob {stream.blob.hash[:12]}")

    return load
