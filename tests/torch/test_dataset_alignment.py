"""EpisodeDataset semantics: grid, frame choice, action chunks, obs_steps, frames, meta."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch
from support.datasets import FPS, MS, SQ, build_slice, decode_index_frame
from torch.utils.data import DataLoader

from rayform.errors import InvalidArgumentError, NotFoundError
from rayform.torch import EpisodeDataset, split_episodes

OBS = ["cam0/rgb", "joints/position"]
ACTION = "joints/position_delta"


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("align")
    return build_slice(root / "store", root / "cache")


def latest(times: np.ndarray, t: int) -> int:
    """Independent oracle: index of the last written time <= t (plain Python)."""
    return max(i for i, x in enumerate(times.tolist()) if x <= t)


def grid_len(truth) -> int:
    # Grid starts at the first video frame (latest first record); ends at the video's last.
    return (truth.end - truth.t0) // (100 * MS) + 1


def test_grid_and_frames_between_on_and_after_frame_times(data) -> None:
    slice_, truths = data
    ds = EpisodeDataset(slice_, obs=OBS, action=ACTION, fps=FPS, horizon=4)
    assert len(ds) == sum(grid_len(t) for t in truths)
    samples = ds.__getitems__(list(range(len(ds))))
    pos = 0
    for truth in truths:
        vt = truth.video_t
        for k in range(grid_len(truth)):
            s = samples[pos + k]
            t = truth.t0 + k * 100 * MS
            assert int(s["t_ns"]) == t
            assert decode_index_frame(s["cam0/rgb"].numpy()) == latest(vt, t), (truth.id, k)
            assert s["joints/position"][0].item() == latest(truth.joints_t, t)
        # The planted cases, spelled out.
        on = int(np.flatnonzero(vt == truth.t0 + 300 * MS)[0])
        assert decode_index_frame(samples[pos + 3]["cam0/rgb"].numpy()) == on
        before = int(np.flatnonzero(vt == truth.t0 + 500 * MS - 1)[0])
        assert decode_index_frame(samples[pos + 5]["cam0/rgb"].numpy()) == before
        after = int(np.flatnonzero(vt == truth.t0 + 700 * MS + 1)[0])
        assert decode_index_frame(samples[pos + 7]["cam0/rgb"].numpy()) == after - 1
        if grid_len(truth) > 14:
            gap = {
                decode_index_frame(samples[pos + k]["cam0/rgb"].numpy()) for k in (11, 12, 13, 14)
            }
            assert gap == {int(np.searchsorted(vt, truth.t0 + 1050 * MS)) - 1}
        pos += grid_len(truth)


def test_single_items_equal_batched_items(data) -> None:
    slice_, _ = data
    ds = EpisodeDataset(slice_, obs=OBS, action=ACTION, fps=FPS, horizon=3)
    keys = [40, 2, 33, 2, 0, len(ds) - 1]
    batch = ds.__getitems__(keys)
    for key, b in zip(keys, batch, strict=True):
        one = ds[key]
        assert torch.equal(one["cam0/rgb"], b["cam0/rgb"])
        assert torch.equal(one["action"], b["action"])
    assert torch.equal(ds[-1]["t_ns"], ds[len(ds) - 1]["t_ns"])
    with pytest.raises(IndexError):
        ds[len(ds)]


@pytest.mark.parametrize("mode", ["hold", "nearest", "linear"])
def test_action_chunks_and_padding(data, mode: str) -> None:
    slice_, truths = data
    horizon = 5
    ds = EpisodeDataset(slice_, obs=OBS, action=ACTION, fps=FPS, horizon=horizon, action_mode=mode)
    truth = truths[1]
    n = grid_len(truth)
    base = len(ds) - n
    at = truth.action_t.tolist()
    for k in [0, 7, n - 3, n - 1]:
        s = ds[base + k]
        assert s["action"].shape == (horizon, 2) and s["action"].dtype == torch.float32
        assert s["action_is_pad"].tolist() == [k + j >= n for j in range(horizon)]
        for j in range(horizon):
            t = truth.t0 + min(k + j, n - 1) * 100 * MS
            lo = latest(truth.action_t, t)
            if mode == "hold":
                want = float(lo)
            elif mode == "nearest":
                want = float(lo + 1) if (at[lo + 1] - t) < (t - at[lo]) else float(lo)
            else:
                want = lo + (t - at[lo]) / (at[lo + 1] - at[lo])
            assert s["action"][j, 0].item() == pytest.approx(want, abs=1e-4), (k, j)
            assert s["action"][j, 1].item() == pytest.approx(-want, abs=1e-4)
        if k == n - 1:  # padded with the last value
            assert torch.equal(s["action"][1:], s["action"][:1].expand(horizon - 1, 2))


def test_obs_steps_history_and_padding(data) -> None:
    slice_, truths = data
    ds = EpisodeDataset(slice_, obs=OBS, action=ACTION, fps=FPS, obs_steps=3)
    truth = truths[0]
    s0, s4 = ds[0], ds[4]
    assert s0["cam0/rgb"].shape == (3, 3, 64, 64) and s0["cam0/rgb"].dtype == torch.uint8
    assert s0["joints/position"].shape == (3, 2)
    assert s0["joints/position_is_pad"].tolist() == [True, True, False]
    assert s0["cam0/rgb_is_pad"].tolist() == [True, True, False]
    assert s4["joints/position_is_pad"].tolist() == [False, False, False]
    for j, k in enumerate([2, 3, 4]):
        t = truth.t0 + k * 100 * MS
        assert s4["joints/position"][j, 0].item() == latest(truth.joints_t, t)
        assert decode_index_frame(s4["cam0/rgb"][j].numpy()) == latest(truth.video_t, t)
    # Padded steps repeat the first grid step.
    assert torch.equal(s0["joints/position"][0], s0["joints/position"][2])


def test_frame_conversions_against_hand_computed_poses(data) -> None:
    slice_, truths = data
    obs = ["ee/pose", "tool/position", "joints/position"]
    truth = truths[0]
    k = 6
    start = max(int(truth.pose_t[0]), int(truth.tool_t[0]), int(truth.joints_t[0]))  # no camera
    t = start + k * 100 * MS
    pi, ti = latest(truth.pose_t, t), latest(truth.tool_t, t)
    ji = latest(truth.joints_t, t)
    got = {
        f: EpisodeDataset(slice_, obs=obs, action=None, fps=FPS, frame=f)[k]
        for f in (None, "ros", "opencv")
    }
    # Stored: ee/pose in ROS = (1+i, 2, 3) with a 90 deg yaw; tool/position in OpenCV = (1, 2, 3+i).
    stored_pose = [1 + pi, 2, 3, 0, 0, SQ, SQ]
    assert got[None]["ee/pose"].tolist() == pytest.approx(stored_pose, abs=1e-6)
    assert got[None]["tool/position"].tolist() == pytest.approx([1, 2, 3 + ti])
    assert got["ros"]["ee/pose"].tolist() == pytest.approx(stored_pose, abs=1e-6)
    # OpenCV -> ROS: x_ros = z_cv, y_ros = -x_cv, z_ros = -y_cv.
    assert got["ros"]["tool/position"].tolist() == pytest.approx([3 + ti, -1, -2])
    # ROS -> OpenCV: x_cv = -y_ros, y_cv = -z_ros, z_cv = x_ros; a yaw about +z_ros is a
    # rotation about -y_cv: quaternion (0, -sin 45, 0, cos 45).
    assert got["opencv"]["ee/pose"].tolist() == pytest.approx(
        [-2, -3, 1 + pi, 0, -SQ, 0, SQ], abs=1e-6
    )
    assert got["opencv"]["tool/position"].tolist() == pytest.approx([1, 2, 3 + ti])
    for f in got:  # joint space is never touched
        assert got[f]["joints/position"].tolist() == [ji, ji * 0.5]


def test_meta_and_default_collate(data) -> None:
    slice_, truths = data
    ds = EpisodeDataset(slice_, obs=OBS, action=ACTION, fps=FPS, horizon=2)
    last = ds[len(ds) - 1]["meta"]
    assert last == {
        "slice": slice_.id,
        "segment": truths[1].id,
        "segment_version": 2,
        "site": "lab-b",
    }
    assert ds[0]["meta"] == {
        "slice": slice_.id,
        "segment": truths[0].id,
        "segment_version": 1,
        "site": "lab-a",
    }
    batch = next(iter(DataLoader(ds, batch_size=4)))
    assert batch["cam0/rgb"].shape == (4, 3, 64, 64)
    assert batch["action"].shape == (4, 2, 2) and batch["action_is_pad"].shape == (4, 2)
    assert batch["t_ns"].dtype == torch.int64 and batch["t_ns"].shape == (4,)
    assert batch["meta"]["segment"] == [truths[0].id] * 4
    assert batch["meta"]["segment_version"].tolist() == [1] * 4


def test_construction_opens_nothing_and_validates(data) -> None:
    slice_, _ = data
    calls = slice_.client.calls
    fds = set(os.listdir("/proc/self/fd"))
    ds = EpisodeDataset(slice_, obs=OBS, action=ACTION, fps=15, horizon=16, frame="ros")
    assert slice_.client.calls == calls and set(os.listdir("/proc/self/fd")) <= fds
    assert len(ds) > 0
    with pytest.raises(NotFoundError, match="available streams: cam0/rgb, ee/pose"):
        EpisodeDataset(slice_, obs=["cam9/rgb"], action=ACTION, fps=15)
    with pytest.raises(NotFoundError, match="joints/nope"):
        EpisodeDataset(slice_, obs=OBS, action="joints/nope", fps=15)
    for bad in (0, -1, float("nan"), float("inf"), "15", True):
        with pytest.raises(InvalidArgumentError, match="fps="):
            EpisodeDataset(slice_, obs=OBS, action=ACTION, fps=bad)
    with pytest.raises(InvalidArgumentError, match="horizon=0"):
        EpisodeDataset(slice_, obs=OBS, action=ACTION, fps=15, horizon=0)
    with pytest.raises(InvalidArgumentError, match="obs_steps"):
        EpisodeDataset(slice_, obs=OBS, action=ACTION, fps=15, obs_steps=0)
    with pytest.raises(InvalidArgumentError, match="'enu'.*'ros'.*'opencv'"):
        EpisodeDataset(slice_, obs=OBS, action=ACTION, fps=15, frame="enu")
    with pytest.raises(InvalidArgumentError, match="video stream"):
        EpisodeDataset(slice_, obs=["joints/position"], action="cam0/rgb", fps=15)
    with pytest.raises(InvalidArgumentError, match="list of stream names"):
        EpisodeDataset(slice_, obs="cam0/rgb", action=ACTION, fps=15)
    with pytest.raises(InvalidArgumentError, match="action_mode"):
        EpisodeDataset(slice_, obs=OBS, action=ACTION, fps=15, action_mode="cubic")
    with pytest.raises(InvalidArgumentError, match="ddp_even"):
        EpisodeDataset(slice_, obs=OBS, action=ACTION, fps=15, ddp_even="wrap")
    with pytest.raises(NotFoundError, match="seg_deadbeef"):
        EpisodeDataset(slice_, obs=OBS, action=ACTION, fps=15, segments=["seg_deadbeef"])


def test_segments_selection_and_split(data) -> None:
    slice_, truths = data
    ds = EpisodeDataset(slice_, obs=OBS, action=ACTION, fps=FPS, segments=[truths[1].id])
    assert len(ds) == grid_len(truths[1])
    assert {ds[i]["meta"]["segment"] for i in range(0, len(ds), 5)} == {truths[1].id}
    ids = [f"seg_{i:08x}" for i in range(2000)]
    train, val = split_episodes(ids[:1000], 0.2, seed=3)
    assert not set(train) & set(val) and len(train) + len(val) == 1000
    assert 150 < len(val) < 250
    train2, val2 = split_episodes(ids, 0.2, seed=3)  # the slice grew: old decisions stand
    assert set(val) <= set(val2) and set(train) <= set(train2)
    assert split_episodes(ids[:1000], 0.2, seed=4) != (train, val)
    assert split_episodes(slice_, 0.0) == ([t.id for t in truths], [])


def test_stats_match_independent_values_and_are_cached(data, tmp_path: Path) -> None:
    slice_, truths = data
    slice_.client.cache_dir = tmp_path / "c"
    ds = EpisodeDataset(slice_, obs=OBS, action=ACTION, fps=FPS)
    stats = ds.stats()
    want = np.array(
        [latest(t.joints_t, t.t0 + k * 100 * MS) for t in truths for k in range(grid_len(t))], float
    )
    assert stats["joints/position"]["mean"][0] == pytest.approx(want.mean())
    assert stats["joints/position"]["std"][0] == pytest.approx(want.std())
    assert stats["joints/position"]["max"][1] == pytest.approx(want.max() * 0.5)
    assert stats["joints/position"]["count"] == len(ds)
    assert "cam0/rgb" not in stats and ACTION in stats
    files = list((tmp_path / "c" / "stats").glob("*.json"))
    assert len(files) == 1
    calls = slice_.client.calls
    again = EpisodeDataset(slice_, obs=OBS, action=ACTION, fps=FPS).stats()
    assert again == stats and slice_.client.calls == calls  # from disk, no blob read
    other = EpisodeDataset(slice_, obs=OBS, action=ACTION, fps=FPS, segments=[truths[0].id]).stats()
    assert other != stats and len(list((tmp_path / "c" / "stats").glob("*.json"))) == 2
    # Without the camera the grid spans other times: the same tables, other statistics.
    tables = [name for name in OBS if name != "cam0/rgb"]
    alone = EpisodeDataset(slice_, obs=tables, action=ACTION, fps=FPS)
    assert len(alone) != len(ds) and alone.stats()["joints/position"]["count"] == len(alone)


def test_public_names() -> None:
    import rayform.torch

    assert set(rayform.torch.__all__) == {
        "DatasetSpec",
        "EpisodeDataset",
        "EpisodeSampler",
        "MixtureDataset",
        "SamplerDataset",
        "collate",
        "split_episodes",
        "unnormalize",
    }
    assert all(getattr(rayform.torch, name) for name in rayform.torch.__all__)


def test_pyav_backend_returns_the_same_frames(data) -> None:
    slice_, _ = data
    keys = list(range(0, 30, 3)) + [1, 29]
    a = EpisodeDataset(
        slice_, obs=["cam0/rgb"], action=None, fps=FPS, decoder_backend="pyav"
    ).__getitems__(keys)
    b = EpisodeDataset(
        slice_, obs=["cam0/rgb"], action=None, fps=FPS, decoder_backend="torchcodec"
    ).__getitems__(keys)
    for x, y in zip(a, b, strict=True):
        assert decode_index_frame(x["cam0/rgb"].numpy()) == decode_index_frame(
            y["cam0/rgb"].numpy()
        )
        assert x["cam0/rgb"].shape == y["cam0/rgb"].shape
