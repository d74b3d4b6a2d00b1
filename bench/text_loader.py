"""Benchmark: the README loader with and without a ``task`` text stream in ``obs``.

Builds the demo slice (``rayform-server demo --small`` by default, ``--full`` for the README's
own), then the same segments with a ``task`` state stream added (a task per episode, from 4
tasks; the blobs of the other streams are the demo's), serves the data root on a loopback port
and times the README loader (``obs=["cam0/rgb", "wrist/rgb", "joints/position"]``, action
``joints/position_delta``, fps 15, horizon 16, ``EpisodeSampler(shuffle=True)``,
``rayform.torch.collate``) against the same loader with ``"task"`` appended to ``obs``, in
alternating fresh processes (``bench._timing.time_loader``: a warm-up, then timed windows of
one continuous shuffled stream). Reports each side's median samples/s and the ratio
with/without (target >= 0.98).

Usage::

    python -m bench.text_loader [--full] [--rounds 3] [--batches 20] [--workers 2]

Writes ``bench/results/text-loader-<small|full>.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
SLICE, TASKS_SLICE = "slc_7c1e04aa", "slc_7a5c7a5c"
TASKS = ["pick up the cube", "hand it over", "place it in the bin", "push it left"]

ADD_TASKS = """
import sys, numpy as np
from rayform.format import encode_text
from rayform.manifest import Segment, Stream
from rayform_server.builder import commit_segments
from rayform_server.store import Store
store = Store(sys.argv[1])
m = store.load_manifest(store.get_slice(sys.argv[2])["manifest"])
tasks = sys.argv[4:]
segs = []
for i, seg in enumerate(m.segments):
    ref = store.put_bytes(encode_text([seg.start_ns], [{"content": tasks[i % len(tasks)]}]))
    task = Stream("task", "text", ref, 15.0, (1,), "str", 1, seg.start_ns, seg.start_ns,
                  quantity="state")
    segs.append(Segment(seg.id, seg.version, seg.site, seg.start_ns, seg.end_ns,
                        {**seg.streams, "task": task}))
store.set_slice(sys.argv[3], commit_segments(store, segs, "demo with tasks"), "demo with tasks")
"""

TIME = """
import json, sys
import rayform
from torch.utils.data import DataLoader
from bench._timing import time_loader
url, token, cache, slice_id, with_task, batches, workers = sys.argv[1:8]
obs = ["cam0/rgb", "wrist/rgb", "joints/position"] + (["task"] if with_task == "1" else [])

def make():
    client = rayform.Client(endpoint=url, token=token, cache_dir=cache)
    ds = rayform.torch.EpisodeDataset(client.slices.get(slice_id), obs=obs,
                                      action="joints/position_delta", fps=15, horizon=16,
                                      frame="ros")
    sampler = rayform.torch.EpisodeSampler(ds, shuffle=True)
    return DataLoader(ds, batch_size=64, num_workers=int(workers), sampler=sampler,
                      persistent_workers=int(workers) > 0, collate_fn=rayform.torch.collate)

row = time_loader(make, batches=int(batches), runs=3, warmup_batches=5,
                  batch_size_of=lambda b: int(b["action"].shape[0]), log=lambda m: None)
print(json.dumps({"samples_per_s": row["samples_per_s"], "runs": row["runs"]}))
"""


def _py(code: str, *args: str) -> str:
    env = {**os.environ, "PYTHONPATH": str(HERE.parent)}
    out = subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, timeout=3600
    )
    if out.returncode != 0:
        raise RuntimeError(out.stderr[-3000:])
    return out.stdout.strip().splitlines()[-1] if out.stdout.strip() else ""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--full", action="store_true", help="the full demo (default: --small)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batches", type=int, default=20)
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()
    from bench._serve import serving

    work = Path(tempfile.mkdtemp(prefix="rayform-text-loader-"))
    root = work / "data"
    demo = [sys.executable, "-m", "rayform_server", "demo", "--root", str(root)]
    subprocess.run([*demo, *([] if args.full else ["--small"])], check=True, capture_output=True)
    _py(ADD_TASKS, str(root), SLICE, TASKS_SLICE, *TASKS)
    sides = {"without_task": (SLICE, "0"), "with_task": (TASKS_SLICE, "1")}
    runs: dict[str, list[float]] = {k: [] for k in sides}
    with serving(root) as (url, token):
        cache = str(work / "cache")
        for slice_id, flag in sides.values():  # pull both: the timed loops read the cache
            _py(TIME, url, token, cache, slice_id, flag, "2", "0")
        for _ in range(args.rounds):
            for k, (slice_id, flag) in sides.items():
                doc = json.loads(
                    _py(
                        TIME,
                        url,
                        token,
                        cache,
                        slice_id,
                        flag,
                        str(args.batches),
                        str(args.workers),
                    )
                )
                runs[k].append(doc["samples_per_s"])
    result = {
        "demo": "full" if args.full else "small",
        "rounds": args.rounds,
        "batches": args.batches,
        "workers": args.workers,
        "runs": runs,
        **{k: statistics.median(v) for k, v in runs.items()},
    }
    result["ratio"] = result["with_task"] / result["without_task"]
    out = HERE / "results" / f"text-loader-{result['demo']}.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(result, indent=2, sort_keys=True))
    print(json.dumps(result, indent=2, sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
