"""Runs in the LeRobot peer venv: convert a local v2.1 dataset to v3.0 with LeRobot's converter.

Usage: lerobot_convert21.py PARENT REPO_ID (the dataset is PARENT/REPO_ID; nothing is
downloaded or pushed). LeRobot 0.4.4 reads v2.1 only this way. Prints ``{"root": ...,
"codebase_version": ...}`` of the converted dataset (in place, at PARENT/REPO_ID).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from lerobot.datasets.v30.convert_dataset_v21_to_v30 import convert_dataset


def main(parent: str, repo_id: str) -> None:
    convert_dataset(repo_id, root=parent, push_to_hub=False, force_conversion=True)
    root = Path(parent) / repo_id
    info = json.loads((root / "meta" / "info.json").read_text())
    print(json.dumps({"root": str(root), "codebase_version": info["codebase_version"]}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
