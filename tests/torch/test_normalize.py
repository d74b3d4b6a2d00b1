"""normalize= (issue 23): per-dataset statistics, cached like stats(), in the URI, and undone by
unnormalize() for deployment. White-box checks of rayform.torch._normalize included."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from support import DEMO_SLICE, ServerProcess
from torch.utils.data import DataLoader

import rayform
from rayform.errors import InvalidArgumentError
from rayform.integrations._common import dataset_profile, sample_spec
from rayform.torch import EpisodeDataset, unnormalize
from rayform.torch._normalize import Normalizer, check_normalize

OBS = {"state": "joints/position", "pose": "ee/pose"}
ACTION = {"action": "joints/position_delta"}


@pytest.fixture
def slice_(client_env: ServerProcess):
    return rayform.Client().slices.get(DEMO_SLICE)


def test_mean_std_gives_mean_0_std_1_and_constant_components_only_centred(slice_) -> None:
    ds = EpisodeDataset(
        slice_, obs=OBS, action=ACTION, fps=15, normalize="mean_std", readahead_bytes=0
    )
    assert ds.normalize == "mean_std" and "normalize=mean_std" in ds.uri and "?v=4&" in ds.uri
    batches = list(DataLoader(ds, batch_size=64, num_workers=2))
    for key in ("state", "pose"):
        x = torch.cat([b[key] for b in batches]).double()
        std = np.asarray(ds.stats()[OBS[key]]["std"])
        live = torch.from_numpy(std > 1e-6)
        assert torch.allclose(x.mean(0), torch.zeros(x.shape[1], dtype=torch.float64), atol=1e-4)
        ones = torch.ones(int(live.sum()), dtype=torch.float64)
        assert torch.allclose(x.std(0, unbiased=False)[live], ones, atol=1e-3)
        assert torch.all(x[:, ~live] == 0)
    # Deployment: the policy's output back in robot units.
    plain = EpisodeDataset(slice_, obs=OBS, action=ACTION, fps=15, readahead_bytes=0)
    back = ds.unnormalize(ds[5]["action"])
    assert torch.allclose(back, plain[5]["action"], atol=1e-5)
    assert torch.allclose(unnormalize(ds[5]["action"], ds.normalization()["action"]), back)
    d = ds.describe()
    assert d["normalize"] == "mean_std" and set(d["normalization"]) == {"state", "pose", "action"}
    # What the trackers log (W&B artifact metadata, MLflow profile): the mode and the numbers.
    profile = dataset_profile(ds)
    assert profile["normalize"] == "mean_std" and profile["normalization"] == ds.normalization()
    assert sample_spec(ds)["state"] == ("float32", (14,)) and "normalize" not in dataset_profile(
        plain
    )


def test_statistics_are_computed_once_and_cached(slice_, isolated_env) -> None:
    ds = EpisodeDataset(
        slice_, obs=OBS, action=ACTION, fps=15, normalize="quantile", readahead_bytes=0
    )
    files = (
        list((isolated_env / "stats").glob("*.json")) if (isolated_env / "stats").exists() else []
    )
    assert files == []  # the constructor read only the manifest
    stats = ds.normalization()
    assert set(stats["state"]) == {"q01", "q99"}
    assert len(list((isolated_env / "stats").glob("*.json"))) == 1
    full = ds.stats()[OBS["state"]]
    assert stats["state"]["q01"] == full["q01"]
    assert all(lo <= m for lo, m in zip(full["q01"], full["mean"], strict=True))


def test_check_normalize_and_normalizer_units() -> None:
    assert check_normalize(None, {"a": 2}) == (None, None)
    assert check_normalize("quantile", {"a": 2}) == ("quantile", None)
    mode, given = check_normalize({"a": {"mean": [1, 2], "std": [2, 0]}}, {"a": 2})
    assert mode == "given" and given == {"a": {"mean": [1.0, 2.0], "std": [2.0, 0.0]}}
    norm = Normalizer.from_stats("given", given)
    out = norm.apply({"a": torch.tensor([[3.0, 5.0]])})["a"]
    assert out.tolist() == [[1.0, 3.0]]  # std 0: only centred
    q = unnormalize(np.array([-1.0, 1.0], np.float32), {"q01": [0.0, 0.0], "q99": [2.0, 4.0]})
    assert q.tolist() == [0.0, 4.0]
    for bad, match in [
        ("zscore", "use None"),
        ({"a": {"mean": [1, 2]}}, "one pair"),
        ({"a": {"mean": [1], "std": [1]}}, "2 finite numbers"),
        ({"a": {"mean": "abc", "std": [1, 1]}}, "2 finite numbers expected, got 'abc'"),
        ({"a": {"mean": [0, 0], "std": [1, -1]}}, "std is negative in component 1"),
        ({"a": {"q01": [0, 3], "q99": [1, 2]}}, "q99 - q01 is negative in component 1"),
        ({"b": {}}, "unknown: b"),
    ]:
        with pytest.raises(InvalidArgumentError, match=match):
            check_normalize(bad, {"a": 2})
    with pytest.raises(InvalidArgumentError, match="last axis"):
        unnormalize(torch.zeros(3), {"mean": [0, 0], "std": [1, 1]})
