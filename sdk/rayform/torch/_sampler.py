"""A deterministic sampler: the order of an epoch depends only on (seed, epoch).

Use it instead of ``DataLoader(shuffle=True)``, whose order comes from torch's global RNG::

    loader = DataLoader(dataset, sampler=EpisodeSampler(dataset), batch_size=64, num_workers=8)
    for epoch in range(start_epoch, n_epochs):
        dataset.set_epoch(epoch)      # the sampler reads the dataset's epoch when iterated
        for batch in loader: ...

It yields keys ``(index, epoch)``: the dataset accepts them like plain ``int`` indices and
uses the carried epoch for per-sample randomness (``transform``), so a persistent worker that
kept an old copy of the dataset still sees the right epoch.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
from torch.utils.data import Sampler

__all__ = ["EpisodeSampler"]


class EpisodeSampler(Sampler[tuple[int, int]]):
    """Every index of ``dataset`` once per epoch, in an order fixed by (seed, epoch).

    Args:
        dataset: an :class:`~rayform.torch.EpisodeDataset` (its ``seed``, ``epoch`` and length,
            which under DDP is this rank's shard).
        shuffle: permute the indices; ``False`` iterates in dataset order.
    """

    def __init__(self, dataset: Any, shuffle: bool = True) -> None:
        self.dataset = dataset
        self.shuffle = bool(shuffle)

    def __len__(self) -> int:
        return len(self.dataset)

    def __iter__(self) -> Iterator[tuple[int, int]]:
        epoch = int(self.dataset.epoch)
        n = len(self.dataset)
        if self.shuffle:
            order = np.random.default_rng([int(self.dataset.seed), epoch, 0x5A]).permutation(n)
        else:
            order = np.arange(n)
        for i in order.tolist():
            yield (i, epoch)
