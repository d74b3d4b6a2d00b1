"""The training loop ``bench/ray_bench.py`` times under Ray Train and under ``torchrun``.

One epoch of the demo slice's first camera and joints at 15 Hz through ``EpisodeSampler`` and a
``DataLoader`` (one worker process per rank), a small DDP model (gloo) on the joints: forward,
backward, step. Rank 0 returns ``{"samples", "epoch_s"}`` (samples of all ranks, the epoch's
seconds from its first batch request to its last step).

Under torchrun: ``python -m torch.distributed.run --nproc_per_node=2 bench/_ray_loop.py OUT``.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

BATCH = 32


def epoch(config: dict[str, Any], prepare: Any = None) -> dict[str, float]:
    """One timed epoch on this rank (``torch.distributed`` initialised by the caller)."""
    import torch
    import torch.distributed as dist
    from torch.utils.data import DataLoader

    import rayform

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
        num_workers=1,
        collate_fn=rayform.torch.collate,
    )
    if prepare is not None:
        loader = prepare(loader)
    width = dataset.sample_spec()["joints/position"][1][0]
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(width, width))
    optim = torch.optim.SGD(model.parameters(), lr=1e-3)
    dist.barrier()
    t0 = time.perf_counter()
    samples = 0
    for batch in loader:
        loss = model(batch["joints/position"]).pow(2).mean()
        optim.zero_grad()
        loss.backward()
        optim.step()
        samples += len(batch["t_ns"])
    dist.barrier()
    total = torch.tensor([samples])
    dist.all_reduce(total)
    return {"samples": float(total.item()), "epoch_s": time.perf_counter() - t0}


def ray_train_loop(config: dict[str, Any]) -> None:
    """``train_loop_per_worker``: the epoch with ``rayform.ray.prepare_data_loader``; rank 0
    writes the result to ``config["out"]`` (Ray keeps metrics only with checkpoints)."""
    import ray.train

    import rayform.ray

    result = epoch(config, rayform.ray.prepare_data_loader)
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
