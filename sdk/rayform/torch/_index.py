"""The sample grid: which (segment, grid step) every flat dataset index stands for.

Built from the manifest alone (each stream's ``t0_ns``/``t1_ns``), never from blobs, so it
costs a few microseconds per segment and no I/O. Times are integers in ns.

For segment ``s`` the grid is ``t_k = start_s + round(k * 1e9 / fps)`` for ``k = 0..n_s-1``:

* ``start_s`` = the first instant at which every requested stream has a record (the latest of
  their first record times);
* ``n_s`` = the number of grid points with ``t_k <= last_s``, where ``last_s`` is the
  earliest of the requested streams' last record times (past it, some stream has ended).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from rayform._checks import is_int
from rayform.errors import InvalidArgumentError, ManifestError, NotFoundError
from rayform.manifest import Segments

if TYPE_CHECKING:
    pass
    from rayform._seams import BlobSource

__all__ = [
    "GridIndex",
    "resolve_keys",
    "build_index",
    "check_table_streams",
    "grid_offsets_ns",
    "select_table",
    "selection_of",
]


def grid_offsets_ns(steps: np.ndarray | int, fps: float) -> np.ndarray:
    """Offsets in ns of grid steps from the grid start: ``round(k * 1e9 / fps)``, ``int64``.

    Computed from ``k`` directly (never by accumulating a period), so there is no drift.
    Negative steps are allowed (they lie before the start).
    """
    k = np.asarray(steps, dtype=np.float64)
    return np.rint(k * (1e9 / fps)).astype(np.int64)


@dataclass(frozen=True)
class GridIndex:
    """Per-segment grids of a dataset, flattened.

    Attributes:
        segments: the selected segments, in dataset order.
        start_ns: ``int64 (S,)`` first grid time of each segment, ns.
        count: ``int64 (S,)`` grid points per segment (0 when the streams never overlap).
        offsets: ``int64 (S + 1,)`` cumulative sample counts: segment ``s`` owns flat indices
            ``offsets[s] .. offsets[s + 1] - 1`` (its grid points, unless ``steps``).
        fps: grid rate in Hz.
        steps: ``None`` (every grid step is a sample), or ``int64 (N,)``: the grid step each
            flat index stands for (``within=``: the steps inside a label's ranges).
    """

    segments: Segments
    start_ns: np.ndarray
    count: np.ndarray
    offsets: np.ndarray
    fps: float
    steps: np.ndarray | None = None

    def __len__(self) -> int:
        return int(self.offsets[-1])

    def locate(self, flat: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Map flat indices ``(N,)`` to ``(segment position (N,), grid step (N,))``."""
        flat = np.asarray(flat, dtype=np.int64)
        seg = np.searchsorted(self.offsets, flat, side="right") - 1
        if self.steps is not None:
            return seg, self.steps[flat]
        return seg, flat - self.offsets[seg]

    @property
    def samples(self) -> np.ndarray:
        """``int64 (S,)`` samples per segment (its grid points, unless ``steps``)."""
        return np.diff(self.offsets)

    def times_ns(self, seg: int, steps: np.ndarray) -> np.ndarray:
        """Grid times in ns of ``steps`` (any shape, may be negative) of segment ``seg``."""
        start_ns: np.int64 = self.start_ns[seg]
        return start_ns + grid_offsets_ns(steps, self.fps)


def build_index(segments: Segments, streams: Sequence[str], fps: float) -> GridIndex:
    """Build the grid of every segment over the named streams (all must be present).

    Args:
        segments: the dataset's segments, in order.
        streams: names of the requested streams (observations and action).
        fps: grid rate in Hz.

    Returns:
        The flattened :class:`GridIndex`.
    """
    n_seg = len(segments)
    # Columns, not objects: a few vectorised passes, whatever the number of segments.
    first = np.full(n_seg, np.iinfo(np.int64).min, dtype=np.int64)
    last = np.full(n_seg, np.iinfo(np.int64).max, dtype=np.int64)
    for name in streams:
        np.maximum(first, segments.stream_field(name, "t0_ns")[1], out=first)
        np.minimum(last, segments.stream_field(name, "t1_ns")[1], out=last)
    span = last - first  # wraps (silently, for arrays) past 2**63 - 1 ns: refused below
    if streams and bool(((span < 0) & (last >= first)).any()):
        raise ManifestError(
            "a segment's streams span more than 2**63 - 1 ns (292 years) between their common "
            "start and end; the manifest's times are not real"
        )
    count = np.where(span >= 0, np.floor(span * (fps / 1e9) + 1e-9).astype(np.int64) + 1, 0)
    # Guard against float rounding: the last grid point must not pass `last`.
    over = (count > 0) & (grid_offsets_ns(np.maximum(count - 1, 0), fps) > span)
    count = count - over.astype(np.int64)
    offsets = np.zeros(n_seg + 1, dtype=np.int64)
    np.cumsum(count, out=offsets[1:])
    return GridIndex(segments, first, count, offsets, float(fps))


# -- the columnar checks EpisodeDataset runs before building the index -----------------------
def select_table(slice_id: str, table: Segments, segment_ids: Sequence[str]) -> Segments:
    """The segments ``segment_ids`` of ``table``, in that order (vectorised lookups)."""
    if isinstance(segment_ids, str):
        raise InvalidArgumentError(
            f"segments={segment_ids!r}: pass a list of segment IDs, e.g. [{segment_ids!r}]"
        )
    ids = list(segment_ids)
    if not ids:
        raise InvalidArgumentError("segments=[] selects no episode: pass at least one segment ID")
    found = table.find(ids)
    if (found < 0).any():
        bad = ids[int(np.flatnonzero(found < 0)[0])]
        raise NotFoundError(
            f"slice {slice_id} has no segment {bad!r}; list them with "
            f"`rayform slices show {slice_id} --segments` or use split_episodes(slice_)"
        )
    uniq, counts = np.unique(found, return_counts=True)
    if (counts > 1).any():
        raise InvalidArgumentError(
            f"segments lists {table[int(uniq[counts > 1][0])].id} twice: list each episode once"
        )
    return table.take(found)


def check_table_streams(
    slice_id: str, table: Segments, names: Sequence[str], action: str | None
) -> dict[str, str]:
    """Every named stream is in every segment (a text stream in at least one) and the action
    is a table (vectorised). Returns the text streams' timings (``"state"``/``"events"``)."""
    available = table.stream_names()
    texts: dict[str, str] = {}
    for name in names:
        present, _ = table.stream_field(name, "t0_ns")
        n_missing = int((~present).sum())
        if n_missing == len(table):
            raise NotFoundError(
                f"stream {name!r} is not in slice {slice_id}; available streams: {', '.join(available)}"
            )
        kinds = table.stream_values(name, "kind")
        if "text" in kinds:
            timings = table.stream_values(name, "quantity")
            if kinds != {"text"} or len(timings) != 1:
                raise ManifestError(
                    f"stream {name!r} of slice {slice_id} is text in some episodes and not in "
                    f"others, or both a state and events ({sorted(kinds | timings)}); the "
                    "slice is inconsistent: report it to its owners"
                )
            # An episode without a subtask or an event simply lacks the stream: it reads as
            # no state ("") or no events ([]).
            texts[name] = timings.pop()
            continue
        if n_missing:
            example = table[int(np.flatnonzero(~present)[0])].id
            raise NotFoundError(
                f"stream {name!r} is missing from {n_missing} of {len(table)} episodes "
                f"(e.g. {example}); select episodes that have it with segments=[...]"
            )
    if action is not None and table.stream_values(action, "kind") != {"table"}:
        kind = "/".join(sorted(table.stream_values(action, "kind")))
        raise InvalidArgumentError(
            f"action={action!r} is a {kind} stream: the action must be a table (vector) stream"
        )
    return texts


def selection_of(slice_: BlobSource) -> dict[str, Any]:
    """``describe()`` keys of a :meth:`~rayform.Slice.select` view: its parent slice, the
    parent's manifest hash and the selection (nothing for a whole slice); for a slice published
    from a selection (``client.slices.create``), its ``lineage`` too."""
    lineage = getattr(slice_, "lineage", None)
    published = {"lineage": lineage} if lineage is not None else {}
    selection, parent = slice_.selection, slice_.parent
    if selection is None or parent is None:
        return published
    return {
        **published,
        "parent_slice": parent.id,
        "parent_manifest_hash": parent.manifest_hash,
        "selection": selection,
    }


def resolve_keys(
    keys: Sequence[Any], n: int, epoch: int
) -> tuple[np.ndarray, list[tuple[int, int]]]:
    """Flat indices ``int64 (N,)`` of dataset keys, and each key's ``(epoch, repeat)`` (its
    transform seed's tags). A key is an index (of ``epoch``, the dataset's current one),
    ``(index, epoch)`` or ``(index, epoch, repeat)``; a negative index counts from ``n``.

    Raises:
        InvalidArgumentError: a key of another form, or an index that is no integer.
        IndexError: an index outside ``0 .. n - 1``.
    """
    flat = np.empty(len(keys), dtype=np.int64)
    tags = []
    for j, key in enumerate(keys):
        if not isinstance(key, tuple):
            i, key_epoch, repeat = key, epoch, 0
        elif len(key) in (2, 3):
            i, key_epoch, repeat = (*key, 0)[:3]
        else:
            raise InvalidArgumentError(
                f"dataset key {key!r}: use an index, (index, epoch) or (index, epoch, repeat)"
            )
        if not is_int(i):
            raise InvalidArgumentError(f"dataset index must be an integer, got {i!r}")
        i = int(i) + n if i < 0 else int(i)
        if not 0 <= i < n:
            raise IndexError(f"index {key!r} out of range for a dataset of {n} samples")
        flat[j] = i
        tags.append((int(key_epoch), int(repeat)))
    return flat, tags
