"""The training loop ``bench/ray_train.py`` (and ``bench/ray_bench.py``) times under Ray Train
and under ``torchrun``.

The demo slice's first camera and joints at 15 Hz through ``EpisodeSampler`` and a
``DataLoader`` (``config["loader_workers"]`` worker processes per rank, persistent), a small
DDP model (gloo) on the joints: forward, backward, step. ``config["epochs"]`` epochs; the first
is a warm-up (DataLoader workers start, decoders open, the cache is read once) and is not
timed, so start-up is excluded the same way on both sides. Every rank sets
``torch.set_num_threads(config["threads"])`` (Ray sets ``OMP_NUM_THREADS`` from the worker's
``num_cpus``, torchrun leaves it to the caller). Rank 0 returns ``{"samples", "epoch_s",
"startup_s", ...}``: the samples of all ranks over the timed epochs, the seconds of those
epochs (barrier to barrier), the seconds from the loop's entry to the end of the warm-up
epoch, and what each rank ran with (threads, CPUs it may run on, ``OMP_NUM_THREADS``).

Under torchrun: ``python -m torch.distributed.run --nproc_per_node=2 bench/_ray_loop.py OUT
CONFIG_JSON``.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

BATCH = 32


def epoch(config: dict[str, Any], prepare: Any = None) -> dict[str, Any]:
    """The epochs on this rank (``torch.distributed`` initialised by the caller)."""
    import torch
    import torch.distributed as dist
    from torch.utils.data import DataLoader

    import rayform

    t_enter = time.perf_counter()
    torch.set_num_threads(int(config.get("threads", 1)))
    workers = int(config.get("loader_workers", 1))
    epochs = int(config.get("epochs", 1))
    client = rayform.Client(
        endpoint=config["endpoint"], token=config["token"], cache_dir=config["cache"]
    )
    dataset = rayform.torch.EpisodeDataset(
        client.slices.get(config["slice"]),
        obs=["cam0/rgb", "joints/position"],
        action="joints/position_delta",
        fps=15,
    )
    sampler = rayform.torch.EpisodeSampler(dataset)
    loader: Any = DataLoader(
        dataset,
        batch_size=BATCH,
        sampler=sampler,
        num_workers=workers,
        persistent_workers=workers > 0 and epochs > 1,
        collate_fn=rayform.torch.collate,
    )
    if prepare is not None:
        loader = prepare(loader)
    width = dataset.sample_spec()["joints/position"][1][0]
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(width, width))
    optim = torch.optim.SGD(model.parameters(), lr=1e-3)
    samples = 0
    t0 = startup = 0.0
    for e in range(epochs):
        dataset.set_epoch(e)
        if e == min(1, epochs - 1):
            dist.barrier()
            t0 = time.perf_counter()
            startup = t0 - t_enter
            samples = 0
        for batch in loader:
            loss = model(batch["joints/position"]).pow(2).mean()
            optim.zero_grad()
            loss.backward()
            optim.step()
            samples += len(batch["t_ns"])
    dist.barrier()
    elapsed = time.perf_counter() - t0
    total = torch.tensor([samples])
    dist.all_reduce(total)
    return {
        "samples": float(total.item()),
        "epoch_s": elapsed,
        "startup_s": startup,
        "timed_epochs": epochs - 1 if epochs > 1 else 1,
        "torch_threads": torch.get_num_threads(),
        "affinity_cpus": len(os.sched_getaffinity(0)),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "loader_type": type(loader).__name__,
    }


def ray_train_loop(config: dict[str, Any]) -> None:
    """``train_loop_per_worker``: the epochs with ``rayform.ray.prepare_data_loader``; rank 0
    writes the result to ``config["out"]`` (Ray keeps metrics only with checkpoints)."""
    import ray.train
    import ray.train.torch

    import rayform.ray

    prepare: Any = rayform.ray.prepare_data_loader
    if config.get("ray_wrapper"):  # Ray's own wrapper, to measure what it costs

        def prepare(loader: Any) -> Any:
            return ray.train.torch.prepare_data_loader(loader, add_dist_sampler=False)

    result = epoch(config, prepare)
    if ray.train.get_context().get_world_rank() == 0:
        with open(config["out"], "w") as f:
            json.dump(result, f)


def main() -> None:
    import torch.distributed as dist

    out, config = sys.argv[1], json.loads(sys.argv[2])
    dist.init_process_group("gloo")
    result = epoch(config)
    if dist.get_rank() == 0:
        with open(out, "w") as f:
            json.dump(result, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
