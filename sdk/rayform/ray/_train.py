"""Ray Train: keep :class:`~rayform.torch.EpisodeSampler` and resume through Ray's checkpoints.

``ray.train.torch.prepare_data_loader(loader)`` rebuilds any loader whose sampler is not a
``DistributedSampler`` with a ``DistributedSampler`` (world size above one), dropping the
``EpisodeSampler`` and with it episode sharding, read-ahead order and exact resume.
:func:`prepare_data_loader` keeps the loader as built (``add_dist_sampler=False`` for a
Rayform dataset) and still moves batches to the worker's device. :func:`report` saves the
sampler's position in each ``ray.train.report`` checkpoint, :func:`restore_sampler` loads it
from ``ray.train.get_checkpoint()`` after Ray restarts the worker group.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from torch.utils.data import DataLoader

from rayform.errors import InvalidArgumentError
from rayform.torch import EpisodeSampler, SamplerDataset

# Ray Train is imported where it is used, not here: every Ray Data read worker imports this
# package (the read tasks of read_slice live in it), and importing Ray Train cost each of them
# 0.27 s of a cold read's start for nothing.
if TYPE_CHECKING:
    import ray.train

__all__ = ["SAMPLER_FILE", "prepare_data_loader", "report", "restore_sampler"]

#: The file in a Ray checkpoint directory that holds the sampler's state (JSON).
SAMPLER_FILE = "rayform_sampler.json"


def prepare_data_loader(
    loader: DataLoader[Any], *, move_to_device: bool = True, auto_transfer: bool = True
) -> Any:
    """``ray.train.torch.prepare_data_loader`` that keeps a Rayform loader's sampler.

    A loader over a Rayform dataset (``EpisodeDataset``, ``MixtureDataset``) is kept as
    built: its :class:`~rayform.torch.EpisodeSampler` (or ``DistributedSampler``) already
    shards, so no ``DistributedSampler`` is added, and ``persistent_workers``,
    ``prefetch_factor`` and the ``batch_sampler`` are kept. Batches are moved to the worker's
    device as Ray's own function does (on a CPU worker, where that move is a no-op, the loader
    itself is returned). Any other loader goes to Ray's function unchanged.

    Args:
        loader: the DataLoader, built inside ``train_loop_per_worker`` (after Ray Train
            initialised ``torch.distributed``, so the dataset's ``shard="auto"`` sees the rank).
        move_to_device: move each batch to ``ray.train.torch.get_device()``.
        auto_transfer: on a GPU, copy batches on a side CUDA stream (Ray's option).

    Returns:
        What ``ray.train.torch.prepare_data_loader`` returns (an iterable of batches).

    Raises:
        InvalidArgumentError: the loader reads a Rayform dataset with a sampler that gives
            every rank the whole epoch (``shuffle=True`` with several workers).
    """
    import ray.train.torch

    dataset = getattr(loader, "dataset", None)
    if not isinstance(dataset, SamplerDataset):
        return ray.train.torch.prepare_data_loader(
            loader, move_to_device=move_to_device, auto_transfer=auto_transfer
        )
    world = ray.train.get_context().get_world_size()
    sampler = loader.sampler
    if world > 1 and not _shards(sampler):
        raise InvalidArgumentError(
            f"this DataLoader reads a {type(dataset).__name__} with a {type(sampler).__name__}, "
            f"which gives each of the {world} Ray Train workers the whole epoch: pass "
            "sampler=rayform.torch.EpisodeSampler(dataset) (it shards by episode)"
        )
    if move_to_device and ray.train.torch.get_device().type == "cpu":
        # Ray's wrapper would only call ``.to("cpu")`` on tensors already there, and it holds
        # each batch back until the next one has arrived (it prefetches one ahead in the
        # training loop's thread): on CPU workers the loader as built is the same, cheaper.
        move_to_device = False
    return ray.train.torch.prepare_data_loader(
        loader,
        add_dist_sampler=False,
        move_to_device=move_to_device,
        auto_transfer=auto_transfer,
    )


def _shards(sampler: object) -> bool:
    from torch.utils.data import DistributedSampler

    return isinstance(sampler, (EpisodeSampler, DistributedSampler))


def report(
    metrics: dict[str, Any],
    sampler: EpisodeSampler,
    *,
    consumed: int,
    directory: str | Path | None = None,
) -> None:
    """``ray.train.report`` with a checkpoint that holds the sampler's position.

    Call it on every worker at the same step (it is a barrier, as ``ray.train.report`` is).
    Rank 0 writes :data:`SAMPLER_FILE` (``sampler.state_dict(consumed=consumed)``, the same
    on every rank) into ``directory`` and reports it as the checkpoint; other ranks report
    ``directory`` if they pass one (their shard of the model), else no checkpoint.

    Args:
        metrics: the metrics to report (rank 0's are kept with the checkpoint).
        sampler: the loader's :class:`~rayform.torch.EpisodeSampler`.
        consumed: keys this rank consumed since the current pass over the loader began
            (``batches * batch_size``; worker processes draw keys ahead of the loop).
        directory: a directory holding the rest of the checkpoint (the model, the
            optimiser); default: a temporary directory with the sampler's state only.
    """
    import ray.train

    state = sampler.state_dict(consumed=consumed)
    rank = ray.train.get_context().get_world_rank()
    with tempfile.TemporaryDirectory(prefix="rayform-ckpt-") as tmp:
        path = Path(directory) if directory is not None else Path(tmp)
        if rank == 0:
            path.mkdir(parents=True, exist_ok=True)
            (path / SAMPLER_FILE).write_text(json.dumps(state))
        checkpoint = None
        if rank == 0 or directory is not None:
            checkpoint = ray.train.Checkpoint.from_directory(str(path))
        ray.train.report(metrics, checkpoint=checkpoint)


def restore_sampler(
    sampler: EpisodeSampler, checkpoint: ray.train.Checkpoint | None = None
) -> int | None:
    """Load the sampler's position from a checkpoint that :func:`report` saved.

    Args:
        sampler: a fresh :class:`~rayform.torch.EpisodeSampler` over the same dataset (any
            number of workers: the state resumes elastically).
        checkpoint: default ``ray.train.get_checkpoint()`` (the latest reported, after Ray
            restarted the worker group, or ``TorchTrainer(resume_from_checkpoint=...)``).

    Returns:
        The epoch to resume (call ``dataset.set_epoch`` with it before iterating), or
        ``None`` when there is no checkpoint (a fresh start).

    Raises:
        InvalidArgumentError: the checkpoint holds no sampler state, or one of another dataset.
    """
    import ray.train

    if checkpoint is None:
        checkpoint = ray.train.get_checkpoint()
    if checkpoint is None:
        return None
    with checkpoint.as_directory() as directory:
        path = Path(directory) / SAMPLER_FILE
        if not path.is_file():
            raise InvalidArgumentError(
                f"the checkpoint {checkpoint.path} has no {SAMPLER_FILE}: save checkpoints with "
                "rayform.ray.report(metrics, sampler, consumed=...)"
            )
        state = json.loads(path.read_text())
    sampler.load_state_dict(state)
    return int(state["epoch"])
