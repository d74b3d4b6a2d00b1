"""Markdown tables for ``docs/benchmarks.md`` from a results JSON.

Usage: ``.venv/bin/python bench/report.py [bench/results/loader.json]``; prints to stdout.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

ROWS = (
    ("naive", "1. naive: new torchcodec decoder per `__getitem__`, no cache (50 Hz)"),
    ("lerobot", "2. `LeRobotDataset` defaults (torchcodec, AV1 g=2, float32 images), 50 Hz"),
    ("episode_50hz", "3. `EpisodeDataset` fps=50 (uint8)"),
    ("episode_15hz", "4. `EpisodeDataset` fps=15 (uint8)"),
    ("bound_50hz", "5. sequential-epoch bound, 50 Hz (2 processes)"),
    ("bound_15hz", "5'. sequential-epoch bound, 15 Hz (2 processes)"),
    (
        "episode_50hz_threads",
        "6. `EpisodeDataset` fps=50, `decode_threads=2`, `DataLoader(num_workers=0)`",
    ),
    ("episode_50hz_collate", "7. `EpisodeDataset` fps=50, `collate_fn=rayform.torch.collate`"),
)


def _runs(r: dict[str, Any]) -> str:
    return ", ".join(f"{v:.0f}" for v in r.get("runs", []))


def tables(res: dict[str, Any]) -> str:
    """The main table, the ratios, and the lever table."""
    rows = res["rows"]
    out = ["| row | samples/s (median) | runs | time to first batch (s) |", "|---|---:|---|---:|"]
    for key, label in ROWS:
        if key in rows:
            r = rows[key]
            first = f"{r['first_batch_s']:.2f}" if "first_batch_s" in r else "-"
            out.append(f"| {label} | **{r['samples_per_s']:.1f}** | {_runs(r)} | {first} |")
    out += ["", "| ratio | value |", "|---|---:|"]
    out += [f"| {k} | {v:.2f} |" for k, v in res.get("ratios", {}).items()]
    lev = res.get("levers", {})
    if lev:
        out += [
            "",
            "| lever (EpisodeDataset, 50 Hz, same loader) | samples/s (median) | runs |",
            "|---|---:|---|",
        ]
        for key, r in lev.items():
            if key == "profile" or key.startswith(("gop_", "cpu_per_sample")):
                continue
            out.append(f"| {key} | {r['samples_per_s']:.1f} | {_runs(r)} |")
        gops = {k: v for k, v in lev.items() if k.startswith("gop_")}
        if gops:
            out += [
                "",
                "| keyframe interval (4 episodes re-encoded) | video MB | loader samples/s | "
                "one process, no loader | sequential bound |",
                "|---:|---:|---:|---:|---:|",
            ]
            for key, r in gops.items():
                one = r.get("getitems_one_process")
                out.append(
                    f"| {key[4:]} | {r['video_bytes'] / 1e6:.1f} | {r['samples_per_s']:.1f} | "
                    f"{one:.1f} | {r['bound']['samples_per_s']:.1f} |"
                    if one
                    else f"| {key[4:]} | {r['video_bytes'] / 1e6:.1f} | {r['samples_per_s']:.1f} | - | "
                    f"{r['bound']['samples_per_s']:.1f} |"
                )
    cpu = dict(lev.get("cpu_per_sample", {}))
    for key, label in (
        ("cpu_per_sample_hugepage_shm", "episode_50hz, /dev/shm huge=within_size"),
        ("cpu_per_sample_malloc_threads", "episode_50hz_threads, malloc tuned"),
        ("cpu_per_sample_malloc_collate", "episode_50hz_collate, malloc tuned"),
        (
            "cpu_per_sample_malloc_hugepage_shm",
            "episode_50hz, malloc tuned, /dev/shm huge=within_size",
        ),
    ):
        if key in lev:
            cpu[label] = lev[key]
    if cpu:
        out += [
            "",
            "| loader | samples/s | CPU ms per sample, user + system (all processes) | per process "
            "(user/system ms) |",
            "|---|---:|---:|---|",
        ]
        for key, r in cpu.items():
            per = ", ".join(
                f"{p} {v['user_ms']:.2f}/{v['sys_ms']:.2f}" for p, v in r["per_process"].items()
            )
            out.append(
                f"| {key} | {r['samples_per_s']:.1f} | {r['total_user_ms']:.2f} + {r['total_sys_ms']:.2f} "
                f"| {per} |"
            )
    return "\n".join(out)


if __name__ == "__main__":
    print(
        tables(
            json.loads(
                Path(sys.argv[1] if len(sys.argv) > 1 else "bench/results/loader.json").read_text()
            )
        )
    )
