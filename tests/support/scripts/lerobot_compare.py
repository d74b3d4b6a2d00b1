"""Runs in the LeRobot peer venv: compare two LeRobot datasets as ``LeRobotDataset`` loads them.

Usage: lerobot_compare.py ORIGINAL EXPORTED [--skip KEY ...]. Prints one JSON line: ``tables_equal`` (every
non-frame value of every item identical: indices, timestamps, vectors, task), ``episodes``
of both (length, ``dataset_from_index``, ``dataset_to_index``), the frames' PSNR (min and
mean, dB, pixels in [0, 1]), and the same for items with ``delta_timestamps`` windows
(``windows_equal``: actions, padding masks; ``window_psnr_min``). ``--skip KEY`` leaves an
item key out of the comparison (``task_index``: an export numbers the tasks in its own order).
"""

from __future__ import annotations

import json
import math
import sys
from typing import Any

import torch
from lerobot.datasets.lerobot_dataset import LeRobotDataset

DELTAS = {
    "action": [k / 30 for k in range(0, 10)],
    "observation.state": [-2 / 30, -1 / 30, 0.0],
    "observation.images.top": [-1 / 30, 0.0],
}


def psnr(a: torch.Tensor, b: torch.Tensor) -> float:
    mse = float(((a - b) ** 2).mean())
    return 99.0 if mse == 0 else 10 * math.log10(1.0 / mse)


def compare(a: LeRobotDataset, b: LeRobotDataset, skip: frozenset[str]) -> dict[str, Any]:
    out: dict[str, Any] = {"len": [len(a), len(b)], "tables_equal": True, "diff": []}
    psnrs = []
    for i in range(len(a)):
        x, y = a[i], b[i]
        if sorted(x) != sorted(y):
            out["tables_equal"] = False
            out["diff"].append([i, sorted(x), sorted(y)])
            continue
        for k in x:
            if k in skip:
                continue
            if k.startswith("observation.images") and not k.endswith("_is_pad"):
                psnrs.append(psnr(x[k], y[k]))
            elif isinstance(x[k], torch.Tensor):
                if x[k].dtype != y[k].dtype or not torch.equal(x[k], y[k]):
                    out["tables_equal"] = False
                    out["diff"].append([i, k, str(x[k]), str(y[k])])
            elif x[k] != y[k]:
                out["tables_equal"] = False
                out["diff"].append([i, k, str(x[k]), str(y[k])])
    out["psnr_min"], out["psnr_mean"] = min(psnrs), sum(psnrs) / len(psnrs)
    out["diff"] = out["diff"][:5]
    return out


def episodes(ds: LeRobotDataset) -> list[list[int]]:
    eps = ds.meta.episodes
    return [
        [int(n), int(f), int(t)]
        for n, f, t in zip(
            eps["length"], eps["dataset_from_index"], eps["dataset_to_index"], strict=True
        )
    ]


def main(original: str, exported: str, skip: frozenset[str] = frozenset()) -> None:
    torch.set_num_threads(1)
    a = LeRobotDataset("rayform/a", root=original)
    b = LeRobotDataset("rayform/b", root=exported)
    out = compare(a, b, skip)
    out["episodes"] = [episodes(a), episodes(b)]
    out["fps"] = [a.fps, b.fps]
    out["info_rayform"] = b.meta.info.get("rayform")
    a = LeRobotDataset("rayform/a", root=original, delta_timestamps=DELTAS)
    b = LeRobotDataset("rayform/b", root=exported, delta_timestamps=DELTAS)
    windows = compare(a, b, skip)
    out["windows_equal"] = windows["tables_equal"]
    out["window_diff"] = windows["diff"]
    out["window_psnr_min"] = windows["psnr_min"]
    print(json.dumps(out))


if __name__ == "__main__":
    rest = sys.argv[3:]
    main(
        sys.argv[1],
        sys.argv[2],
        frozenset(rest[i + 1] for i, a in enumerate(rest) if a == "--skip"),
    )
