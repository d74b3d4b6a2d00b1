"""`rayform export SLICE DIR --format lerobot` on the demo slice: what is written, resuming,
parallel files, views and training resolution (LeRobot itself reads the files in
test_lerobot_roundtrip.py)."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import av
import numpy as np
import pyarrow.parquet as pq
import pytest
from support import DEMO_SLICE, SCRIPTS

import rayform
from rayform.cli import main
from rayform.errors import InvalidArgumentError
from rayform.lerobot_layout import BOOKKEEPING_FEATURES
from rayform.torch import EpisodeDataset
from rayform.torch.lerobot import _format as fmt
from rayform.torch.lerobot import default_feature_name, export_lerobot
from rayform.torch.lerobot._copy import PacketCopier
from rayform.torch.lerobot._plan import state_and_action

MAPPING = {
    "cam0/rgb": "observation.images.cam0",
    "joints/position": "observation.state",
    "joints/position_delta": "action",
}
ARGS = [f"--stream={s}={f}" for s, f in MAPPING.items()]


@pytest.fixture
def demo(client_env):
    """The demo slice, through a client closed after the test."""
    with rayform.Client() as client:
        yield client.slices.get(DEMO_SLICE)


def _frames(path: Path) -> np.ndarray:
    with av.open(str(path)) as c:
        return np.stack([f.to_ndarray(format="rgb24") for f in c.decode(video=0)])


def _psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return 99.0 if mse == 0 else 10 * math.log10(255.0**2 / mse)


def _data(root: Path) -> dict[str, np.ndarray]:
    tables = [pq.read_table(p) for p in sorted((root / "data").rglob("*.parquet"))]
    return {
        name: np.concatenate([np.asarray(t.column(name).to_pylist()) for t in tables])
        for name in tables[0].column_names
    }


def test_cli_export_matches_the_dataset(demo, tmp_path: Path, capsys) -> None:
    out = tmp_path / "ds"
    argv = ["export", DEMO_SLICE, str(out), "--format", "lerobot", "--fps", "15", *ARGS]
    argv += ["--episodes-per-file", "1"]
    assert main([*argv, "--jobs", "2", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["files_written"], report["files_reused"], report["version"]) == (4, 0, "3.0")

    slice_ = demo
    ds = EpisodeDataset(
        slice_,
        obs={"observation.images.cam0": "cam0/rgb", "observation.state": "joints/position"},
        action={"action": "joints/position_delta"},
        fps=15,
        shard=None,
    )
    info = json.loads((out / "meta" / "info.json").read_text())
    assert info["codebase_version"] == "v3.0" and info["fps"] == 15
    assert info["total_frames"] == report["frames"] == len(ds)
    assert info["total_episodes"] == 4
    assert info["features"]["observation.images.cam0"]["shape"] == [96, 128, 3]
    assert info["features"]["observation.state"]["shape"] == [14]
    assert info["rayform"]["slice"] == DEMO_SLICE
    assert info["rayform"]["manifest"] == slice_.manifest_hash
    assert not (out / ".rayform-export").exists()

    data = _data(out)
    assert list(data["index"]) == list(range(len(ds)))
    episodes = pq.read_table(out / "meta/episodes/chunk-000/file-000.parquet").to_pylist()
    assert [e["rayform/segment"] for e in episodes] == list(ds.segment_lengths)
    assert [e["length"] for e in episodes] == list(ds.segment_lengths.values())
    for e, ep in enumerate(episodes):
        rows = slice(ep["dataset_from_index"], ep["dataset_to_index"])
        np.testing.assert_array_equal(data["episode_index"][rows], e)
        np.testing.assert_array_equal(data["frame_index"][rows], np.arange(ep["length"]))
        want_t = (np.arange(ep["length"]) / 15).astype(np.float32)
        np.testing.assert_array_equal(data["timestamp"][rows].astype(np.float32), want_t)
        frames = _frames(out / f"videos/observation.images.cam0/chunk-000/file-{e:03d}.mp4")
        assert len(frames) == ep["length"]
        assert ep["videos/observation.images.cam0/from_timestamp"] == 0.0
        for k in (0, ep["length"] // 2, ep["length"] - 1):
            sample = ds[ep["dataset_from_index"] + k]
            np.testing.assert_array_equal(
                data["observation.state"][ep["dataset_from_index"] + k],
                sample["observation.state"].numpy(),
            )
            np.testing.assert_array_equal(
                data["action"][ep["dataset_from_index"] + k], sample["action"][0].numpy()
            )
            cam = sample["observation.images.cam0"].permute(1, 2, 0).numpy()
            assert _psnr(frames[k], cam) > 35

    stats = json.loads((out / "meta" / "stats.json").read_text())
    np.testing.assert_allclose(
        stats["observation.state"]["mean"], data["observation.state"].mean(axis=0), atol=1e-5
    )
    assert np.array(stats["observation.images.cam0"]["mean"]).shape == (3, 1, 1)

    # the same command again: complete, nothing to do
    assert main([*argv, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["files_reused"] == 4
    # other arguments: refused, the dataset kept
    assert main([*argv[:-2], "--quiet"]) == 1
    assert "complete export of other arguments" in capsys.readouterr().err


def test_view_and_training_resolution(demo, tmp_path: Path, capsys) -> None:
    slice_ = demo
    ids = slice_.segments.ids().to_pylist()
    view = slice_.select(segments=[ids[3], ids[1]])
    report = export_lerobot(
        view,
        tmp_path / "ds",
        streams=MAPPING,
        fps=10,
        image_size=(48, 48),
        resize="crop",
        progress=True,
    )
    assert report.episodes == 2
    assert f"export {DEMO_SLICE}: 100%" in capsys.readouterr().err  # the progress bar
    info = json.loads((tmp_path / "ds" / "meta" / "info.json").read_text())
    assert info["features"]["observation.images.cam0"]["shape"] == [48, 48, 3]
    assert info["rayform"]["selection"] == view.selection
    eps = pq.read_table(tmp_path / "ds/meta/episodes/chunk-000/file-000.parquet").to_pylist()
    assert [e["rayform/segment"] for e in eps] == [ids[1], ids[3]]  # manifest order
    ds = EpisodeDataset(
        view,
        obs={"c": "cam0/rgb"},
        action=None,
        fps=10,
        shard=None,
        image_size=(48, 48),
        resize="crop",
    )
    frames = _frames(tmp_path / "ds/videos/observation.images.cam0/chunk-000/file-000.mp4")
    assert len(frames) == len(ds) == report.frames
    assert min(_psnr(frames[i], ds[i]["c"].permute(1, 2, 0).numpy()) for i in (0, 7)) > 35


@pytest.mark.parametrize("reencode", [False, True], ids=["copied", "reencoded"])
def test_failed_export_resumes_and_equals_a_clean_one(
    demo, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, reencode: bool
) -> None:
    slice_ = demo
    kw = {"streams": MAPPING, "fps": 15, "episodes_per_file": 1, "reencode": reencode}
    export_lerobot(slice_, tmp_path / "clean", **kw)

    cls, method = (fmt.VideoWriter, "write") if reencode else (PacketCopier, "copy")
    real = getattr(cls, method)
    calls = {"n": 0}

    def failing(self, arg):
        calls["n"] += 1
        if calls["n"] == 3:  # the third episode's video
            raise OSError("disk full")
        return real(self, arg)

    monkeypatch.setattr(cls, method, failing)
    with pytest.raises(OSError, match="disk full"):
        export_lerobot(slice_, tmp_path / "out", **kw)
    assert not (tmp_path / "out/meta/info.json").exists()
    assert not list((tmp_path / "out").rglob(".*.tmp"))  # the aborted video was removed
    monkeypatch.setattr(cls, method, real)

    with pytest.raises(InvalidArgumentError, match="interrupted export of other arguments"):
        export_lerobot(slice_, tmp_path / "out", **{**kw, "fps": 10})
    report = export_lerobot(slice_, tmp_path / "out", **kw)
    assert (report.files_reused, report.files_written) == (2, 2)
    _assert_same_export(tmp_path / "clean", tmp_path / "out")


def _assert_same_export(a: Path, b: Path) -> None:
    files_a = sorted(p.relative_to(a) for p in a.rglob("*") if p.is_file())
    assert files_a == sorted(p.relative_to(b) for p in b.rglob("*") if p.is_file())
    for rel in files_a:
        if rel.suffix == ".parquet":
            assert pq.read_table(a / rel).equals(pq.read_table(b / rel)), rel
        elif rel.suffix == ".mp4":
            np.testing.assert_array_equal(_frames(a / rel), _frames(b / rel))
        elif rel.name != "info.json":
            assert (a / rel).read_bytes() == (b / rel).read_bytes(), rel


def test_killed_export_continues(client_env, tmp_path: Path) -> None:
    argv = [DEMO_SLICE, "--format", "lerobot", "--fps", "15", "--episodes-per-file", "1", *ARGS]
    cmd = [sys.executable, str(SCRIPTS / "rayform_cli.py"), "export"]
    assert subprocess.run([*cmd, argv[0], str(tmp_path / "clean"), *argv[1:], "-q"]).returncode == 0
    proc = subprocess.Popen([*cmd, argv[0], str(tmp_path / "out"), *argv[1:], "-q"])
    marker = tmp_path / "out" / ".rayform-export" / "unit-000000.json"
    deadline = time.monotonic() + 120
    while proc.poll() is None and not marker.exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGKILL)
    killed = proc.wait() == -signal.SIGKILL
    again = subprocess.run(
        [*cmd, argv[0], str(tmp_path / "out"), *argv[1:], "--json"], capture_output=True, text=True
    )
    assert again.returncode == 0, again.stderr
    report = json.loads(again.stdout)
    assert report["files_written"] + report["files_reused"] == 4
    if killed:  # after its first file group: that one is kept
        assert not (tmp_path / "out" / ".rayform-export").exists()
        assert report["files_reused"] >= 1
    _assert_same_export(tmp_path / "clean", tmp_path / "out")


def test_bad_arguments(demo, tmp_path: Path, capsys) -> None:
    slice_ = demo
    # No camera to take the rate from, and tables at 200 and 50 Hz: the rate must be chosen.
    tables = {"joints/position": "observation.state", "joints/position_delta": "action"}
    with pytest.raises(InvalidArgumentError, match=r"streams have different rates \(50, 200 Hz\)"):
        export_lerobot(slice_, tmp_path / "a", streams=tables)
    with pytest.raises(InvalidArgumentError, match="no stream 'nope'"):
        export_lerobot(slice_, tmp_path / "a", streams={"nope": "action"}, fps=10)
    with pytest.raises(InvalidArgumentError, match="reserves"):
        export_lerobot(slice_, tmp_path / "a", streams={"joints/position": "timestamp"}, fps=10)
    with pytest.raises(InvalidArgumentError, match="version"):
        export_lerobot(slice_, tmp_path / "a", streams=MAPPING, fps=10, version="1.6")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("mine")
    assert (
        main(
            [
                "export",
                DEMO_SLICE,
                str(tmp_path / "full"),
                "--format",
                "lerobot",
                "--fps",
                "10",
                *ARGS,
            ]
        )
        == 1
    )
    assert "is not empty" in capsys.readouterr().err
    assert (tmp_path / "full" / "x").read_text() == "mine"
    with pytest.raises(SystemExit):
        main(["export", DEMO_SLICE, str(tmp_path / "b"), "--format", "lerobot", "--stream", "x"])


def test_default_feature_names() -> None:
    assert default_feature_name("top/rgb", "video") == "observation.images.top"
    assert default_feature_name("cam0/rgb", "video") == "observation.images.cam0"
    assert default_feature_name("wrist/depth", "video") == "observation.images.wrist.depth"
    assert default_feature_name("observation/state", "table") == "observation.state"
    assert default_feature_name("action", "table") == "action"


def test_training_resolution_reads_the_renditions(tmp_path: Path) -> None:
    """--image-size exports from the smallest stored rendition that covers the size: the
    originals are never read."""
    from support.fakes import store_slice

    from rayform_server.demo import build_demo
    from rayform_server.store import Store

    m = build_demo(tmp_path / "root", small=True, episodes=2, renditions=(48,))
    store = Store(tmp_path / "root")
    slice_ = store_slice(DEMO_SLICE, m, store)
    report = export_lerobot(
        slice_, tmp_path / "ds", streams=MAPPING, fps=15, image_size=(48, 64), resize="squash"
    )
    assert report.episodes == 2
    originals = {seg.streams["cam0/rgb"].blob.hash for seg in slice_.segments}
    renditions = {seg.streams["cam0/rgb"].renditions[0].blob.hash for seg in slice_.segments}
    asked = slice_.client.asked
    assert renditions <= asked and not originals & asked
    info = json.loads((tmp_path / "ds" / "meta" / "info.json").read_text())
    assert info["features"]["observation.images.cam0"]["shape"] == [48, 64, 3]


def test_default_export_takes_the_cameras_rate_and_names_state_and_action(
    client_env, tmp_path: Path
) -> None:
    """`rayform export SLICE DIR --format lerobot` and nothing else, in a real subprocess: the
    demo's streams run at 30 (cameras), 200, 100 and 50 Hz; the dataset is at the cameras' 30
    fps, and joints/position with joints/position_delta become LeRobot's state and action."""
    out = tmp_path / "ds"
    done = subprocess.run(
        [str(Path(sys.executable).parent / "rayform"), "export", DEMO_SLICE, str(out)]
        + ["--format", "lerobot", "--quiet"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    loud = subprocess.run(
        [str(Path(sys.executable).parent / "rayform"), "export", DEMO_SLICE, str(out)]
        + ["--format", "lerobot"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert loud.returncode == 0, loud.stderr
    assert "frames at 30 fps (the cameras' rate; --fps to choose) as LeRobot v3.0" in loud.stdout
    info = json.loads((out / "meta" / "info.json").read_text())
    assert info["fps"] == 30
    features = set(info["features"]) - set(BOOKKEEPING_FEATURES)
    assert features == {
        "observation.images.cam0",
        "observation.images.wrist",
        "observation.state",
        "action",
        "ee.pose",
    }
    assert info["features"]["observation.state"]["shape"] == [14]
    assert info["features"]["action"]["shape"] == [14]

    with rayform.Client() as client:
        ds = EpisodeDataset(
            client.slices.get(DEMO_SLICE),
            obs={  # every exported stream: the grid starts where all have a record
                "observation.images.cam0": "cam0/rgb",
                "observation.images.wrist": "wrist/rgb",
                "observation.state": "joints/position",
                "ee.pose": "ee/pose",
            },
            action={"action": "joints/position_delta"},
            fps=30,
            shard=None,
        )
        data = _data(out)
        assert len(data["index"]) == len(ds)
        for i in (0, len(ds) // 2, len(ds) - 1):
            np.testing.assert_array_equal(data["observation.state"][i], ds[i]["observation.state"])
            np.testing.assert_array_equal(data["action"][i], ds[i]["action"][0])


def test_state_and_action_only_where_the_streams_say_so() -> None:
    pair = {"joints/position": "table", "joints/position_delta": "table", "cam0/rgb": "video"}
    assert state_and_action(pair) == {
        "joints/position": "observation.state",
        "joints/position_delta": "action",
    }
    # LeRobot's own names already there, two candidate pairs, a camera: no guess.
    assert state_and_action({**pair, "observation/state": "table"}) == {}
    assert state_and_action({**pair, "action": "table"}) == {}
    assert state_and_action({**pair, "arm/q": "table", "arm/q_delta": "table"}) == {}
    assert state_and_action({"a/rgb": "video", "a/rgb_delta": "video"}) == {}
    assert state_and_action({"arm/joint_pos": "table", "arm/joint_cmd_delta": "table"}) == {}
