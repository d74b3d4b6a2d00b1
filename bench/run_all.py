"""``make bench``: every loader row of the benchmark in one run, plus the side measurements.

Usage (from the repository root)::

    .venv/bin/python -m bench.run_all            # default workload, ~5 min on 2 cores once the data exists
    .venv/bin/python -m bench.run_all --quick    # 4 episodes x 100 frames, to try things

Rows (``DataLoader(shuffle=True, batch_size=32, num_workers=2, persistent_workers=True)``,
warm cache, warm-up then the median of ``--runs`` timed runs):

1. naive: a new torchcodec decoder per ``__getitem__``, no cache, on our stored data;
2. ``LeRobotDataset`` defaults (torchcodec) on its own data, in the peer venv;
3. ``EpisodeDataset`` at the native 50 Hz;  4. ``EpisodeDataset`` at 15 Hz;
5. the sequential-epoch bound (every needed frame decoded front to back, all cores);
6. ``EpisodeDataset`` at 50 Hz in the training process: ``decode_threads=2`` with
   ``DataLoader(shuffle=True, batch_size=32, num_workers=0)`` (no worker processes);
7. ``EpisodeDataset`` at 50 Hz in the benchmark's DataLoader with
   ``collate_fn=rayform.torch.collate`` (each worker's shared memory reused across batches).

The lever experiments that follow are listed in ``bench/lever_rows.py``.

Writes ``bench/results/loader.json`` (``--quick``: ``loader-quick.json``) and the plot
``docs/benchmarks.png`` (not for ``--quick``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

from bench._data import REPO, Workload, open_slice, prepare, run_lerobot_row
from bench._measure import loadavg, loader_row, log

RESULTS = REPO / "bench" / "results"

#: The rows, in the order they run: (number, result key, title). Rows 2 and 5 are not one
#: loader of this process (a subprocess in the peer venv; decoding without a loader).
ROWS = (
    (1, "naive", "1. naive (new decoder per sample, no cache)"),
    (2, "lerobot", "2. LeRobotDataset (peer venv, torchcodec)"),
    (3, "episode_50hz", "3. EpisodeDataset 50 Hz"),
    (4, "episode_15hz", "4. EpisodeDataset 15 Hz"),
    (
        6,
        "episode_50hz_threads",
        "6. EpisodeDataset 50 Hz, decode_threads=2, DataLoader(num_workers=0)",
    ),
    (7, "episode_50hz_collate", "7. EpisodeDataset 50 Hz, collate_fn=rayform.torch.collate"),
    (5, "bound", "5. sequential-epoch bound"),
)
#: Ratios reported: name -> (numerator row, denominator row).
RATIOS = {
    "3/2": ("episode_50hz", "lerobot"),
    "3/5": ("episode_50hz", "bound_50hz"),
    "4/5@15Hz": ("episode_15hz", "bound_15hz"),
    "6/5": ("episode_50hz_threads", "bound_50hz"),
    "6/2": ("episode_50hz_threads", "lerobot"),
    "7/5": ("episode_50hz_collate", "bound_50hz"),
    "7/2": ("episode_50hz_collate", "lerobot"),
    "7/3": ("episode_50hz_collate", "episode_50hz"),
    "3/1": ("episode_50hz", "naive"),
}


def _machine() -> dict[str, Any]:
    import torch
    import torchcodec

    cpu = next(
        (
            ln.split(":", 1)[1].strip()
            for ln in Path("/proc/cpuinfo").read_text().splitlines()
            if ln.startswith("model name")
        ),
        platform.processor(),
    )
    mem = int(Path("/proc/meminfo").read_text().split()[1]) // 1024
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "mem_mib": mem,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torchcodec": torchcodec.__version__,
        "platform": platform.platform(),
    }


def _lerobot_row(w: Workload, args: argparse.Namespace, batches: int, title: str) -> dict[str, Any]:
    log(f"[bench] {title}")
    out = REPO / ".bench" / "lerobot-row.json"
    load0 = loadavg()
    res = run_lerobot_row(w, out, batches=batches, runs=args.runs, warmup=args.warmup)
    res["loadavg_1min"] = [load0, loadavg()]
    log(f"  -> {res['samples_per_s']:.1f} samples/s (first batch {res['first_batch_s']:.2f} s)")
    return res


def _main_rows(w: Workload, slice_: Any, args: argparse.Namespace) -> dict[str, Any]:
    """The rows of :data:`ROWS` chosen by ``--rows``, by result key."""
    from bench import rows

    make = rows.loaders(slice_, w.height, w.width)
    wanted = {int(r) for r in args.rows.split(",")}
    r: dict[str, Any] = {}
    for number, key, title in ROWS:
        if number not in wanted:
            continue
        if key == "lerobot":
            r[key] = _lerobot_row(w, args, args.batches, title)
        elif key == "bound":
            for fps in (50, 15):
                log(f"[bench] {title} at {fps} Hz")
                res = r[f"bound_{fps}hz"] = rows.sequential_bound(slice_, fps)
                log(f"  -> {res['samples_per_s']:.1f} samples/s ({res['samples']} samples)")
        else:
            r[key] = loader_row(
                title, make[key], args, args.naive_batches if key == "naive" else None
            )
    return r


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description="Rayform loader benchmark: rows 1-7 and the lever experiments"
    )
    ap.add_argument("--quick", action="store_true", help="4 episodes x 100 frames")
    ap.add_argument("--runs", type=int, default=5, help="timed runs per row (median reported)")
    ap.add_argument("--warmup", type=int, default=3, help="untimed batches after the first")
    ap.add_argument("--batches", type=int, default=20, help="batches per timed run (fast rows)")
    ap.add_argument(
        "--naive-batches", type=int, default=4, help="batches per timed run (naive row)"
    )
    ap.add_argument("--rss-epochs", type=int, default=10)
    ap.add_argument("--rows", default="1,2,3,4,5,6,7", help="comma-separated rows to run")
    ap.add_argument("--no-levers", dest="levers", action="store_false", help="skip the lever rows")
    ap.add_argument(
        "--hugepage-shm",
        action="store_true",
        help="also measure with /dev/shm remounted huge=within_size (root; restored after)",
    )
    ap.add_argument(
        "--gops",
        type=lambda s: [int(g) for g in s.split(",")],
        default=[1, 2, 10],
        help="keyframe intervals to measure (lever)",
    )
    args = ap.parse_args(argv)
    import torch

    from bench import rows

    torch.set_num_threads(1)
    w = Workload(4, 100) if args.quick else Workload(20, 400)
    t_all = time.perf_counter()
    out: dict[str, Any] = {
        "workload": {
            "episodes": w.episodes,
            "frames": w.frames,
            "fps": w.fps,
            "cameras": [w.height, w.width],
            "state_dim": 14,
            "horizon": rows.HORIZON,
        },
        "machine": _machine(),
        "settings": vars(args),
    }
    out["prepare"] = prepare(w, log)
    slice_, how = open_slice(w, log)
    out["data"] = how
    log(f"[bench] slice {slice_.id}: {len(slice_.manifest.segments)} segments via {how['client']}")
    if args.rss_epochs:
        # First, while this process has decoded nothing: forked workers inherit (and count in
        # their RSS) whatever the parent holds, e.g. the decoders of row 6, which runs in-process.
        segs = [
            s.id for s in slice_.manifest.segments[: max(1, len(slice_.manifest.segments) // 5)]
        ]
        log(
            f"[bench] worker RSS over {args.rss_epochs} epochs (EpisodeDataset 15 Hz, {len(segs)} episodes)"
        )
        out["rss"] = rows.worker_rss(
            lambda: rows.episode_loader(slice_, 15, rows.HORIZON, segments=segs),
            args.rss_epochs,
            log,
        )
    r = out["rows"] = _main_rows(w, slice_, args)
    ratios = {
        name: r[a]["samples_per_s"] / r[b]["samples_per_s"]
        for name, (a, b) in RATIOS.items()
        if a in r and b in r
    }
    out["ratios"] = ratios
    log("[bench] ratios: " + ", ".join(f"{k} = {v:.2f}" for k, v in ratios.items()))

    if args.levers:
        from bench.lever_rows import run_levers

        out["levers"] = run_levers(w, slice_, args)

    out["construction"] = rows.construction_time(slice_, 10_000, 15)
    log(f"[bench] construction on 10,000 segments: {out['construction']['seconds'] * 1e3:.1f} ms")
    out["total_s"] = time.perf_counter() - t_all
    pull = RESULTS / "pull.json"
    if pull.is_file():
        out["pull"] = json.loads(pull.read_text())
    RESULTS.mkdir(parents=True, exist_ok=True)
    dest = RESULTS / ("loader-quick.json" if args.quick else "loader.json")
    dest.write_text(json.dumps(out, indent=1, default=float) + "\n")
    log(f"[bench] wrote {dest} ({out['total_s']:.0f} s)")
    if not args.quick:
        try:
            from bench.plot import plot

            plot(out, REPO / "docs" / "benchmarks.png")
        except ImportError as exc:
            log(f"[bench] no plot ({exc}): pip install -e '.[bench]' then python -m bench.plot")
    return 0


if __name__ == "__main__":
    sys.exit(main())
