"""Spans labels in samples: ``obs=[..., "label:events"]`` and ``within="events:grasp_failed"``.

A spans label (docs/curation.md) holds time ranges within an episode: ``[t0_ns, t1_ns)`` with
a name. A dataset reads one like a text *state* stream: at sample time ``t`` its value is the
names of the episode's ranges with ``t0_ns <= t < t1_ns`` (a :class:`SpanNames`, in the label's
order; empty when there are none). ``within=`` keeps only the grid times inside the ranges of a
key (of one name, ``"KEY:NAME"``), every other rule of the grid unchanged.

``label:KEY`` cannot be a stream name: stream names never hold ``:``
(:data:`rayform._ids.STREAM_NAME_RE`), so a slice's streams and its labels never collide.

The label set is read once, as the dataset is built, and each key the dataset reads is kept
as a few flat arrays over the dataset's episodes (:class:`SpanTable`): what a DataLoader worker
receives, a few bytes per range, never the label set. A dataset that reads no spans label
builds none of this.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import numpy as np
from torch.utils.data._utils.collate import default_collate_fn_map

from rayform._seams import BlobSource
from rayform.curation import Labels
from rayform.errors import InvalidArgumentError
from rayform.manifest import Segments
from rayform.slice import Slice
from rayform.torch._index import GridIndex

__all__ = [
    "LABEL_PREFIX",
    "SpanNames",
    "SpanTable",
    "check_within_kept",
    "label_key",
    "parse_within",
    "read_labels",
    "restrict_steps",
    "span_keys",
    "span_table",
    "within_index",
]

#: The prefix of an observation that reads a spans label: ``"label:events"``.
LABEL_PREFIX = "label:"


def label_key(name: str) -> str | None:
    """The label key an observation name reads (``"label:events"`` -> ``"events"``), or
    ``None`` for a stream name."""
    return name[len(LABEL_PREFIX) :] if name.startswith(LABEL_PREFIX) else None


class SpanNames(list[str]):
    """The names of the ranges a sample time lies in (empty: none), in the label's order."""

    __slots__ = ()


def _collate_names(batch: list[SpanNames], *, collate_fn_map: object = None) -> list[list[str]]:
    return [list(names) for names in batch]


# Lists of different lengths: default_collate would refuse them as a plain list.
default_collate_fn_map.setdefault(SpanNames, _collate_names)


@dataclasses.dataclass(frozen=True, eq=False)
class SpanTable:
    """One spans label over a dataset's episodes, flat.

    Attributes:
        key: the label key.
        offsets: ``int64 (S + 1,)``: episode ``s`` (dataset order) holds ranges
            ``offsets[s] .. offsets[s + 1] - 1``.
        t0_ns, t1_ns: ``int64 (N,)`` each range's half-open bounds, ns since the Unix epoch.
        name: ``int32 (N,)`` each range's name, an index into ``names``.
        names: the distinct names.
    """

    key: str
    offsets: np.ndarray
    t0_ns: np.ndarray
    t1_ns: np.ndarray
    name: np.ndarray
    names: tuple[str, ...]

    def names_at(self, s: int, t_ns: np.ndarray) -> list[SpanNames]:
        """Per time of ``t_ns (M,)``, the names of episode ``s``'s ranges holding it."""
        a, b = int(self.offsets[s]), int(self.offsets[s + 1])
        if a == b:
            return [SpanNames() for _ in range(len(t_ns))]
        t = np.asarray(t_ns, dtype=np.int64)[:, None]
        inside = (self.t0_ns[None, a:b] <= t) & (t < self.t1_ns[None, a:b])  # (M, k), k <= 256
        names, ids = self.names, self.name[a:b]
        return [SpanNames(names[j] for j in ids[row].tolist()) for row in inside]


def read_labels(slice_: BlobSource, labels: object) -> Labels:
    """The label set a dataset's spans read: ``labels`` itself, the version of that hash, or the
    slice's latest (``None``)."""
    if not isinstance(slice_, Slice):
        raise InvalidArgumentError(
            f"label observations and within= read the slice's labels, and {type(slice_).__name__} "
            "has none: use a slice from rayform.Client().slices.get(...)"
        )
    if isinstance(labels, Labels):
        if labels.manifest_hash != slice_.manifest_hash or labels.slice_id != slice_.id:
            raise InvalidArgumentError(
                f"labels= annotates {labels.slice_id} manifest {labels.manifest_hash[:12]}..., "
                f"not this dataset's {slice_.id} manifest {slice_.manifest_hash[:12]}...: pass "
                "slice_.labels of the same slice"
            )
        return labels
    if labels is None:
        return slice_.labels
    if isinstance(labels, str):
        return slice_.labels_at(labels)
    raise InvalidArgumentError(
        f"labels={labels!r}: pass slice_.labels, a label-set hash, or None for the latest"
    )


def _spans_keys(labels: Labels) -> str:
    keys = sorted(k for k, kind in labels.kinds.items() if kind == "spans")
    return ", ".join(keys) if keys else "none"


def span_table(labels: Labels, key: str, segments: Segments, what: str) -> SpanTable:
    """The ranges of spans label ``key`` over ``segments`` (the dataset's episodes, in order).

    Raises:
        InvalidArgumentError: ``key`` is not a spans label of ``labels`` (the message lists the
            spans keys there are; ``what`` names the argument that asked).
    """
    kind = labels.kinds.get(key)
    if kind != "spans":
        found = "is not a label" if kind is None else f"holds {kind} values, not time ranges"
        raise InvalidArgumentError(
            f"{what}: {key!r} {found} of slice {labels.slice_id} (labels version "
            f"{labels.version}); its spans labels: {_spans_keys(labels)}. Mark ranges with "
            f"slice_.label(episode, {key}=[(t0_ns, t1_ns, 'name')])"
        )
    ids, rows = [], []
    for episode, row in labels.items():
        if key in row:
            ids.append(episode)
            rows.append(labels.spans(episode, key))
    pos = segments.find(ids) if ids else np.zeros(0, dtype=np.int64)
    order = [i for i in np.argsort(pos, kind="stable").tolist() if pos[i] >= 0]
    counts = np.zeros(len(segments), dtype=np.int64)
    names: dict[str, int] = {}
    t0: list[int] = []
    t1: list[int] = []
    nm: list[int] = []
    for i in order:
        counts[pos[i]] = len(rows[i])
        for a, b, n in rows[i]:
            t0.append(a)
            t1.append(b)
            nm.append(names.setdefault(n, len(names)))
    offsets = np.zeros(len(segments) + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    return SpanTable(
        key,
        offsets,
        np.asarray(t0, dtype=np.int64),
        np.asarray(t1, dtype=np.int64),
        np.asarray(nm, dtype=np.int32),
        tuple(names),
    )


def parse_within(within: object) -> tuple[str, str | None]:
    """``(key, name or None)`` of ``within="KEY"`` or ``within="KEY:NAME"``."""
    if not isinstance(within, str) or not within:
        raise InvalidArgumentError(
            f"within={within!r}: name a spans label, 'KEY' (inside any of its ranges) or "
            "'KEY:NAME' (inside its ranges of that name), e.g. within='events:grasp_failed'"
        )
    key, colon, name = within.partition(":")
    if colon and not name:
        raise InvalidArgumentError(f"within={within!r}: give a range name after ':' or none")
    return key, (name if colon else None)


def restrict_steps(
    table: SpanTable,
    name: str | None,
    start_ns: np.ndarray,
    count: np.ndarray,
    grid_ns: Callable[[int, np.ndarray], np.ndarray],
) -> tuple[np.ndarray, np.ndarray]:
    """The grid steps inside ``table``'s ranges (of ``name``; any when ``None``).

    Args:
        table: the label's ranges over the dataset's episodes.
        name: the range name to keep, or ``None`` for every range.
        start_ns: ``int64 (S,)`` each episode's grid start.
        count: ``int64 (S,)`` each episode's grid points.
        grid_ns: ``grid_ns(s, steps)``: the grid times in ns of episode ``s``'s steps.

    Returns:
        ``(kept (S,), steps (N,))``: samples kept per episode, and the kept grid steps of every
        episode in turn, ascending within each (so the dataset's order is the grid's).
    """
    wanted = None if name is None else table.names.index(name) if name in table.names else -1
    kept = np.zeros(len(count), dtype=np.int64)
    parts: list[np.ndarray] = []
    for s in np.flatnonzero(np.diff(table.offsets) > 0).tolist():
        a, b = int(table.offsets[s]), int(table.offsets[s + 1])
        use = slice(a, b)
        t0, t1 = table.t0_ns[use], table.t1_ns[use]
        if wanted is not None:
            pick = table.name[use] == wanted
            t0, t1 = t0[pick], t1[pick]
        n = int(count[s])
        if n == 0 or len(t0) == 0:
            continue
        t = grid_ns(s, np.arange(n))
        lo = np.searchsorted(t, t0, side="left")
        hi = np.searchsorted(t, t1, side="left")
        mark = np.zeros(n + 1, dtype=np.int64)  # +1 at a range's first step, -1 past its last
        np.add.at(mark, lo, 1)
        np.add.at(mark, hi, -1)
        steps = np.flatnonzero(np.cumsum(mark[:n]) > 0)
        kept[s] = len(steps)
        parts.append(steps.astype(np.int64))
    steps_all = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
    return kept, steps_all


def check_within_kept(kept: np.ndarray, table: SpanTable, within: str) -> None:
    """Refuse a ``within=`` that keeps no sample (the message says what the label holds)."""
    if int(kept.sum()) == 0:
        held = ", ".join(repr(n) for n in table.names) or "none"
        raise InvalidArgumentError(
            f"within={within!r} keeps no sample: no grid time of the dataset's episodes lies "
            f"inside such a range of label {table.key!r} ({len(table.t0_ns)} ranges over "
            f"{int((np.diff(table.offsets) > 0).sum())} episodes; their names: {held})"
        )


def span_keys(names: Sequence[str]) -> list[str]:
    """The observation names of ``names`` that read labels."""
    return [n for n in names if label_key(n) is not None]


def within_index(index: GridIndex, table: SpanTable, within: tuple[str, str | None]) -> GridIndex:
    """``index`` with only the grid steps inside ``table``'s ranges (of ``within``'s name) as
    samples: each episode's grid (its start and points, so action chunks and padding) unchanged,
    the order that of the grid.

    Raises:
        InvalidArgumentError: no sample is left.
    """
    key, name = within
    kept, steps = restrict_steps(table, name, index.start_ns, index.count, index.times_ns)
    check_within_kept(kept, table, key if name is None else f"{key}:{name}")
    offsets = np.zeros(len(kept) + 1, dtype=np.int64)
    np.cumsum(kept, out=offsets[1:])
    return dataclasses.replace(index, offsets=offsets, steps=steps)
