"""`rayform-server ingest lerobot`: v3.0 datasets written by LeRobot itself, and a v2.1 layout."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import av
import numpy as np
import pytest
from support.fakes import store_slice
from support.recordings import read_lerobot_code, write_lerobot_v21

from rayform.errors import InvalidArgumentError
from rayform.format import decode_table, decode_timestamps
from rayform_server.ingest import Progress, add_parser, ingest_lerobot
from rayform_server.store import Store

REPO = Path(__file__).resolve().parents[2]
QUIET = Progress(None)

# Runs in the peer venv: writes a v3.0 dataset with LeRobot's own writer, then dumps what
# LeRobotDataset returns for every frame.
PEER_SCRIPT = r"""
import sys, numpy as np, torch
torch.set_num_threads(1)
from lerobot.datasets.lerobot_dataset import LeRobotDataset
root, out = sys.argv[1], sys.argv[2]
names = [f"j{i}" for i in range(6)]
features = {
    "observation.images.top": {"dtype": "video", "shape": (96, 128, 3), "names": ["height", "width", "channels"]},
    "observation.state": {"dtype": "float32", "shape": (6,), "names": names},
    "action": {"dtype": "float32", "shape": (6,), "names": names},
}
ds = LeRobotDataset.create("rayform/ingest-test", fps=30, features=features, root=root, use_videos=True)
rng = np.random.default_rng(0)
for ep in range(3):
    for i in range(30):
        img = np.zeros((96, 128, 3), np.uint8)
        x = (12 * i + 20 * ep) % 112
        img[:, x:x + 16] = (255, 128, 0)
        y = (7 * i) % 80
        img[y:y + 16, :, 2] = 200
        ds.add_frame({"observation.images.top": img,
                      "observation.state": rng.standard_normal(6).astype(np.float32),
                      "action": rng.standard_normal(6).astype(np.float32), "task": "push"})
    ds.save_episode()
ds.finalize()
ds = LeRobotDataset("rayform/ingest-test", root=root)
items = [ds[i] for i in range(len(ds))]
np.savez(out,
    episode=np.array([int(it["episode_index"]) for it in items]),
    frame=np.array([int(it["frame_index"]) for it in items]),
    timestamp=np.array([float(it["timestamp"]) for it in items]),
    state=np.stack([it["observation.state"].numpy() for it in items]),
    action=np.stack([it["action"].numpy() for it in items]),
    image=np.stack([(it["observation.images.top"].numpy() * 255).round().astype(np.uint8) for it in items]))
"""


@pytest.fixture(scope="module")
def lerobot_v30(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    """A v3.0 dataset written by LeRobot 0.4.4 and what LeRobotDataset returns for it."""
    peer = (
        subprocess.run(
            ["bash", str(REPO / "scripts" / "peer_lerobot.sh")],
            check=True,
            capture_output=True,
            text=True,
            timeout=600,
        )
        .stdout.strip()
        .splitlines()[-1]
    )
    work = tmp_path_factory.mktemp("lerobot")
    script = work / "peer.py"
    script.write_text(PEER_SCRIPT)
    proc = subprocess.run(
        [peer, str(script), str(work / "ds"), str(work / "ref.npz")],
        capture_output=True,
        text=True,
        timeout=300,
        env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    with np.load(work / "ref.npz") as ref:
        return work / "ds", dict(ref)


@pytest.mark.slow
def test_v30_matches_lerobot_dataset(lerobot_v30, tmp_path: Path) -> None:
    from rayform.torch import EpisodeDataset

    path, ref = lerobot_v30
    store = Store(tmp_path / "root")
    m = ingest_lerobot(store, path, "slc_0000a001", progress=QUIET)
    assert len(m.segments) == 3
    assert sorted(m.segments[0].streams) == ["action", "observation/state", "task", "top/rgb"]
    assert slice_tasks(store, m) == [("push", 3)]  # LeRobot's own tasks.parquet
    # the slice holds the dataset's own timestamps, episode-relative, in ns
    for ep, seg in enumerate(m.segments):
        rows = ref["episode"] == ep
        # snapped onto frame_index / fps (the float32 column is a few ns off it)
        want_t = np.rint(ref["frame"][rows] * (1e9 / 30)).astype(np.int64)
        assert np.abs(want_t - ref["timestamp"][rows] * 1e9).max() < 1e5
        cam = seg.streams["top/rgb"]
        assert (cam.codec, cam.shape, cam.count) == ("h264", (96, 128, 3), 30)
        np.testing.assert_array_equal(
            decode_timestamps(store.blob_path(cam.timestamps.hash).read_bytes()), want_t
        )
        t, v = decode_table(store.blob_path(seg.streams["action"].blob.hash).read_bytes())
        np.testing.assert_array_equal(t, want_t)
        np.testing.assert_array_equal(v, ref["action"][rows])

    slice_ = store_slice("slc_0000a001", m, store)
    ds = EpisodeDataset(
        slice_, obs=["top/rgb", "observation/state"], action="action", fps=15, shard=None
    )
    checked = 0
    for i in range(len(ds)):
        sample = ds[i]
        ep = [s.id for s in m.segments].index(sample["meta"]["segment"])
        rows = np.flatnonzero(ref["episode"] == ep)
        t_rows = np.rint(ref["frame"][rows] * (1e9 / 30)).astype(np.int64)
        row = rows[int(np.searchsorted(t_rows, int(sample["t_ns"]), side="right")) - 1]
        np.testing.assert_array_equal(sample["observation/state"].numpy(), ref["state"][row])
        np.testing.assert_array_equal(sample["action"][0].numpy(), ref["action"][row])
        img = sample["top/rgb"].numpy().astype(np.int16)
        diff = np.abs(img - ref["image"][row].astype(np.int16)).mean()
        assert diff < 10, (ep, row, diff)
        other = rows[(list(rows).index(row) + 1) % len(rows)]
        assert (
            np.abs(img - ref["image"][other].astype(np.int16)).mean() > diff + 10
        )  # frames differ
        checked += 1
    assert checked == len(ds) >= 40

    # idempotent: the same dataset gives the same manifest in another data root
    assert (
        ingest_lerobot(Store(tmp_path / "again"), path, "slc_0000a001", progress=QUIET).hash
        == m.hash
    )


def slice_tasks(store: Store, m: object) -> list[tuple[str, int]]:
    return store_slice("slc_0000a001", m, store).tasks()  # type: ignore[arg-type]


def test_v21_layout_via_cli(tmp_path: Path) -> None:
    truth = write_lerobot_v21(tmp_path / "v21")
    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers())
    args = parser.parse_args(
        [
            "ingest",
            "lerobot",
            "--root",
            str(tmp_path / "root"),
            "--slice",
            "slc_0000a002",
            "--quiet",
            "--stream",
            "cam/rgb=observation.images.front",
            "--stream",
            "q=observation.state",
            str(tmp_path / "v21"),
        ]
    )
    assert args.func(args) == 0
    store = Store(tmp_path / "root")
    m = store.load_manifest(store.get_slice("slc_0000a002")["manifest"])
    assert len(m.segments) == 2
    for e, seg in enumerate(m.segments):
        assert sorted(seg.streams) == ["cam/rgb", "q"]
        t, v = decode_table(store.blob_path(seg.streams["q"].blob.hash).read_bytes())
        np.testing.assert_array_equal(t, truth["t"][e])
        np.testing.assert_array_equal(v, truth["state"][e])
        cam = seg.streams["cam/rgb"]
        np.testing.assert_array_equal(
            decode_timestamps(store.blob_path(cam.timestamps.hash).read_bytes()), truth["t"][e]
        )
        with av.open(str(store.blob_path(cam.blob.hash))) as c:
            codes = [read_lerobot_code(f.to_ndarray(format="rgb24")) for f in c.decode(video=0)]
        assert codes == [10 * e + i for i in range(20)]


def test_bad_input_is_refused_and_leaves_no_slice(tmp_path: Path, capsys) -> None:
    store = Store(tmp_path / "root")
    (tmp_path / "empty").mkdir()
    with pytest.raises(InvalidArgumentError, match="not a LeRobot dataset"):
        ingest_lerobot(store, tmp_path / "empty", "slc_0000a003", progress=QUIET)
    write_lerobot_v21(tmp_path / "v21")
    with pytest.raises(
        InvalidArgumentError, match="no video, vector or text feature 'observation.nope'"
    ):
        ingest_lerobot(
            store,
            tmp_path / "v21",
            "slc_0000a003",
            streams={"x": "observation.nope"},
            progress=QUIET,
        )
    (
        tmp_path
        / "v21"
        / "videos"
        / "chunk-000"
        / "observation.images.front"
        / "episode_000001.mp4"
    ).unlink()
    with pytest.raises(InvalidArgumentError, match="is missing"):
        ingest_lerobot(store, tmp_path / "v21", "slc_0000a003", progress=QUIET)
    assert (
        store.get_slice("slc_0000a003") is None
    )  # episode 0 was stored, but no slice points at it
    info = json.loads((tmp_path / "v21" / "meta" / "info.json").read_text())
    info["codebase_version"] = "v1.6"
    (tmp_path / "v21" / "meta" / "info.json").write_text(json.dumps(info))
    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers())
    args = parser.parse_args(
        [
            "ingest",
            "lerobot",
            "--root",
            str(tmp_path / "root"),
            "--slice",
            "slc_0000a003",
            str(tmp_path / "v21"),
        ]
    )
    assert args.func(args) == 2
    assert "v1.6" in capsys.readouterr().err


def test_default_names() -> None:
    from rayform_server.ingest.lerobot import default_stream_name

    assert default_stream_name("observation.images.top", True) == "top/rgb"
    assert default_stream_name("observation.image", True) == "image/rgb"
    assert default_stream_name("observation.state", False) == "observation/state"
    assert default_stream_name("action", False) == "action"
    assert default_stream_name("observation.Effort EE", False) == "observation/effort_ee"
    assert sys.modules["rayform_server.ingest.lerobot"].ingest_lerobot is ingest_lerobot


def test_float32_timestamps_snap_to_the_grid(tmp_path: Path, capsys) -> None:
    """Row k comes back at grid step k of a dataset at the dataset's own fps."""
    from rayform.torch import EpisodeDataset
    from rayform.torch._index import grid_offsets_ns

    fps, n = 30, 40
    truth = write_lerobot_v21(tmp_path / "v21", episodes=1, n=n, fps=fps)
    raw = np.rint((np.arange(n) / fps).astype(np.float32).astype(np.float64) * 1e9).astype(np.int64)
    assert (
        raw > grid_offsets_ns(np.arange(n), fps)
    ).any()  # unsnapped, some rows lie past their step
    store = Store(tmp_path / "root")
    m = ingest_lerobot(store, tmp_path / "v21", "slc_0000a004", progress=Progress(sys.stderr))
    assert "keeping the recorded times" not in capsys.readouterr().err
    seg = m.segments[0]
    t, _ = decode_table(store.blob_path(seg.streams["observation/state"].blob.hash).read_bytes())
    np.testing.assert_array_equal(t, grid_offsets_ns(np.arange(n), fps))
    slice_ = store_slice("slc_0000a004", m, store)
    ds = EpisodeDataset(
        slice_, obs=["front/rgb"], action="observation/state", fps=fps, horizon=2, shard=None
    )
    assert len(ds) == n
    for k in range(n):
        sample = ds[k]
        assert int(sample["t_ns"]) == t[k]
        np.testing.assert_array_equal(sample["action"][0].numpy(), truth["state"][0][k])
        assert read_lerobot_code(sample["front/rgb"].permute(1, 2, 0).numpy()) == k


def test_jittered_timestamps_are_kept(tmp_path: Path, capsys) -> None:
    truth = write_lerobot_v21(tmp_path / "v21", episodes=1, n=20, fps=10, jitter_s=0.01)
    store = Store(tmp_path / "root")
    m = ingest_lerobot(store, tmp_path / "v21", "slc_0000a005", progress=Progress(sys.stderr))
    assert "keeping the recorded times" in capsys.readouterr().err
    t, _ = decode_table(
        store.blob_path(m.segments[0].streams["observation/state"].blob.hash).read_bytes()
    )
    np.testing.assert_array_equal(t, truth["t"][0])
    assert not np.array_equal(t, np.rint(np.arange(20) * 1e8).astype(np.int64))


def test_ray_before_the_path_means_a_local_ray_not_an_address(tmp_path: Path) -> None:
    """``--ray`` takes an optional ADDRESS: a path that exists after it is the dataset's, and an
    address is still an address (the command failed for want of a path before)."""
    from rayform_server.cli import build_parser

    data = tmp_path / "my_lerobot_dataset"
    data.mkdir()
    base = ["ingest", "lerobot", "--root", str(tmp_path / "root"), "--slice", "slc_0000bbbb"]
    parser = build_parser()
    for argv in ([*base, "--ray", str(data)], [*base, str(data), "--ray"]):
        args = parser.parse_args(argv)
        assert (args.ray, args.path) == ("", str(data)), argv
    args = parser.parse_args([*base, "--ray", "ray://head:10001", str(data)])
    assert (args.ray, args.path) == ("ray://head:10001", str(data))
    mcap = ["ingest", "mcap", "--root", str(tmp_path / "root"), "--slice", "slc_0000aaaa"]
    args = parser.parse_args([*mcap, "--ray", str(data), str(data)])
    assert (args.ray, args.files) == ("", [str(data), str(data)])
