"""Runs in the LeRobot peer venv: train LeRobot's ACT or Diffusion Policy on a Rayform slice.

Usage: lerobot_train.py POLICY SLICE_ID STEPS (``act`` or ``diffusion``; the client from
``RAYFORM_*``). The recipe of docs/lerobot.md, small: no glue beyond
``rayform.torch.lerobot``. Prints ``{"losses": [...], "step_s": ..., "before": ...,
"after": ...}``: ``before``/``after`` are the loss on the first batch with the same seeded
noise before and after training (the training losses themselves are noisy for diffusion).
"""

from __future__ import annotations

import itertools
import json
import sys
import time
from typing import Any

import torch
from torch.utils.data import DataLoader

import rayform
from rayform.torch import EpisodeDataset, EpisodeSampler
from rayform.torch.lerobot import LeRobotCollate, lerobot_stats, policy_features


def make_policy(name: str, inputs: dict[str, Any], outputs: dict[str, Any]) -> tuple[Any, Any]:
    if name == "act":
        from lerobot.policies.act.configuration_act import ACTConfig
        from lerobot.policies.act.modeling_act import ACTPolicy

        cfg = ACTConfig(
            input_features=inputs,
            output_features=outputs,
            chunk_size=8,
            n_action_steps=8,
            dim_model=64,
            n_heads=2,
            dim_feedforward=128,
            n_encoder_layers=1,
            n_vae_encoder_layers=1,
            latent_dim=8,
            pretrained_backbone_weights=None,
            device="cpu",
        )
        return cfg, ACTPolicy(cfg)
    from lerobot.policies.diffusion.configuration_diffusion import DiffusionConfig
    from lerobot.policies.diffusion.modeling_diffusion import DiffusionPolicy

    cfg = DiffusionConfig(
        input_features=inputs,
        output_features=outputs,
        n_obs_steps=2,
        horizon=8,
        n_action_steps=4,
        crop_shape=(80, 112),
        down_dims=(32, 64),
        diffusion_step_embed_dim=32,
        num_train_timesteps=20,
        pretrained_backbone_weights=None,
        use_group_norm=True,
        device="cpu",
    )
    return cfg, DiffusionPolicy(cfg)


def main(name: str, slice_id: str, steps: int) -> None:
    from lerobot.policies.factory import make_pre_post_processors

    torch.manual_seed(0)
    torch.set_num_threads(1)
    slice_ = rayform.Client().slices.get(slice_id)
    dataset = EpisodeDataset(
        slice_,
        obs={"observation.images.cam0": "cam0/rgb", "observation.state": "joints/position"},
        action={"action": "joints/position_delta"},
        fps=15,
        horizon=8,
        obs_steps=2 if name == "diffusion" else 1,
        shard=None,
    )
    inputs, outputs = policy_features(dataset)
    cfg, policy = make_policy(name, inputs, outputs)
    preprocess, _ = make_pre_post_processors(cfg, dataset_stats=lerobot_stats(dataset))
    loader = DataLoader(
        dataset,
        batch_size=8,
        sampler=EpisodeSampler(dataset, shuffle=True),
        num_workers=1,
        collate_fn=LeRobotCollate(dataset),
    )
    optimizer = torch.optim.AdamW(policy.parameters(), lr=1e-3)
    policy.train()
    fixed = preprocess(next(iter(loader)))

    def fixed_loss() -> float:
        torch.manual_seed(1)
        with torch.no_grad():
            return float(policy.forward(fixed)[0])

    before = fixed_loss()
    losses = []
    start = time.perf_counter()
    for batch in itertools.islice(itertools.chain.from_iterable(itertools.repeat(loader)), steps):
        loss, _ = policy.forward(preprocess(batch))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(float(loss))
    step_s = (time.perf_counter() - start) / steps
    out = {"losses": losses, "step_s": step_s, "before": before, "after": fixed_loss()}
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
