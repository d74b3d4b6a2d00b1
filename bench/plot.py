"""The benchmark plot: samples/s per system (``docs/benchmarks.png``), from a results JSON.

Usage: ``.venv/bin/python bench/plot.py [bench/results/loader.json] [docs/benchmarks.png]``.
Needs matplotlib (the ``bench`` extra: ``pip install -e ".[bench]"``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

LABELS = {
    "naive": "1. naive\n(decoder per sample)",
    "lerobot": "2. LeRobotDataset\n(50 Hz, torchcodec)",
    "episode_50hz": "3. EpisodeDataset\n50 Hz,\ndefault_collate",
    "episode_15hz": "4. EpisodeDataset\n15 Hz,\ndefault_collate",
    "bound_50hz": "5. sequential\nbound, 50 Hz",
    "episode_50hz_threads": "6. EpisodeDataset\n50 Hz, 2 decode\nthreads, no workers",
    "episode_50hz_collate": "7. EpisodeDataset\n50 Hz, rayform.\ntorch.collate",
}


def plot(results: dict[str, Any], dest: Path) -> None:
    """Bar chart of the median samples/s of each row, with every run as a dot."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = results["rows"]
    keys = [k for k in LABELS if k in rows]
    fig, ax = plt.subplots(figsize=(10.5, 4.8), dpi=110)
    colors = ["#999999", "#d98c3a", "#2f6db5", "#5a9be0", "#444444", "#1d8f5a", "#7a3fb0"]
    for i, k in enumerate(keys):
        ax.bar(i, rows[k]["samples_per_s"], color=colors[list(LABELS).index(k)])
        ax.text(
            i, rows[k]["samples_per_s"], f"{rows[k]['samples_per_s']:.0f}", ha="center", va="bottom"
        )
        for v in rows[k].get("runs", []):
            ax.plot(i, v, "k.", ms=4)
    ax.set_xticks(range(len(keys)), [LABELS[k] for k in keys], fontsize=8)
    ax.set_ylabel("samples / s (batch 32; rows 1-4, 7: 2 workers)")
    w = results["workload"]
    ax.set_title(
        f"{w['episodes']} episodes x {w['frames']} frames, 2 cameras {w['cameras'][0]}x"
        f"{w['cameras'][1]}, horizon {w['horizon']} — {results['machine']['cores']} CPU cores",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(dest)
    plt.close(fig)


if __name__ == "__main__":
    src = Path(sys.argv[1] if len(sys.argv) > 1 else "bench/results/loader.json")
    plot(
        json.loads(src.read_text()),
        Path(sys.argv[2] if len(sys.argv) > 2 else "docs/benchmarks.png"),
    )
