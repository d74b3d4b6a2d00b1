"""Runs in the LeRobot peer venv: write a small v3.0 dataset with LeRobot's own writer.

Usage: lerobot_write.py ROOT  (3 episodes of 30, 24 and 37 frames at 30 fps: a 96x128
camera with moving bars, 6-D state and action, task "push"). Prints ``{"frames": N}``.
"""

from __future__ import annotations

import json
import sys

import numpy as np
import torch
from lerobot.datasets.lerobot_dataset import LeRobotDataset

LENGTHS = (30, 24, 37)


def main(root: str) -> None:
    torch.set_num_threads(1)
    names = [f"j{i}" for i in range(6)]
    features = {
        "observation.images.top": {
            "dtype": "video",
            "shape": (96, 128, 3),
            "names": ["height", "width", "channels"],
        },
        "observation.state": {"dtype": "float32", "shape": (6,), "names": names},
        "action": {"dtype": "float32", "shape": (6,), "names": names},
    }
    ds = LeRobotDataset.create(
        "rayform/roundtrip", fps=30, features=features, root=root, use_videos=True
    )
    rng = np.random.default_rng(0)
    for ep, n in enumerate(LENGTHS):
        for i in range(n):
            img = np.zeros((96, 128, 3), np.uint8)
            x = (12 * i + 20 * ep) % 112
            img[:, x : x + 16] = (255, 128, 0)
            y = (7 * i) % 80
            img[y : y + 16, :, 2] = 200
            ds.add_frame(
                {
                    "observation.images.top": img,
                    "observation.state": rng.standard_normal(6).astype(np.float32),
                    "action": rng.standard_normal(6).astype(np.float32),
                    "task": "push",
                }
            )
        ds.save_episode()
    ds.finalize()
    print(json.dumps({"frames": sum(LENGTHS)}))


if __name__ == "__main__":
    main(sys.argv[1])
