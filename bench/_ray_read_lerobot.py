"""``ray.data.read_lerobot`` decoded-frame rows/s, cold and warm (runs in the PEER venv).

Usage (``bench/ray_lerobot.py`` calls it; ``read_lerobot`` imports ``lerobot.datasets``
modules that only LeRobot 0.5+ has, so run it with the python of ``scripts/peer_lerobot061.sh``
with ``ray[data]==2.60.0`` installed)::

    .peer-venv-061/bin/python bench/_ray_read_lerobot.py DATASET_DIR OUT_JSON --cpus 2 \
        --object-store-bytes 2147483648 --batch-size 32 [--blocks 2]

Starts its own Ray instance (``ray.init(num_cpus=...)``), then reads the whole dataset twice
with ``ray.data.read_lerobot(DATASET_DIR)`` (one row per frame, every camera decoded to
``uint8``), consuming every row with ``iter_batches(batch_format="numpy")``: the first pass
("cold") includes Ray Data's start (planning, read-task workers), the second ("warm") runs on
the same Ray instance. ``ray.init`` itself is timed apart. Each pass records its rows, wall
seconds and the CPU seconds of this process and its descendants (Ray's raylet, GCS and
workers: ``tree_cpu_s`` of ``bench/_timing.py``, loaded by path). Writes a JSON object.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import sys
import time
from pathlib import Path


def _timing():  # noqa: ANN202
    spec = importlib.util.spec_from_file_location(
        "_bench_timing", Path(__file__).with_name("_timing.py")
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("dataset", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--cpus", type=int, default=2)
    ap.add_argument("--object-store-bytes", type=int, default=2 << 30)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--blocks", type=int, default=None, help="override_num_blocks")
    args = ap.parse_args()

    import ray
    import ray.data

    t = time.perf_counter()
    ray.init(
        num_cpus=args.cpus,
        object_store_memory=args.object_store_bytes,
        include_dashboard=False,
        log_to_driver=False,
    )
    out: dict = {"ray_init_s": time.perf_counter() - t, "cpus": args.cpus, "blocks": args.blocks}
    ray.data.DataContext.get_current().enable_progress_bars = False
    tree_cpu_s = _timing().tree_cpu_s

    def timed_pass() -> dict:
        cpu0, t = tree_cpu_s(), time.perf_counter()
        ds = ray.data.read_lerobot(str(args.dataset), override_num_blocks=args.blocks)
        rows = 0
        for batch in ds.iter_batches(batch_size=args.batch_size, batch_format="numpy"):
            if "columns" not in out:  # images are ragged tensors: numpy object arrays
                out["columns"] = {
                    k: [str(getattr(v[0], "dtype", v.dtype)), list(getattr(v[0], "shape", ()))]
                    for k, v in batch.items()
                }
            rows += len(batch["index"])
        seconds = time.perf_counter() - t
        cpu1 = tree_cpu_s()
        cpu = sum(v - cpu0.get(p, 0.0) for p, v in cpu1.items())
        return {"rows": rows, "s": seconds, "cpu_s": cpu, "rows_per_s": rows / seconds,
                "rows_per_cpu_s": rows / max(cpu, 1e-9)}  # fmt: skip

    try:
        out["cold"] = timed_pass()
        print(f"[read_lerobot] cold: {out['cold']}", flush=True)
        out["warm"] = [timed_pass()]
        print(f"[read_lerobot] warm: {out['warm'][0]}", flush=True)
    finally:
        ray.shutdown()
    out["ray"] = ray.__version__
    out["lerobot"] = importlib.metadata.version("lerobot")
    args.out.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
