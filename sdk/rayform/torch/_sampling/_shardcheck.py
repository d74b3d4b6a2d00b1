"""Noticing a DDP run whose loader does not shard: every rank would train on the whole epoch.

Under ``torchrun`` a ``DataLoader(dataset, shuffle=True)`` gives every rank every sample (as for
any map-style dataset), which silently multiplies the epoch by the world size. A sharding
sampler (``EpisodeSampler``, or ``DistributedSampler``) never lets one rank read more than
``ceil(len / world_size)`` distinct indices in an epoch. So, in a rank of a world larger than
one, the dataset counts the distinct plain-integer indices its loader asks for in the current
epoch (``EpisodeSampler``'s keys are exempt: it shards by construction) and warns once, with
the fix, when that count passes the bound by more than one batch (through the
``rayform.torch`` logger, from the rank's first worker).

The count is shared by the rank's forked DataLoader workers through anonymous shared memory
(each worker reads part of the rank's indices): one byte per index (indices past
:data:`MAX_SLOTS` share slots, which can only undercount) and one counter per worker. Counting
stops for the epoch at the first index read twice (a sampler that pads, or a new epoch begun
without ``dataset.set_epoch``), so a sharding sampler is never blamed.

A dataset that an :class:`~rayform.torch.EpisodeSampler` was built for but whose loader asks
for plain-integer batches had its sampler swapped behind the user's back: Ray Train's
``prepare_data_loader`` rebuilds the loader with a ``DistributedSampler`` (by sample: nothing
lost, but episode sharding, read-ahead and exact resume are). Rank 0 says so once, with the fix.
"""

from __future__ import annotations

import logging
import mmap
from typing import Any

import numpy as np
import torch.distributed as dist

__all__ = ["ShardCheck", "shard_check"]

log = logging.getLogger("rayform.torch")

#: Bytes of the seen-map at most (one per index): 16 MiB of shared memory, touched as used.
MAX_SLOTS = 1 << 24
_COUNTERS = 64
_HEADER = 8 * (_COUNTERS + 2)  # counters, then the epoch, then flags (stopped, warned)


class ShardCheck:
    """The per-rank count of distinct indices read in an epoch (see the module doc).

    Args:
        length: samples in the dataset (all ranks together).
        rank: this process's rank.
        world: the world size (> 1).
    """

    def __init__(self, length: int, rank: int, world: int) -> None:
        self.length, self.rank, self.world = int(length), int(rank), int(world)
        self.bound = -(-self.length // self.world)
        self._slots = max(1, min(self.length, MAX_SLOTS))
        self._map: mmap.mmap | None = mmap.mmap(-1, _HEADER + self._slots)
        self._seen = np.frombuffer(self._map, dtype=np.uint8, offset=_HEADER)
        self._head = np.frombuffer(self._map, dtype=np.int64, count=_COUNTERS + 2)
        self._followed = False  # an EpisodeSampler was built for the dataset
        self._told_swap = False

    def follow(self) -> None:
        """An :class:`~rayform.torch.EpisodeSampler` was built over the dataset (before fork)."""
        self._followed = True

    def __getstate__(self) -> dict[str, Any]:
        # A spawned worker cannot share the parent's map: it does not count.
        return {"length": self.length, "rank": self.rank, "world": self.world, "off": True}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.length, self.rank, self.world = state["length"], state["rank"], state["world"]
        self.bound, self._slots, self._map = -(-self.length // self.world), 1, None
        self._followed = self._told_swap = False

    def saw(self, flat: np.ndarray, epoch: int, worker: int) -> None:
        """Count the indices ``flat`` (int64) that a loader asked for in ``epoch``.

        Args:
            flat: dataset indices of one batch, plain integers from a non-``EpisodeSampler``.
            epoch: the dataset's current epoch.
            worker: the DataLoader worker id (-1 in the main process).
        """
        if self._map is None or not len(flat):
            return
        if self._followed and len(flat) > 1 and not self._told_swap:
            self._told_swap = True
            if self.rank == 0 and worker <= 0:
                log.warning(
                    "this EpisodeDataset has an EpisodeSampler, but its DataLoader reads it with "
                    "another sampler (plain indices, by sample): ray.train.torch."
                    "prepare_data_loader(loader) replaces the sampler with a DistributedSampler "
                    "when there are several workers. Use rayform.ray.prepare_data_loader(loader), "
                    "or ray.train.torch.prepare_data_loader(loader, add_dist_sampler=False), to "
                    "keep sharding by episode, read-ahead and exact resume (docs/ray.md)"
                )
        head = self._head
        if head[_COUNTERS] != epoch:  # a new epoch: start again (set_epoch was called)
            self._seen[:] = 0
            head[:_COUNTERS] = 0
            head[_COUNTERS] = epoch
            head[_COUNTERS + 1] &= 2  # keep "warned"
        if head[_COUNTERS + 1]:
            return
        slots = flat % self._slots
        if self._seen[slots].any() or len(np.unique(slots)) < len(slots):
            head[_COUNTERS + 1] |= 1  # an index read twice: stop counting this epoch
            return
        self._seen[slots] = 1
        head[worker % _COUNTERS] += len(slots)
        distinct = int(head[:_COUNTERS].sum())
        # One process speaks for the rank (the first worker, or the main process without
        # workers): it reads on after the crossing, and two workers never both warn.
        if distinct > self.bound + len(flat) and worker <= 0:
            head[_COUNTERS + 1] |= 3
            log.warning(
                "rank %d of %d has read %d distinct samples this epoch, more than its share "
                "(%d of %d): the DataLoader's sampler does not shard, so every rank trains on the "
                "whole epoch. Pass sampler=rayform.torch.EpisodeSampler(dataset, shuffle=True) "
                "(it shards by episode) or DistributedSampler(dataset) instead of shuffle=True",
                self.rank,
                self.world,
                distinct,
                self.bound,
                self.length,
            )


def shard_check(length: int) -> ShardCheck | None:
    """A :class:`ShardCheck` for this rank if ``torch.distributed`` runs more than one process."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
        return None
    return ShardCheck(length, dist.get_rank(), dist.get_world_size())
