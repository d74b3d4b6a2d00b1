"""Runs in a LeRobot environment (0.4.4's peer venv, or 0.3.3 for v2.1): dump what
``LeRobotDataset`` returns for every item, without and with ``delta_timestamps`` windows.

Usage: lerobot_dump.py ROOT OUT_NPZ. Uses only what LeRobot 0.3 and 0.4 share. Prints
``{"version": ..., "codebase_version": ..., "len": N}``.
"""

from __future__ import annotations

import json
import sys

import lerobot
import numpy as np
import torch
from lerobot.datasets.lerobot_dataset import LeRobotDataset

DELTAS = {
    "action": [k / 30 for k in range(0, 10)],
    "observation.state": [-2 / 30, -1 / 30, 0.0],
    "observation.images.top": [-1 / 30, 0.0],
}


def dump(ds: LeRobotDataset, prefix: str, out: dict[str, np.ndarray]) -> None:
    items = [ds[i] for i in range(len(ds))]
    for key in items[0]:
        if key == "task":
            out[prefix + key] = np.array([it[key] for it in items])
        elif key.startswith("observation.images") and not key.endswith("_is_pad"):
            frames = torch.stack([it[key] for it in items])
            out[prefix + key] = (frames * 255).round().to(torch.uint8).numpy()
        else:
            out[prefix + key] = torch.stack([torch.as_tensor(it[key]) for it in items]).numpy()


def main(root: str, path: str) -> None:
    torch.set_num_threads(1)
    ds = LeRobotDataset("rayform/dump", root=root)
    out: dict[str, np.ndarray] = {}
    dump(ds, "", out)
    dump(LeRobotDataset("rayform/dump", root=root, delta_timestamps=DELTAS), "window/", out)
    np.savez(path, **out)  # type: ignore[arg-type]
    info = {"version": lerobot.__version__, "codebase_version": ds.meta.info["codebase_version"]}
    print(json.dumps({**info, "len": len(ds)}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
