"""Runs in the LeRobot peer venv: write a small v3.0 dataset with LeRobot's own writer.

Usage: lerobot_write.py ROOT [--language]  (3 episodes of 30, 24 and 37 frames at 30 fps: a
96x128 camera with moving bars, 6-D state and action, task "push"). Prints ``{"frames": N}``.

``--language`` (LeRobot 0.6.1 and later) gives every episode two tasks (``TASKS[e % 3]``, then
``TASKS[(e + 1) % 3]`` from frame 10) and fills LeRobot's two language columns the way
``lerobot-annotate`` does, with LeRobot's own annotation writer: per-episode rows staged as
JSONL (``EpisodeStaging``), written into the parquet shards by ``LanguageColumnsWriter``
(persistent rows on every frame, events on the frame of their timestamp), and the language
features added to ``meta/info.json`` with LeRobot's ``language_feature_info()``. The rows: a
plan and two subtasks (persistent), an interjection on frame 5 and a VQA pair about the top
camera on frame 12 (events).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import torch
from lerobot.datasets.lerobot_dataset import LeRobotDataset

LENGTHS = (30, 24, 37)
TASKS = ("push the block", "lift the block", "wipe the table")
#: The frame from which an episode holds its second task.
SWITCH = 10


def task_of(ep: int, i: int, language: bool) -> str:
    """The task of frame ``i`` of episode ``ep``."""
    if not language:
        return "push"
    return TASKS[(ep + (i >= SWITCH)) % len(TASKS)]


def annotate(root: Path) -> None:
    """Fill ``language_persistent`` and ``language_events`` with LeRobot's annotation writer."""
    from lerobot.annotations.steerable_pipeline.reader import iter_episodes
    from lerobot.annotations.steerable_pipeline.staging import EpisodeStaging
    from lerobot.annotations.steerable_pipeline.writer import LanguageColumnsWriter, speech_atom
    from lerobot.datasets.io_utils import load_info, write_info
    from lerobot.datasets.language import language_feature_info

    def row(content: str, style: str, t: float, role: str = "assistant", **kw: object) -> dict:
        return {"role": role, "content": content, "style": style, "timestamp": t,
                "camera": None, "tool_calls": None, **kw}  # fmt: skip

    records = list(iter_episodes(root))
    staging = root.parent / f"{root.name}-staging"
    for rec in records:
        ts, e = rec.frame_timestamps, rec.episode_index
        EpisodeStaging(staging, e).write(
            "plan",
            [
                row(f"reach, then {TASKS[(e + 1) % 3]}", "plan", ts[0]),
                row(f"reach {e}", "subtask", ts[0]),
                row("grasp", "subtask", ts[SWITCH]),
            ],
        )
        EpisodeStaging(staging, e).write(
            "interjections",
            # and the robot's spoken answer: a row that is only a tool call, without text
            [row("stop!", "interjection", ts[5], role="user"), speech_atom(ts[5], "stopping")],
        )
        EpisodeStaging(staging, e).write(
            "vqa",
            [
                row(
                    "what is on the table?",
                    "vqa",
                    ts[12],
                    role="user",
                    camera="observation.images.top",
                ),
                row(
                    f"a block, episode {e}",
                    "vqa",
                    ts[12],
                    camera="observation.images.top",
                    # LeRobot's writer takes one form of call per column: the dict speech_atom uses
                    tool_calls=[
                        {"type": "function", "function": {"name": "look", "arguments": {}}}
                    ],
                ),
            ],  # fmt: skip
        )
    LanguageColumnsWriter().write_all(records, staging, root)
    info = load_info(root)
    info.features = {**info.features, **language_feature_info()}
    write_info(info, root)


def main(root: str, language: bool = False) -> None:
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
                    "task": task_of(ep, i, language),
                }
            )
        ds.save_episode()
    ds.finalize()
    if language:
        annotate(Path(root))
    print(json.dumps({"frames": sum(LENGTHS)}))


if __name__ == "__main__":
    main(sys.argv[1], "--language" in sys.argv[2:])
