"""The sampling order: which sample each rank reads, in which order, every epoch.

``_perm`` (seeded permutations of any size, O(1) memory), ``_order`` (the order engine: episode
streams, windows, plans), ``_shard`` (episodes to ranks), ``_epoch`` (an epoch counter shared
with forked workers), ``_window`` (the automatic shuffle window under a cache limit),
``_sampler`` (:class:`~rayform.torch.EpisodeSampler`), ``_split`` (episode-level splits),
``_shardcheck`` (notices a DDP loader that does not shard). Nothing here decodes or fetches.
"""

from rayform.torch._sampling._contract import CacheFootprint, SamplerDataset
from rayform.torch._sampling._epoch import SharedEpoch
from rayform.torch._sampling._order import (
    DDP_EVEN,
    IndexStream,
    Part,
    episode_streams,
    plan,
)
from rayform.torch._sampling._perm import PassPermutations, Permutation, derive_key, mix64
from rayform.torch._sampling._sampler import EpisodeSampler, SampleKey
from rayform.torch._sampling._shard import assign_episodes, rank_indices
from rayform.torch._sampling._shardcheck import ShardCheck, shard_check
from rayform.torch._sampling._split import split_episodes
from rayform.torch._sampling._window import AUTO, WindowChoice, ahead_bytes, choose_window

__all__ = [
    "AUTO",
    "DDP_EVEN",
    "CacheFootprint",
    "EpisodeSampler",
    "Part",
    "PassPermutations",
    "Permutation",
    "SampleKey",
    "SamplerDataset",
    "ShardCheck",
    "SharedEpoch",
    "IndexStream",
    "WindowChoice",
    "ahead_bytes",
    "assign_episodes",
    "choose_window",
    "derive_key",
    "episode_streams",
    "mix64",
    "plan",
    "rank_indices",
    "shard_check",
    "split_episodes",
]
