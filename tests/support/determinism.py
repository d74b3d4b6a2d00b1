"""The determinism tests' dataset and epoch digest, shared with the fresh-process script
(``support/scripts/loader_digest.py``) that must reproduce the same bits."""

from __future__ import annotations

import hashlib
from typing import Any

import torch
from torch.utils.data import DataLoader

from rayform.torch import EpisodeDataset
from support.datasets import FPS

OBS = ["cam0/rgb", "joints/position"]
ACTION = "joints/position_delta"


def jitter(sample: dict[str, Any]) -> dict[str, Any]:
    """A random augmentation drawing from torch's global RNG (seeded per sample by the dataset)."""
    sample["noise"] = torch.rand(3)
    sample["joints/position"] = sample["joints/position"] + torch.randn(2)
    return sample


def make(slice_: Any, **kw: Any) -> EpisodeDataset:
    """The determinism tests' dataset over ``slice_``: a random transform, seed 7."""
    return EpisodeDataset(
        slice_, obs=OBS, action=ACTION, fps=FPS, horizon=4, transform=jitter, seed=7, **kw
    )


def digest_epoch(loader: DataLoader) -> tuple[str, list[int]]:
    """``(sha256 of every batch's tensors, key by key, the samples' t_ns in order)``."""
    h = hashlib.sha256()
    order: list[int] = []
    for batch in loader:
        for key in sorted(k for k in batch if k != "meta"):
            h.update(key.encode())
            h.update(batch[key].numpy().tobytes())
        order += batch["t_ns"].tolist()
    return h.hexdigest(), order
