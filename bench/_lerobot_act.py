"""ACT's training step fed from a Rayform slice vs ``LeRobotDataset`` (runs in the PEER venv).

Usage: ``.peer-venv/bin/python bench/_lerobot_act.py SLICE LEROBOT_DIR OUT_JSON --rounds R
--steps N`` with ``RAYFORM_*`` pointing at a server of the slice and ``PYTHONPATH=sdk``.
The same ACT (ResNet-18 backbone, not pretrained, ``chunk_size=30``, batch 8) trains on
``cam0/rgb`` + ``joints/position`` -> ``joints/position_delta`` at 30 fps, fed by:

* ``rayform``: ``EpisodeDataset`` from the slice, ``EpisodeSampler(shuffle=True)``,
  ``rayform.torch.lerobot.LeRobotCollate`` (frames to float in the workers);
* ``lerobot``: ``LeRobotDataset`` on the export of the same episodes, ``delta_timestamps`` for
  the 30 actions, ``shuffle=True``, its default video backend.

Both with ``num_workers=2, persistent_workers=True``, in alternating rounds; each round runs
3 warm-up steps then ``N`` timed steps. Per step: the wait for the next batch and the whole
step (wait + preprocess + forward + backward + optimizer). Writes a JSON object.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

import torch
from lerobot.datasets.lerobot_dataset import LeRobotDataset
from lerobot.policies.act.configuration_act import ACTConfig
from lerobot.policies.act.modeling_act import ACTPolicy
from lerobot.policies.factory import make_pre_post_processors
from torch.utils.data import DataLoader

import rayform
from rayform.torch import EpisodeDataset, EpisodeSampler
from rayform.torch.lerobot import LeRobotCollate, lerobot_stats, policy_features

CHUNK, BATCH, FPS, WARMUP = 30, 8, 30, 3


def loaders(slice_id: str, lerobot_dir: str) -> tuple[dict[str, Any], Any, Any]:
    ds = EpisodeDataset(
        rayform.Client().slices.get(slice_id),
        obs={"observation.images.cam0": "cam0/rgb", "observation.state": "joints/position"},
        action={"action": "joints/position_delta"},
        fps=FPS,
        horizon=CHUNK,
        shard=None,
    )
    ours = DataLoader(
        ds,
        batch_size=BATCH,
        sampler=EpisodeSampler(ds, shuffle=True),
        num_workers=2,
        persistent_workers=True,
        collate_fn=LeRobotCollate(ds),
    )
    lr = LeRobotDataset(
        "rayform/bench",
        root=lerobot_dir,
        delta_timestamps={"action": [i / FPS for i in range(CHUNK)]},
    )
    theirs = DataLoader(lr, batch_size=BATCH, shuffle=True, num_workers=2, persistent_workers=True)
    return {"rayform": ours, "lerobot": theirs}, ds, lr


def run(policy: Any, preprocess: Any, loader: DataLoader, steps: int) -> dict[str, float]:
    optimizer = torch.optim.AdamW(policy.parameters(), lr=1e-5)
    it = iter(loader)
    waits, totals = [], []
    for step in range(WARMUP + steps):
        t0 = time.perf_counter()
        try:
            batch = next(it)
        except StopIteration:
            it = iter(loader)
            batch = next(it)
        t1 = time.perf_counter()
        batch = {k: v for k, v in batch.items() if k != "task"} if "task" in batch else batch
        loss, _ = policy.forward(preprocess(batch))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        t2 = time.perf_counter()
        if step >= WARMUP:
            waits.append(t1 - t0)
            totals.append(t2 - t0)
    return {
        "step_s": statistics.mean(totals),
        "wait_s": statistics.mean(waits),
        "wait_share": sum(waits) / sum(totals),
    }


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("slice_id")
    p.add_argument("lerobot_dir")
    p.add_argument("out")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--steps", type=int, default=20)
    args = p.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    by_name, ds, _ = loaders(args.slice_id, args.lerobot_dir)
    inputs, outputs = policy_features(ds)
    cfg = ACTConfig(
        input_features=inputs,
        output_features=outputs,
        chunk_size=CHUNK,
        n_action_steps=CHUNK,
        pretrained_backbone_weights=None,
        device="cpu",
    )
    policy = ACTPolicy(cfg)
    policy.train()
    preprocess, _ = make_pre_post_processors(cfg, dataset_stats=lerobot_stats(ds))
    rounds: list[dict[str, Any]] = []
    for r in range(args.rounds):
        row: dict[str, Any] = {}
        for name in ("rayform", "lerobot") if r % 2 == 0 else ("lerobot", "rayform"):
            row[name] = run(policy, preprocess, by_name[name], args.steps)
            print(f"round {r} {name}: {row[name]}", flush=True)
        row["step_ratio"] = row["lerobot"]["step_s"] / row["rayform"]["step_s"]
        rounds.append(row)
    with open(args.out, "w") as f:
        json.dump({"rounds": rounds, "chunk": CHUNK, "batch": BATCH, "fps": FPS}, f, indent=2)


if __name__ == "__main__":
    main()
