"""Runs in a LeRobot 0.6.1 environment: the text of every item as ``LeRobotDataset`` returns it.

Usage: lerobot_text.py ROOT. Prints one JSON line: ``{"items": [...]}``, per item (in index
order) its ``episode_index``, ``frame_index``, ``timestamp`` (s), ``task`` and the
``language_persistent`` and ``language_events`` rows (lists of dicts, as LeRobot returns them).
"""

from __future__ import annotations

import json
import sys

import torch
from lerobot.datasets.lerobot_dataset import LeRobotDataset


def main(root: str) -> None:
    torch.set_num_threads(1)
    ds = LeRobotDataset("rayform/text", root=root)
    items = []
    for i in range(len(ds)):
        item = ds[i]
        items.append(
            {
                "episode_index": int(item["episode_index"]),
                "frame_index": int(item["frame_index"]),
                "timestamp": float(item["timestamp"]),
                "task": item["task"],
                "language_persistent": item.get("language_persistent"),
                "language_events": item.get("language_events"),
            }
        )
    print(json.dumps({"items": items}))


if __name__ == "__main__":
    main(sys.argv[1])
