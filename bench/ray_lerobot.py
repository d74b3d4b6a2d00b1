"""``rayform.ray.read_slice`` against ``ray.data.read_lerobot`` on the same episodes, same CPUs.

Usage (from the repository root; 10-20 minutes on 2 shared cores with the defaults, most of
it ``read_lerobot``)::

    .venv/bin/python -m bench.ray_lerobot --lerobot-python .peer-venv-061/bin/python \
        [--episodes 5 --frames 400 --cpus 2 --rounds 2 --passes 2]

The data: a LeRobot v3.0 dataset (``bench/make_lerobot_data.py``, LeRobot's own writer in the
0.4.4 peer venv, ``--writer-python``: two cameras 480x640 in AV1, the 14-D state and action,
50 Hz) and its Rayform ingest (``rayform-server ingest lerobot``), both made once under
``.bench/`` (``bench/_data.py``). The data root is served on loopback (``bench/_serve.py``).

Each round runs both sides one after the other, each in its own process with its own Ray
instance started by ``ray.init(num_cpus=--cpus, object_store_memory=...)`` (Rayform needs this
venv's Python 3.11; ``read_lerobot`` needs LeRobot 0.5+, hence Python 3.12: the
``--lerobot-python`` venv of ``scripts/peer_lerobot061.sh`` with ``ray[data]==2.60.0``), the
order alternating over rounds so both see the same machine load; both Ray instances run their
workers at nice 0 (``RAY_worker_niceness=0``; Ray's default is 15), as a DataLoader's are:

* **read_slice** (this venv, ``--side rayform``): ``rayform.ray.read_slice(slice_,
  obs=[both cameras, state], action="action", fps=50)``, one row per frame with both cameras
  decoded to ``(3, 480, 640) uint8``. "Cold" reads through an empty cache (every blob fetched
  from the server by the read tasks) on a fresh Ray instance (its workers start during the
  pass); then ``--passes`` times a "warm" pass, each followed by a pass of
  ``EpisodeDataset``'s own loader over the same warm cache with as many workers as CPUs
  (``DataLoader(num_workers=--cpus, sampler=EpisodeSampler, collate_fn=collate)``, workers
  started in the pass). The packet decoder's verdicts kept on disk
  (``~/.local/state/rayform/decoder-checks.json``) are left as they are: the first process
  on a machine with these decoders checks them (and imports torchcodec), every later one reads
  them, cold or warm.
* **read_lerobot** (``bench/_ray_read_lerobot.py`` in the peer venv): ``ray.data.read_lerobot(
  DATASET, override_num_blocks=--cpus)`` (one row per frame, both cameras decoded to ``uint8``;
  with its default the dataset's single video file per camera is a single read task), first
  pass ("cold", Ray Data's start and its workers' included) and a second ("warm").
* **read_slice, cold cache on a warm instance**: after the warm passes, one more
  ``read_slice`` pass through a new empty cache (every blob fetched again, every worker's
  dataset built anew), compared with ``read_lerobot``'s warm pass: the first read of a slice
  on a cluster that is already running.

Every pass consumes every row with ``iter_batches(batch_size=32, batch_format="numpy")`` (the
loader: its batches of 32) and records wall seconds and the CPU seconds of the process and all
its descendants (``bench._timing.tree_cpu_s``: Ray's raylet, GCS and workers, or the
DataLoader's workers), so rows per CPU second hold whoever else loads the machine.
``ray.init`` is timed apart.

``--touch-object-store`` starts both Ray instances with ``RAY_preallocate_plasma_memory=1``:
the raylet maps its whole object store at ``ray.init`` (timed apart), as a Ray instance that
has already run for a while has it. On a fresh instance the first gigabytes written to the
object store cost the writing process a page fault per 4 KiB page (about 1.3 CPU s per
2 GiB here), in the cold pass and, with a 2 GiB store and 3.7 GB passes, in part of the first
warm one. Writes ``bench/results/ray_lerobot.json``: every pass, and the
medians over rounds and passes with the ratios read_slice / read_lerobot (cold, warm; target
>= 10) and read_slice / loader (target >= 0.8), in rows/s and in rows per CPU second.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from bench._data import REPO, SLICE_ID, Workload, peer_env, prepare
from bench._measure import loadavg, log
from bench._serve import serving
from bench._timing import tree_cpu_s

#: Both Ray instances: no usage reports, one OpenMP thread, and workers at the loader's
#: priority (Ray starts its workers at nice 15: on a machine that others load, they would
#: get a fraction of what the DataLoader's workers get).
RAY_ENV = {"RAY_USAGE_STATS_ENABLED": "0", "OMP_NUM_THREADS": "1", "RAY_worker_niceness": "0"}
#: One pass over every row: rows, s, cpu_s, rows_per_s, rows_per_cpu_s.
Pass = dict[str, Any]

#: The Rayform streams of the ingest (``rayform-server ingest lerobot`` names).
CAMERAS = ("cam0/rgb", "wrist/rgb")
STATE, ACTION = "observation/state", "action"


def _lerobot_python() -> str:
    out = subprocess.run(
        ["bash", str(REPO / "scripts" / "peer_lerobot061.sh")],
        check=True,
        capture_output=True,
        text=True,
    )
    return out.stdout.strip().splitlines()[-1]


def timed_pass(batches: Iterable[dict[str, Any]], count: Callable[[dict[str, Any]], int]) -> Pass:
    """Consume every batch: rows, wall seconds, and the CPU seconds of this process and all
    its descendants (Ray's raylet and workers, a DataLoader's workers) meanwhile."""
    cpu0, t = tree_cpu_s(), time.perf_counter()
    rows = sum(count(b) for b in batches)
    seconds = time.perf_counter() - t
    cpu1 = tree_cpu_s()
    cpu = sum(v - cpu0.get(p, 0.0) for p, v in cpu1.items())
    return {"rows": rows, "s": seconds, "cpu_s": cpu, "rows_per_s": rows / seconds,
            "rows_per_cpu_s": rows / max(cpu, 1e-9)}  # fmt: skip


def rayform_side(args: argparse.Namespace) -> dict[str, Any]:
    """In this process: ``read_slice`` cold (empty cache, fresh Ray instance), then warm
    ``read_slice`` passes alternating with passes of ``EpisodeDataset``'s own loader."""
    import ray
    import ray.data
    from torch.utils.data import DataLoader

    import rayform
    import rayform.ray
    from rayform.torch import EpisodeDataset, EpisodeSampler, collate

    torch_args: dict[str, Any] = {"obs": [*CAMERAS, STATE], "action": ACTION, "fps": args.fps}
    cache = Path(tempfile.mkdtemp(prefix="rfbench-rl-cache-", dir=args.work))
    # The empty cache of the last pass: the first read of a slice on a running cluster.
    empty = Path(tempfile.mkdtemp(prefix="rfbench-rl-cache-", dir=args.work))
    out: dict[str, Any] = {"cpus": args.cpus, "warm": [], "loader": []}
    t = time.perf_counter()
    ray.init(
        num_cpus=args.cpus,
        object_store_memory=args.object_store_bytes,
        include_dashboard=False,
        log_to_driver=False,
    )
    out["ray_init_s"] = time.perf_counter() - t
    ray.data.DataContext.get_current().enable_progress_bars = False

    def read(cache_dir: Path = cache) -> Iterator[dict[str, Any]]:
        client = rayform.Client(endpoint=args.url, token=args.token, cache_dir=cache_dir)
        ds = rayform.ray.read_slice(client.slices.get(SLICE_ID), **torch_args)
        for batch in ds.iter_batches(batch_size=args.batch_size, batch_format="numpy"):
            out.setdefault(
                "columns", {k: [str(v.dtype), list(v.shape[1:])] for k, v in batch.items()}
            )
            yield batch

    def load() -> DataLoader[Any]:
        client = rayform.Client(endpoint=args.url, token=args.token, cache_dir=cache)
        dataset = EpisodeDataset(client.slices.get(SLICE_ID), **torch_args, shard=None)
        sampler = EpisodeSampler(dataset)
        # Persistent workers: still alive when the pass ends, so their CPU seconds count.
        return DataLoader(
            dataset,
            args.batch_size,
            sampler=sampler,
            num_workers=args.cpus,
            collate_fn=collate,
            persistent_workers=True,
        )

    def read_pass(cache_dir: Path = cache) -> Pass:
        return timed_pass(read(cache_dir), lambda b: len(b["meta/index"]))

    try:
        out["cold"] = read_pass()
        log(f"[read_slice] cold: {_fmt(out['cold'])}")
        for _ in range(args.passes):
            out["warm"].append(read_pass())
            log(f"[read_slice] warm: {_fmt(out['warm'][-1])}")
            out["loader"].append(timed_pass(load(), lambda b: len(b["t_ns"])))
            log(f"[loader] {args.cpus} workers: {_fmt(out['loader'][-1])}")
        # Every blob fetched and each worker's dataset built anew, without Ray's start.
        out["cold_cache"] = read_pass(empty)
        log(f"[read_slice] cold cache, warm Ray: {_fmt(out['cold_cache'])}")
    finally:
        ray.shutdown()
        shutil.rmtree(cache, ignore_errors=True)
        shutil.rmtree(empty, ignore_errors=True)
    return out


def _fmt(p: Pass) -> str:
    return (
        f"{p['rows']} rows in {p['s']:.1f} s = {p['rows_per_s']:.1f} rows/s, "
        f"{p['cpu_s']:.1f} CPU s = {p['rows_per_cpu_s']:.1f} rows per CPU second"
    )


def _run_rayform(args: argparse.Namespace, url: str, token: str, out: Path) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "bench.ray_lerobot", "--side", "rayform", "--url", url]
    cmd += ["--token", token, "--side-out", str(out), "--work", str(args.work)]
    cmd += ["--cpus", str(args.cpus), "--fps", str(args.fps), "--passes", str(args.passes)]
    cmd += ["--object-store-gib", str(args.object_store_gib), "--batch-size", str(args.batch_size)]
    env = {**os.environ, **_ray_env(args), "RAY_TMPDIR": str(args.work), "PYTHONPATH": str(REPO)}
    subprocess.run(cmd, check=True, env=env, cwd=REPO)
    return dict(json.loads(out.read_text()))


def _run_lerobot(args: argparse.Namespace, dataset: Path, out: Path) -> dict[str, Any]:
    cmd = [args.lerobot_python, str(REPO / "bench" / "_ray_read_lerobot.py"), str(dataset)]
    cmd += [str(out), "--cpus", str(args.cpus), "--batch-size", str(args.batch_size)]
    cmd += ["--object-store-bytes", str(args.object_store_bytes)]
    if args.lerobot_blocks:
        cmd += ["--blocks", str(args.lerobot_blocks)]
    env = {**peer_env(), **_ray_env(args), "RAY_TMPDIR": str(args.work)}
    subprocess.run(cmd, check=True, env=env)
    return dict(json.loads(out.read_text()))


def _ray_env(args: argparse.Namespace) -> dict[str, str]:
    """Both sides' Ray settings (:data:`RAY_ENV`, and the object store mapped up front with
    ``--touch-object-store``)."""
    touch = {"RAY_preallocate_plasma_memory": "1"} if args.touch_object_store else {}
    return {**RAY_ENV, **touch}


def _median(rounds: list[dict[str, Any]], side: str, phase: str, key: str) -> float:
    """Median of ``key`` over every pass of ``phase`` (cold, warm, loader) of ``side``."""
    passes = []
    for r in rounds:
        got = r[side][phase]
        passes += got if isinstance(got, list) else [got]
    return float(statistics.median(p[key] for p in passes))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--episodes", type=int, default=5)
    p.add_argument("--frames", type=int, default=400, help="frames per episode")
    p.add_argument("--fps", type=int, default=50)
    p.add_argument("--cpus", type=int, default=2, help="num_cpus of each side's Ray instance")
    p.add_argument("--rounds", type=int, default=2, help="rounds, the sides' order alternating")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument(
        "--passes", type=int, default=2, help="warm read_slice and loader passes per round"
    )
    p.add_argument("--object-store-gib", type=float, default=2.0)
    p.add_argument(
        "--lerobot-python",
        default=None,
        help="python with lerobot>=0.5 and ray[data]==2.60.0 (default: "
        "scripts/peer_lerobot061.sh's, built when missing)",
    )
    p.add_argument(
        "--writer-python",
        default=None,
        help="python that writes the LeRobot dataset when missing (default: scripts/peer_lerobot.sh's)",
    )
    p.add_argument(
        "--lerobot-blocks",
        type=int,
        default=None,
        help="read_lerobot's override_num_blocks (default: --cpus, so it can use every CPU: "
        "with its own default the dataset's one video file per camera is one read task)",
    )
    p.add_argument(
        "--touch-object-store",
        action="store_true",
        help="both Ray instances map their whole object store at ray.init "
        "(RAY_preallocate_plasma_memory=1), as one that has run a while has it",
    )
    p.add_argument("--out", default=str(REPO / "bench" / "results" / "ray_lerobot.json"))
    # One side in this process (the orchestrator runs it as a subprocess).
    p.add_argument("--side", choices=["rayform"], help=argparse.SUPPRESS)
    p.add_argument("--side-out", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--url", help=argparse.SUPPRESS)
    p.add_argument("--token", help=argparse.SUPPRESS)
    p.add_argument("--work", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.object_store_bytes = int(args.object_store_gib * (1 << 30))
    if args.side == "rayform":
        args.side_out.write_text(json.dumps(rayform_side(args), indent=1))
        return
    args.lerobot_blocks = args.lerobot_blocks or args.cpus
    args.lerobot_python = args.lerobot_python or _lerobot_python()
    w = Workload(args.episodes, args.frames, fps=args.fps)
    prepared = prepare(w, log=log, python=args.writer_python or None)
    args.work = Path(tempfile.mkdtemp(prefix="rfbench-rl-", dir="/tmp"))
    doc: dict[str, Any] = {
        "workload": {"episodes": w.episodes, "frames": w.frames, "fps": w.fps},
        "cameras": f"2 x {w.height}x{w.width}",
        "cpus": args.cpus,
        "batch_size": args.batch_size,
        "object_store_gib": args.object_store_gib,
        "lerobot_blocks": args.lerobot_blocks,
        "touch_object_store": args.touch_object_store,
        "prepare_s": prepared,
        "rounds": [],
    }
    try:
        with serving(w.root) as (url, token):
            for r in range(args.rounds):
                row: dict[str, Any] = {"loadavg_start": loadavg()}
                order = ["rayform", "lerobot"] if r % 2 == 0 else ["lerobot", "rayform"]
                for side in order:
                    log(f"[ray-lerobot] round {r + 1}/{args.rounds}: {side}")
                    out = args.work / f"{side}-{r}.json"
                    if side == "rayform":
                        row[side] = _run_rayform(args, url, token, out)
                    else:
                        row[side] = _run_lerobot(args, w.lerobot_dir, out)
                row["loadavg_end"] = loadavg()
                doc["rounds"].append(row)
    finally:
        shutil.rmtree(args.work, ignore_errors=True)
    rounds = doc["rounds"]
    med: dict[str, float] = {}
    for key in ("rows_per_s", "rows_per_cpu_s"):
        loader = _median(rounds, "rayform", "loader", key)
        med[f"loader_{key}"] = loader
        for label in ("cold", "warm"):
            ours = _median(rounds, "rayform", label, key)
            theirs = _median(rounds, "lerobot", label, key)
            med[f"read_slice_{label}_{key}"] = ours
            med[f"read_lerobot_{label}_{key}"] = theirs
            med[f"{label}_{key}_vs_read_lerobot"] = ours / theirs
            med[f"{label}_{key}_vs_loader"] = ours / loader
    # The first read of a slice on a running instance against read_lerobot on a running one
    # (it has no cache to be cold: its warm pass).
    for key in ("rows_per_s", "rows_per_cpu_s"):
        ours = _median(rounds, "rayform", "cold_cache", key)
        med[f"read_slice_cold_cache_{key}"] = ours
        med[f"cold_cache_{key}_vs_read_lerobot_warm"] = ours / med[f"read_lerobot_warm_{key}"]
    doc["median"] = med
    Path(args.out).write_text(json.dumps(doc, indent=2) + "\n")
    print(json.dumps(med, indent=2))


if __name__ == "__main__":
    main()
