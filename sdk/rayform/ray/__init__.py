"""Rayform on Ray (``pip install "rayform[ray]"``; docs/ray.md).

Training under Ray Train with :class:`~rayform.torch.EpisodeSampler` kept (Ray's own
``prepare_data_loader`` replaces it with a ``DistributedSampler``) and exact resume through
Ray's checkpoints; a slice read into Ray Data with the dataset's exact samples::

    loader = rayform.ray.prepare_data_loader(
        DataLoader(dataset, sampler=rayform.torch.EpisodeSampler(dataset), batch_size=64))
    rows = rayform.ray.read_slice(slice_, obs=["cam0/rgb"], action="joints/position_delta", fps=15)

The core SDK never imports this package (nor Ray).
"""

from __future__ import annotations

from rayform.ray._data import (
    SliceDatasource,
    group_episodes,
    group_rows,
    read_slice,
    rows_per_block,
)
from rayform.ray._train import SAMPLER_FILE, prepare_data_loader, report, restore_sampler

__all__ = [
    "SAMPLER_FILE",
    "SliceDatasource",
    "group_episodes",
    "group_rows",
    "prepare_data_loader",
    "read_slice",
    "report",
    "restore_sampler",
    "rows_per_block",
]
