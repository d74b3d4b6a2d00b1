"""Time alignment of records to grid times (all times int64 ns, vectorised with numpy).

* Observations: the latest record at or before ``t`` (never a future record).
* Actions: ``"hold"`` (sample-and-hold = latest at or before), ``"nearest"`` (closest record,
  ties to the earlier one) or ``"linear"`` (interpolated between the records around ``t``,
  clamped to the first/last record outside the recorded range).
"""

from __future__ import annotations

import numpy as np

__all__ = ["ACTION_MODES", "align_values", "latest_at_or_before"]

ACTION_MODES = ("hold", "nearest", "linear")


def latest_at_or_before(t_rec: np.ndarray, t_query: np.ndarray) -> np.ndarray:
    """Index of the latest record with ``t_rec <= t_query``, for every query.

    Args:
        t_rec: record times, ns, ``int64 (N,)`` strictly increasing.
        t_query: query times, ns, ``int64`` of any shape.

    Returns:
        ``int64`` indices of the same shape as ``t_query``; clamped to 0 for queries before
        the first record (the grid never asks for those).
    """
    idx = np.searchsorted(t_rec, t_query, side="right") - 1
    return np.maximum(idx, 0)


def align_values(
    t_rec: np.ndarray, values: np.ndarray, t_query: np.ndarray, mode: str
) -> np.ndarray:
    """Values of a time series at query times.

    Args:
        t_rec: record times, ns, ``int64 (N,)``.
        values: records ``(N, D)``.
        t_query: query times, ns, ``int64 (M,)``.
        mode: ``"hold"``, ``"nearest"`` or ``"linear"``.

    Returns:
        ``float32 (M, D)``.
    """
    lo = latest_at_or_before(t_rec, t_query)
    if mode == "hold" or len(t_rec) == 1:
        held: np.ndarray = values[lo].astype(np.float32, copy=False)
        return held
    hi = np.minimum(lo + 1, len(t_rec) - 1)
    t_lo, t_hi = t_rec[lo], t_rec[hi]
    if mode == "nearest":
        pick = np.where((t_hi - t_query) < (t_query - t_lo), hi, lo)
        pick = np.where(t_query < t_rec[0], 0, pick)
        return values[pick].astype(np.float32, copy=False)
    if mode == "linear":
        span = (t_hi - t_lo).astype(np.float64)
        w = np.where(span > 0, (t_query - t_lo) / np.where(span > 0, span, 1.0), 0.0)
        w = np.clip(w, 0.0, 1.0)[:, None]
        v_lo = values[lo].astype(np.float64)
        v_hi = values[hi].astype(np.float64)
        blended: np.ndarray = (v_lo + w * (v_hi - v_lo)).astype(np.float32)
        return blended
    raise ValueError(f"unknown action mode {mode!r}")
