"""PyTorch integration: :class:`EpisodeDataset` and its helpers.

::

    dataset = rayform.torch.EpisodeDataset(slice_, obs=["cam0/rgb"], action="joints/position_delta", fps=15)
    loader = DataLoader(dataset, sampler=rayform.torch.EpisodeSampler(dataset), batch_size=64,
                        num_workers=4, collate_fn=rayform.torch.collate)

Semantics, determinism and DDP: ``docs/dataset.md``.
"""

from __future__ import annotations

from rayform.torch._collate import collate
from rayform.torch._mixture import MixtureDataset
from rayform.torch._normalize import unnormalize
from rayform.torch._sampling import EpisodeSampler, SamplerDataset, split_episodes
from rayform.torch._spec import DatasetSpec
from rayform.torch.dataset import EpisodeDataset

__all__ = [
    "DatasetSpec",
    "EpisodeDataset",
    "EpisodeSampler",
    "MixtureDataset",
    "SamplerDataset",
    "collate",
    "split_episodes",
    "unnormalize",
]
