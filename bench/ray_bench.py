"""Rayform on Ray, measured side by side in one run on a local 2-node Ray cluster (1 CPU each).

Usage (from the repository root; about 3 minutes on 2 cores)::

    .venv/bin/python -m bench.ray_bench [--episodes 6] [--bags 4]

1. ``rayform.ray.read_slice`` rows/s (two cameras at 240x320 and the joints, 15 Hz, the demo
   slice), cold (an empty cache: the tasks fetch through it) and warm, against
   ``EpisodeDataset``'s own loader (``DataLoader(num_workers=2)``, ``EpisodeSampler``,
   ``rayform.torch.collate``) on the same 2 CPUs, warm. ``ray.data.read_lerobot`` is not
   measured: it needs the ``lerobot`` package, which pins a torch other than this
   environment's (docs/benchmarks.md).
2. One training epoch (``bench/_ray_loop.py``) under Ray Train's ``TorchTrainer`` (2 workers,
   gloo) against the same loop under ``torchrun --nproc_per_node=2``.
3. ``rayform-server ingest mcap --ray`` of ``--bags`` bags against the serial ingest.

Writes ``bench/results/ray.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from unittest import mock

from bench._serve import serving

REPO = Path(__file__).resolve().parents[1]
TOKEN = "bench-ray-token-5d1c"
SLICE = "slc_7c1e04aa"
ARGS: dict[str, Any] = {
    "obs": ["cam0/rgb", "wrist/rgb", "joints/position"],
    "action": "joints/position_delta",
    "fps": 15,
}


def log(msg: str) -> None:
    print(f"[ray-bench] {msg}", file=sys.stderr, flush=True)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_torchrun(config: dict[str, Any], out: Path, threads: int) -> tuple[dict[str, Any], float]:
    """``bench/_ray_loop.py`` under ``torchrun`` with 2 local ranks: its JSON and the wall time
    (start-up included), with ``threads`` OpenMP threads per rank."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    t0 = time.perf_counter()
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--nnodes=1"]
    cmd += [f"--master_port={_free_port()}", str(REPO / "bench" / "_ray_loop.py")]
    subprocess.run([*cmd, str(out), json.dumps(config)], check=True, env=env, capture_output=True)
    wall_s = time.perf_counter() - t0
    return dict(json.loads(out.read_text())), wall_s


def bench_read(url: str, work: Path) -> dict[str, Any]:
    from torch.utils.data import DataLoader

    import rayform
    import rayform.ray

    out: dict[str, Any] = {}
    cache = work / "cache-read"
    for label in ("cold", "warm"):
        client = rayform.Client(endpoint=url, token=TOKEN, cache_dir=cache)
        slice_ = client.slices.get(SLICE)
        t0 = time.perf_counter()
        rows = 0
        ds = rayform.ray.read_slice(slice_, **ARGS)
        for batch in ds.iter_batches(batch_size=256, batch_format="numpy"):
            rows += len(batch["t_ns"])
        out[f"read_slice_{label}_rows_per_s"] = rows / (time.perf_counter() - t0)
        out["rows"] = rows
        log(f"read_slice {label}: {rows} rows, {out[f'read_slice_{label}_rows_per_s']:.0f} rows/s")
    client = rayform.Client(endpoint=url, token=TOKEN, cache_dir=cache)
    dataset = rayform.torch.EpisodeDataset(client.slices.get(SLICE), **ARGS, shard=None)
    loader = DataLoader(
        dataset,
        batch_size=32,
        sampler=rayform.torch.EpisodeSampler(dataset),
        num_workers=2,
        collate_fn=rayform.torch.collate,
    )
    t0 = time.perf_counter()
    n = sum(len(b["t_ns"]) for b in loader)
    out["loader_rows_per_s"] = n / (time.perf_counter() - t0)
    log(f"EpisodeDataset loader (2 workers): {n} rows, {out['loader_rows_per_s']:.0f} rows/s")
    for label in ("cold", "warm"):
        out[f"ratio_{label}_vs_loader"] = (
            out[f"read_slice_{label}_rows_per_s"] / out["loader_rows_per_s"]
        )
    return out


def bench_train(url: str, work: Path) -> dict[str, Any]:
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    from bench._ray_loop import ray_train_loop

    config = {"endpoint": url, "token": TOKEN, "cache": str(work / "cache-read"), "slice": SLICE}
    t0 = time.perf_counter()
    TorchTrainer(
        ray_train_loop,
        train_loop_config={**config, "out": str(work / "ray-train.json")},
        scaling_config=ScalingConfig(num_workers=2, resources_per_worker={"CPU": 1}),
        torch_config=TorchConfig(backend="gloo"),
        run_config=RunConfig(name="bench", storage_path=str(work / "runs")),
    ).fit()
    ray_wall = time.perf_counter() - t0
    ray_metrics = json.loads((work / "ray-train.json").read_text())
    tr, torchrun_wall = run_torchrun(config, work / "torchrun.json", 1)
    out = {
        "ray_samples_per_s": ray_metrics["samples"] / ray_metrics["epoch_s"],
        "torchrun_samples_per_s": tr["samples"] / tr["epoch_s"],
        "ray_wall_s": ray_wall,
        "torchrun_wall_s": torchrun_wall,
    }
    out["ratio_epoch"] = out["ray_samples_per_s"] / out["torchrun_samples_per_s"]
    log(
        f"train epoch: Ray {out['ray_samples_per_s']:.0f} /s, torchrun "
        f"{out['torchrun_samples_per_s']:.0f} /s (ratio {out['ratio_epoch']:.2f}); wall "
        f"{ray_wall:.1f} s vs {torchrun_wall:.1f} s"
    )
    return out


def bench_ingest(address: str, work: Path, bags: int) -> dict[str, Any]:
    spec = importlib.util.spec_from_file_location(
        "_bench_recordings", REPO / "tests" / "support" / "recordings.py"
    )
    assert spec is not None and spec.loader is not None
    recordings = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = recordings
    spec.loader.exec_module(recordings)
    files = []
    for k in range(bags):
        files.append(work / f"run_{k:03d}.mcap")
        recordings.write_bag(files[-1], seed=k)
    base = [
        sys.executable,
        "-m",
        "rayform_server",
        "ingest",
        "mcap",
        "--quiet",
        "--slice",
        "slc_0000aaaa",
    ]
    t0 = time.perf_counter()
    subprocess.run([*base, "--root", str(work / "serial"), *map(str, files)], check=True)
    serial = time.perf_counter() - t0
    t0 = time.perf_counter()
    subprocess.run(
        [*base, "--root", str(work / "ray"), "--ray", address, *map(str, files)], check=True
    )
    on_ray = time.perf_counter() - t0
    from rayform_server.store import Store

    refs = [Store(work / name).get_slice("slc_0000aaaa") for name in ("serial", "ray")]
    same = None not in refs and refs[0]["manifest"] == refs[1]["manifest"]  # type: ignore[index]
    log(
        f"ingest of {bags} bags: serial {serial:.1f} s, --ray {on_ray:.1f} s "
        f"(ratio {serial / on_ray:.2f}); same manifest: {same}"
    )
    return {
        "bags": bags,
        "serial_s": serial,
        "ray_s": on_ray,
        "speedup": serial / on_ray,
        "same_manifest": same,
    }


def ray_environment(work: Path, **extra: str) -> Any:
    """The environment a bench's Ray processes start with, restored on exit: Ray's files under
    ``work``, no usage stats, this repository importable (``bench``, ``tests``) in its workers."""
    return mock.patch.dict(
        os.environ,
        {
            "RAY_TMPDIR": str(work),
            "RAY_USAGE_STATS_ENABLED": "0",
            "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
            **extra,
        },
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--episodes", type=int, default=6)
    p.add_argument("--bags", type=int, default=4)
    args = p.parse_args()

    import ray
    from ray.cluster_utils import Cluster

    from rayform_server.demo import build_demo

    work = Path(tempfile.mkdtemp(prefix="rfbench-ray-", dir="/tmp"))
    cluster = None
    stack = contextlib.ExitStack()
    stack.enter_context(ray_environment(work, OMP_NUM_THREADS="1"))
    results: dict[str, Any] = {"episodes": args.episodes, "loadavg_start": os.getloadavg()[0]}
    try:
        log(f"demo slice: {args.episodes} episodes at 240x320")
        build_demo(work / "root", episodes=args.episodes, jobs=2)
        url, _ = stack.enter_context(serving(work / "root", TOKEN))
        cluster = Cluster(initialize_head=False)
        cluster.add_node(num_cpus=1, object_store_memory=1 << 30, include_dashboard=False)
        cluster.add_node(num_cpus=1, object_store_memory=1 << 30)
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, log_to_driver=False)
        results["read"] = bench_read(url, work)
        results["train"] = bench_train(url, work)
        results["ingest"] = bench_ingest(cluster.address, work, args.bags)
    finally:
        ray.shutdown()
        if cluster is not None:
            cluster.shutdown()
        stack.close()
        shutil.rmtree(work, ignore_errors=True)
    results["loadavg_end"] = os.getloadavg()[0]
    out = REPO / "bench" / "results" / "ray.json"
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
