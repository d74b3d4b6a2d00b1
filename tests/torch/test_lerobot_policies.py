"""LeRobot's ACT and Diffusion Policy train on a Rayform slice with no glue beyond
``rayform.torch.lerobot`` (in the LeRobot 0.4.4 peer venv), and the helpers' own contract."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch
from support import DEMO_SLICE
from support.lerobot_peer import run_peer

import rayform
from rayform.errors import InvalidArgumentError
from rayform.torch import EpisodeDataset
from rayform.torch.lerobot import LeRobotCollate, PolicyFeatureSpec, lerobot_stats, policy_features

OBS = {"observation.images.cam0": "cam0/rgb", "observation.state": "joints/position"}
ACTION = {"action": "joints/position_delta"}


@pytest.mark.slow
@pytest.mark.parametrize(("policy", "steps", "ratio"), [("act", 30, 0.5), ("diffusion", 40, 0.95)])
def test_lerobot_policy_trains_on_a_slice(
    client_env, policy: str, steps: int, ratio: float
) -> None:
    got = run_peer("lerobot_train.py", policy, DEMO_SLICE, str(steps), rayform=True)
    assert len(got["losses"]) == steps and all(np.isfinite(got["losses"]))
    # the loss on one batch with the same noise, before and after training
    assert got["after"] < ratio * got["before"], got


def test_helpers_without_lerobot(client_env) -> None:
    with rayform.Client() as client:
        ds = EpisodeDataset(
            client.slices.get(DEMO_SLICE), obs=OBS, action=ACTION, fps=15, horizon=4, shard=None
        )
        inputs, outputs = policy_features(ds)  # lerobot is not installed here
        assert inputs == {
            "observation.images.cam0": PolicyFeatureSpec("VISUAL", (3, 96, 128)),
            "observation.state": PolicyFeatureSpec("STATE", (14,)),
        }
        assert outputs == {"action": PolicyFeatureSpec("ACTION", (14,))}
        stats = lerobot_stats(ds)
        raw = ds.stats()
        for key, stream in [
            ("observation.state", "joints/position"),
            ("action", "joints/position_delta"),
        ]:
            for name in ("mean", "std", "min", "max", "q01", "q99"):
                np.testing.assert_array_equal(stats[key][name], np.float32(raw[stream][name]))
        assert stats["observation.images.cam0"]["mean"].shape == (3, 1, 1)
        assert "observation.images.cam0" not in lerobot_stats(ds, images=None)

        collate = pickle.loads(pickle.dumps(LeRobotCollate(ds)))
        batch = collate([ds[0], ds[1]])
        frames = batch["observation.images.cam0"]
        assert frames.dtype == torch.float32 and frames.shape == (2, 3, 96, 128)
        assert float(frames.min()) >= 0.0 and float(frames.max()) <= 1.0
        torch.testing.assert_close(frames[0], ds[0]["observation.images.cam0"].float() / 255)
        assert "meta" not in batch and batch["action"].shape == (2, 4, 14)
        assert batch["action_is_pad"].dtype == torch.bool

        no_action = EpisodeDataset(
            client.slices.get(DEMO_SLICE), obs=OBS, action=None, fps=15, shard=None
        )
        with pytest.raises(InvalidArgumentError, match="no action"):
            policy_features(no_action)
