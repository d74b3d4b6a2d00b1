"""Ray Train against torchrun: the same 2-rank training loop, alternated in one run.

Usage (from the repository root; about 4 minutes on 2 cores)::

    .venv/bin/python -m bench.ray_train [--episodes 12] [--epochs 4] [--rounds 3]

Builds and serves the demo slice, warms the cache, starts a one-node Ray instance, then runs
``--rounds`` rounds of: the loop of ``bench/_ray_loop.py`` under Ray Train's ``TorchTrainer``
(2 workers, gloo, ``rayform.ray.prepare_data_loader``) and under ``torchrun
--nproc_per_node=2`` (the order swaps every round, so load from other processes hits both
sides alike). Both sides run the same loader (1 DataLoader worker per rank, persistent), one
torch thread per rank, and time epochs 2..N inside the loop (epoch 1 is the warm-up: start-up
is excluded identically). Each Ray Train worker asks for ``num_cpus = DataLoader workers + 1``
(docs/ray.md). Reports each round's ratio of samples/s and the median; also the wall time of
each side (start-up included). Writes ``bench/results/ray_train.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from bench._serve import serving
from bench.ray_bench import REPO, SLICE, TOKEN, log, ray_environment, run_torchrun

LOADER_WORKERS = 1
THREADS = 1


def _ray_round(config: dict[str, Any], work: Path, k: int, wrapper: bool = False) -> dict[str, Any]:
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    from bench._ray_loop import ray_train_loop

    out = work / f"ray-{k}-{int(wrapper)}.json"
    t0 = time.perf_counter()
    TorchTrainer(
        ray_train_loop,
        train_loop_config={**config, "out": str(out), "ray_wrapper": wrapper},
        scaling_config=ScalingConfig(
            num_workers=2, resources_per_worker={"CPU": LOADER_WORKERS + 1}
        ),
        torch_config=TorchConfig(backend="gloo"),
        run_config=RunConfig(name=f"bench-{k}-{int(wrapper)}", storage_path=str(work / "runs")),
    ).fit()
    result: dict[str, Any] = json.loads(out.read_text())
    result["wall_s"] = time.perf_counter() - t0
    return result


def _torchrun_round(config: dict[str, Any], work: Path, k: int) -> dict[str, Any]:
    result, wall_s = run_torchrun(config, work / f"torchrun-{k}.json", THREADS)
    result["wall_s"] = wall_s
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--episodes", type=int, default=12)
    p.add_argument("--epochs", type=int, default=4, help="per run; the first is not timed")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument(
        "--ray-wrapper",
        action="store_true",
        help="also run Ray's own prepare_data_loader wrapper (add_dist_sampler=False) each round",
    )
    args = p.parse_args()

    import ray
    from torch.utils.data import DataLoader

    import rayform
    from rayform_server.demo import build_demo

    work = Path(tempfile.mkdtemp(prefix="rfbench-raytrain-", dir="/tmp"))
    stack = contextlib.ExitStack()
    stack.enter_context(ray_environment(work))
    rounds: list[dict[str, Any]] = []
    try:
        log(f"demo slice: {args.episodes} episodes at 240x320")
        build_demo(work / "root", episodes=args.episodes, jobs=2)
        url, _ = stack.enter_context(serving(work / "root", TOKEN))
        config = {
            "endpoint": url,
            "token": TOKEN,
            "cache": str(work / "cache"),
            "slice": SLICE,
            "epochs": args.epochs,
            "loader_workers": LOADER_WORKERS,
            "threads": THREADS,
        }
        client = rayform.Client(endpoint=url, token=TOKEN, cache_dir=work / "cache")
        warm = rayform.torch.EpisodeDataset(
            client.slices.get(SLICE),
            obs=["cam0/rgb", "joints/position"],
            action="joints/position_delta",
            fps=15,
            shard=None,
        )
        n = sum(1 for _ in DataLoader(warm, batch_size=64, collate_fn=rayform.torch.collate))
        log(f"cache warmed ({n} batches)")
        ray.init(num_cpus=2 * (LOADER_WORKERS + 1), include_dashboard=False, log_to_driver=False)
        for k in range(args.rounds):
            sides = ["ray", "torchrun", *(["ray_wrapper"] if args.ray_wrapper else [])]
            order = sides if k % 2 == 0 else sides[::-1]
            row: dict[str, Any] = {}
            for side in order:
                if side == "torchrun":
                    row[side] = _torchrun_round(config, work, k)
                else:
                    row[side] = _ray_round(config, work, k, wrapper=side == "ray_wrapper")
                row[side]["samples_per_s"] = row[side]["samples"] / row[side]["epoch_s"]
            row["ratio"] = row["ray"]["samples_per_s"] / row["torchrun"]["samples_per_s"]
            if args.ray_wrapper:
                row["ratio_ray_wrapper"] = (
                    row["ray_wrapper"]["samples_per_s"] / row["torchrun"]["samples_per_s"]
                )
            row["loadavg"] = os.getloadavg()[0]
            rounds.append(row)
            log(
                f"round {k + 1}: Ray {row['ray']['samples_per_s']:.0f} /s, torchrun "
                f"{row['torchrun']['samples_per_s']:.0f} /s, ratio {row['ratio']:.2f} "
                f"{'wrapper ' + format(row.get('ratio_ray_wrapper', 0), '.2f') + ' ' if args.ray_wrapper else ''}"
                f"(wall {row['ray']['wall_s']:.1f} s vs {row['torchrun']['wall_s']:.1f} s; "
                f"load {row['loadavg']:.1f})"
            )
    finally:
        ray.shutdown()
        stack.close()
        shutil.rmtree(work, ignore_errors=True)
    results = {
        "episodes": args.episodes,
        "epochs": args.epochs,
        "rounds": rounds,
        "median_ratio": statistics.median(r["ratio"] for r in rounds),
        "median_ray_samples_per_s": statistics.median(r["ray"]["samples_per_s"] for r in rounds),
        "median_torchrun_samples_per_s": statistics.median(
            r["torchrun"]["samples_per_s"] for r in rounds
        ),
    }
    (REPO / "bench" / "results" / "ray_train.json").write_text(json.dumps(results, indent=2) + "\n")
    log(f"median ratio {results['median_ratio']:.2f}")
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
