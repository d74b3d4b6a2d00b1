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

import numpy as np

from rayform.manifest import Segment

__all__ = ["GridIndex", "build_index", "grid_offsets_ns"]


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
        offsets: ``int64 (S + 1,)`` cumulative counts: segment ``s`` owns flat indices
            ``offsets[s] .. offsets[s + 1] - 1``.
        fps: grid rate in Hz.
    """

    segments: tuple[Segment, ...]
    start_ns: np.ndarray
    count: np.ndarray
    offsets: np.ndarray
    fps: float

    def __len__(self) -> int:
        return int(self.offsets[-1])

    def locate(self, flat: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Map flat indices ``(N,)`` to ``(segment position (N,), grid step (N,))``."""
        flat = np.asarray(flat, dtype=np.int64)
        seg = np.searchsorted(self.offsets, flat, side="right") - 1
        return seg, flat - self.offsets[seg]

    def times_ns(self, seg: int, steps: np.ndarray) -> np.ndarray:
        """Grid times in ns of ``steps`` (any shape, may be negative) of segment ``seg``."""
        return self.start_ns[seg] + grid_offsets_ns(steps, self.fps)


def build_index(segments: Sequence[Segment], streams: Sequence[str], fps: float) -> GridIndex:
    """Build the grid of every segment over the named streams (all must be present).

    Args:
        segments: the dataset's segments, in order.
        streams: names of the requested streams (observations and action).
        fps: grid rate in Hz.

    Returns:
        The flattened :class:`GridIndex`.
    """
    n_seg = len(segments)
    first = np.empty(n_seg, dtype=np.int64)
    last = np.empty(n_seg, dtype=np.int64)
    for i, seg in enumerate(segments):
        recs = seg.streams
        first[i] = max(recs[name].t0_ns for name in streams)
        last[i] = min(recs[name].t1_ns for name in streams)
    span = last - first
    count = np.where(span >= 0, np.floor(span * (fps / 1e9) + 1e-9).astype(np.int64) + 1, 0)
    # Guard against float rounding: the last grid point must not pass `last`.
    over = (count > 0) & (grid_offsets_ns(np.maximum(count - 1, 0), fps) > span)
    count = count - over.astype(np.int64)
    offsets = np.zeros(n_seg + 1, dtype=np.int64)
    np.cumsum(count, out=offsets[1:])
    return GridIndex(tuple(segments), first, count, offsets, float(fps))
