"""Sharding episodes across distributed ranks.

Every rank computes the same assignment from the same inputs, without communication:
episodes are taken largest first (ties: dataset order) and each goes to the rank with the
fewest samples so far (ties: lowest rank), the classic longest-processing-time heuristic. The
shards are disjoint and together hold every episode; their sample counts differ by at most
the size of one episode.

DDP needs the same number of batches on every rank, so each rank's index list is brought to
one common length:

* ``ddp_even="pad"`` (default): every rank has ``max`` samples; a shorter rank repeats its own
  first samples (nothing dropped, a few samples seen twice per epoch).
* ``ddp_even="drop"``: every rank has ``min`` samples; a longer rank leaves out samples spread
  evenly over its shard (nothing duplicated, a few samples unseen per epoch).
"""

from __future__ import annotations

import numpy as np

__all__ = ["DDP_EVEN", "assign_episodes", "rank_indices"]

DDP_EVEN = ("pad", "drop")


def assign_episodes(counts: np.ndarray, world_size: int) -> np.ndarray:
    """Rank of every episode, ``int64 (S,)``, balancing sample ``counts (S,)`` over ranks."""
    counts = np.asarray(counts, dtype=np.int64)
    order = np.lexsort((np.arange(len(counts)), -counts))
    load = np.zeros(world_size, dtype=np.int64)
    rank_of = np.empty(len(counts), dtype=np.int64)
    for s in order:
        r = int(np.argmin(load))
        rank_of[s] = r
        load[r] += counts[s]
    return rank_of


def rank_indices(offsets: np.ndarray, rank: int, world_size: int, ddp_even: str) -> np.ndarray:
    """Flat dataset indices that rank ``rank`` of ``world_size`` iterates over.

    Args:
        offsets: ``int64 (S + 1,)`` cumulative per-episode sample counts.
        rank: this process's rank.
        world_size: number of ranks.
        ddp_even: ``"pad"`` or ``"drop"`` (see the module docstring).

    Returns:
        ``int64 (L,)`` flat indices, with the same ``L`` on every rank.
    """
    counts = np.diff(offsets)
    rank_of = assign_episodes(counts, world_size)
    loads = np.bincount(rank_of, weights=counts, minlength=world_size).astype(np.int64)
    mine = np.flatnonzero(rank_of == rank)
    own = (
        np.concatenate([np.arange(offsets[s], offsets[s + 1]) for s in mine])
        if len(mine)
        else np.zeros(0, dtype=np.int64)
    ).astype(np.int64)
    if ddp_even == "pad":
        target = int(loads.max())
        if len(own) == 0:
            # Only when there are fewer non-empty episodes than ranks.
            own = np.arange(offsets[-1], dtype=np.int64)
        reps = -(-target // max(len(own), 1))
        return np.tile(own, reps)[:target]
    target = int(loads.min())
    if target == len(own):
        return own
    keep = np.floor(np.arange(target) * (len(own) / max(target, 1))).astype(np.int64)
    kept: np.ndarray = own[keep]
    return kept
