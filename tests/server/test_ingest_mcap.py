"""`rayform-server ingest mcap`: ROS 2 bags written here with the mcap ROS 2 writer."""

from __future__ import annotations

import argparse
from pathlib import Path

import av
import numpy as np
import pytest
from mcap_ros2.writer import Writer
from support.fakes import store_slice
from support.recordings import T0, H, W, header, msgdef, read_code, write_bag

from rayform.errors import InvalidArgumentError
from rayform.format import decode_table, decode_timestamps
from rayform_server.ingest import Progress, add_parser, ingest_mcap
from rayform_server.store import Store


def decode_all(path: Path) -> list[np.ndarray]:
    with av.open(str(path)) as c:
        return [f.to_ndarray(format="rgb24") for f in c.decode(video=0)]


QUIET = Progress(None)


@pytest.fixture(scope="module")
def bag(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    path = tmp_path_factory.mktemp("bags") / "run1.mcap"
    return path, write_bag(path)


def test_default_streams_keep_every_stamp_and_value(bag, tmp_path: Path) -> None:
    path, truth = bag
    store = Store(tmp_path / "root")
    m = ingest_mcap(store, [path], "slc_0000000a", progress=QUIET)
    (seg,) = m.segments
    assert sorted(seg.streams) == [
        "cam0/rgb",
        "cam1/rgb",
        "ee_pose",
        "joint_states/position",
        "joint_states/velocity",
    ]
    for name, key in (("cam0/rgb", "cam0"), ("cam1/rgb", "cam1")):
        s = seg.streams[name]
        assert s.kind == "video" and s.shape == (H, W, 3) and s.count == truth[key].size
        stamps = decode_timestamps(store.blob_path(s.timestamps.hash).read_bytes())
        np.testing.assert_array_equal(stamps, truth[key])
        frames = decode_all(store.blob_path(s.blob.hash))
        assert [read_code(f) for f in frames] == list(range(truth[key].size))
    for name, key in (
        ("joint_states/position", "joint_pos"),
        ("joint_states/velocity", "joint_vel"),
    ):
        t, v = decode_table(store.blob_path(seg.streams[name].blob.hash).read_bytes())
        np.testing.assert_array_equal(t, truth["joints"])
        np.testing.assert_array_equal(v, truth[key])
    pose = seg.streams["ee_pose"]
    assert (pose.frame, pose.quantity, pose.units, pose.shape) == ("ros", "pose", "m", (7,))
    t, v = decode_table(store.blob_path(pose.blob.hash).read_bytes())
    np.testing.assert_array_equal(t, truth["pose"])
    np.testing.assert_array_equal(v, truth["pose_val"])
    assert seg.start_ns == min(int(truth[k][0]) for k in ("cam0", "cam1", "joints", "pose"))


def test_dataset_returns_latest_frame_at_or_before_grid_time(bag, tmp_path: Path) -> None:
    from rayform.torch import EpisodeDataset

    path, truth = bag
    store = Store(tmp_path / "root")
    m = ingest_mcap(store, [path], "slc_0000000b", progress=QUIET)
    slice_ = store_slice("slc_0000000b", m, store)
    ds = EpisodeDataset(
        slice_,
        obs=["cam0/rgb", "cam1/rgb", "joint_states/position"],
        action="joint_states/velocity",
        fps=7,
        shard=None,
    )
    checked = 0
    for i in range(0, len(ds), 3):
        sample = ds[i]
        t = int(sample["t_ns"])
        for name, key in (("cam0/rgb", "cam0"), ("cam1/rgb", "cam1")):
            k = int(np.searchsorted(truth[key], t, side="right")) - 1
            if k < 0:
                continue
            img = sample[name].numpy().transpose(1, 2, 0)
            assert read_code(img) == k, (name, t)
            checked += 1
        j = int(np.searchsorted(truth["joints"], t, side="right")) - 1
        if j >= 0:
            np.testing.assert_allclose(
                sample["joint_states/position"].numpy(), truth["joint_pos"][j].astype(np.float32)
            )
    assert checked >= 10


def test_idempotent_and_stream_selection_via_cli(bag, tmp_path: Path) -> None:
    path, _ = bag
    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers())
    hashes = []
    for root in ("a", "b"):
        args = parser.parse_args(
            [
                "ingest",
                "mcap",
                "--root",
                str(tmp_path / root),
                "--slice",
                "slc_0000000c",
                "--quiet",
                "--stream",
                "top/rgb=/cam1/image_raw/compressed",
                "--stream",
                "arm/q=/joint_states:position",
                "--site",
                "lab-a",
                str(path),
            ]
        )
        assert args.func(args) == 0
        ref = Store(tmp_path / root).get_slice("slc_0000000c")
        hashes.append(ref["manifest"])
    assert hashes[0] == hashes[1]
    m = Store(tmp_path / "a").load_manifest(hashes[0])
    assert sorted(m.segments[0].streams) == ["arm/q", "top/rgb"] and m.segments[0].site == "lab-a"


@pytest.mark.parametrize(
    ("streams", "message"),
    [
        ({"x/rgb": "/nope"}, "has no topic '/nope'"),
        ({"q": "/joint_states"}, "needs a field"),
        ({"q": "/joint_states:torque"}, "needs a field"),
        ({"p": "/ee_pose:x"}, "has no selectable fields"),
    ],
)
def test_bad_stream_specs_are_refused(bag, tmp_path: Path, streams, message) -> None:
    path, _ = bag
    store = Store(tmp_path / "root")
    with pytest.raises(InvalidArgumentError, match=message):
        ingest_mcap(store, [path], "slc_0000000d", streams=streams, progress=QUIET)
    assert store.get_slice("slc_0000000d") is None


def test_bad_files_are_refused_and_leave_no_slice(bag, tmp_path: Path, capsys) -> None:
    good, _ = bag
    store = Store(tmp_path / "root")
    garbage = tmp_path / "garbage.mcap"
    garbage.write_bytes(b"not an mcap file at all" * 10)
    with pytest.raises(InvalidArgumentError, match="not a readable MCAP"):
        ingest_mcap(store, [good, garbage], "slc_0000000e", progress=QUIET)
    empty = tmp_path / "empty.mcap"
    with empty.open("wb") as f, Writer(f):
        pass
    with pytest.raises(InvalidArgumentError, match="no topic of a supported type"):
        ingest_mcap(store, [empty], "slc_0000000e", progress=QUIET)
    mixed = tmp_path / "mixed.mcap"
    write_bag(mixed, seed=1, odd_size_at=5)
    with pytest.raises(InvalidArgumentError, match="one image size"):
        ingest_mcap(store, [mixed], "slc_0000000e", progress=QUIET)
    with pytest.raises(InvalidArgumentError, match="does not exist"):
        ingest_mcap(store, [tmp_path / "missing.mcap"], "slc_0000000e", progress=QUIET)
    assert store.get_slice("slc_0000000e") is None
    assert not any(p.is_file() for p in (store.root / "manifests").rglob("*"))


def test_duplicate_stamps_are_dropped_with_a_message(tmp_path: Path) -> None:
    path = tmp_path / "dup.mcap"
    stamps = [T0, T0 + 10**8, T0 + 10**8, T0 + 2 * 10**8]
    with path.open("wb") as f, Writer(f) as w:
        schema = w.register_msgdef(
            "sensor_msgs/msg/JointState", msgdef("sensor_msgs/msg/JointState")
        )
        for i, t in enumerate(stamps):
            w.write_message(
                "/joint_states",
                schema,
                {
                    "header": header(t),
                    "name": ["a"],
                    "position": [float(i)],
                    "velocity": [],
                    "effort": [],
                },
                log_time=t + i,
            )
    lines: list[str] = []

    class Collect:
        def write(self, s: str) -> None:
            lines.append(s)

        def flush(self) -> None:
            pass

    store = Store(tmp_path / "root")
    m = ingest_mcap(store, [path], "slc_0000000f", progress=Progress(Collect()))
    s = m.segments[0].streams["joint_states/position"]
    assert sorted(m.segments[0].streams) == [
        "joint_states/position"
    ]  # empty velocity/effort skipped
    t, v = decode_table(store.blob_path(s.blob.hash).read_bytes())
    assert t.tolist() == [T0, T0 + 10**8, T0 + 2 * 10**8] and v[:, 0].tolist() == [0.0, 1.0, 3.0]
    assert any("dropped 1 message" in line for line in lines)
