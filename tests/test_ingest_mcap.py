"""`rayform-server ingest mcap`: ROS 2 bags written here with the mcap ROS 2 writer."""

from __future__ import annotations

import argparse
from fractions import Fraction
from pathlib import Path

import av
import numpy as np
import pytest
from fakes import store_slice
from mcap_ros2.writer import Writer

from rayform.errors import InvalidArgumentError
from rayform.format import decode_table, decode_timestamps
from rayform_server.ingest import add_parser, ingest_mcap
from rayform_server.ingest._common import Progress
from rayform_server.store import Store

SEP = "=" * 80
HEADER = "builtin_interfaces/Time stamp\nstring frame_id"
TIME = "int32 sec\nuint32 nanosec"
DEFS = {
    "sensor_msgs/msg/Image": (
        "std_msgs/Header header\nuint32 height\nuint32 width\nstring encoding\nuint8 is_bigendian\n"
        "uint32 step\nuint8[] data"
    ),
    "sensor_msgs/msg/CompressedImage": "std_msgs/Header header\nstring format\nuint8[] data",
    "sensor_msgs/msg/JointState": (
        "std_msgs/Header header\nstring[] name\nfloat64[] position\nfloat64[] velocity\nfloat64[] effort"
    ),
    "geometry_msgs/msg/PoseStamped": "std_msgs/Header header\ngeometry_msgs/Pose pose",
}
DEPS = {
    "std_msgs/Header": HEADER,
    "builtin_interfaces/Time": TIME,
    "geometry_msgs/Pose": "geometry_msgs/Point position\ngeometry_msgs/Quaternion orientation",
    "geometry_msgs/Point": "float64 x\nfloat64 y\nfloat64 z",
    "geometry_msgs/Quaternion": "float64 x\nfloat64 y\nfloat64 z\nfloat64 w",
}
H, W = 48, 64
T0 = 1_700_000_000_000_000_000  # ns, an absolute ROS time


def msgdef(name: str) -> str:
    deps = ["std_msgs/Header", "builtin_interfaces/Time"]
    if "Pose" in name:
        deps += ["geometry_msgs/Pose", "geometry_msgs/Point", "geometry_msgs/Quaternion"]
    return DEFS[name] + "".join(f"\n{SEP}\nMSG: {d}\n{DEPS[d]}" for d in deps)


def code_image(k: int, height: int = H, width: int = W) -> np.ndarray:
    """An RGB image whose 8 vertical blocks are white where bit i of ``k`` is set."""
    img = np.zeros((height, width, 3), np.uint8)
    bw = width // 8
    for bit in range(8):
        if (k >> bit) & 1:
            img[:, bit * bw:(bit + 1) * bw] = 255
    return img


def read_code(img: np.ndarray) -> int:
    bw = img.shape[1] // 8
    return sum(1 << b for b in range(8) if img[:, b * bw + 2:(b + 1) * bw - 2].mean() > 128)


def jpeg(img: np.ndarray) -> bytes:
    ctx = av.CodecContext.create("mjpeg", "w")
    ctx.width, ctx.height, ctx.pix_fmt, ctx.time_base = img.shape[1], img.shape[0], "yuvj420p", Fraction(1, 30)
    frame = av.VideoFrame.from_ndarray(img, format="rgb24").reformat(format="yuvj420p")
    return b"".join(bytes(p) for p in [*ctx.encode(frame), *ctx.encode(None)])


def header(t: int) -> dict:
    return {"stamp": {"sec": t // 10**9, "nanosec": t % 10**9}, "frame_id": "base"}


def jittered(rate_hz: float, n: int, rng: np.random.Generator, drop: float = 0.0) -> np.ndarray:
    """Stamps (ns) at ``rate_hz`` with +-20% jitter; a fraction ``drop`` of them dropped."""
    period = 1e9 / rate_hz
    t = T0 + (np.arange(n) * period + rng.uniform(-0.2, 0.2, n) * period).astype(np.int64)
    keep = rng.random(n) >= drop
    keep[0] = True
    return t[keep]


def write_bag(path: Path, seed: int = 0, *, odd_size_at: int | None = None) -> dict:
    """A bag: two cameras (raw rgb8 at 10 Hz, JPEG at 15 Hz) with jitter and drops, joints at 50 Hz, a pose at 20 Hz."""
    rng = np.random.default_rng(seed)
    truth = {
        "cam0": jittered(10, 40, rng, drop=0.15),
        "cam1": jittered(15, 60, rng, drop=0.15),
        "joints": jittered(50, 200, rng),
        "pose": jittered(20, 80, rng),
    }
    truth["joint_pos"] = rng.standard_normal((truth["joints"].size, 6))
    truth["joint_vel"] = rng.standard_normal((truth["joints"].size, 6))
    truth["pose_val"] = rng.standard_normal((truth["pose"].size, 7))
    events = []  # (log time, topic, index); the log time jitters so file order != stamp order
    for key in ("cam0", "cam1", "joints", "pose"):
        for i, t in enumerate(truth[key]):
            events.append((int(t) + int(rng.integers(0, 30_000_000)), key, i))
    events.sort()
    with path.open("wb") as f, Writer(f) as w:
        schemas = {n: w.register_msgdef(n, msgdef(n)) for n in DEFS}
        for log_t, key, i in events:
            t = int(truth[key][i])
            if key == "cam0":
                # frame code = index in the *written* (stamp-sorted) sequence
                img = code_image(i) if i != odd_size_at else code_image(i, H + 2, W)
                msg = {"header": header(t), "height": img.shape[0], "width": W, "encoding": "bgr8",
                       "is_bigendian": 0, "step": W * 3, "data": img[:, :, ::-1].tobytes()}
                w.write_message("/cam0/image_raw", schemas["sensor_msgs/msg/Image"], msg, log_time=log_t)
            elif key == "cam1":
                msg = {"header": header(t), "format": "jpeg", "data": jpeg(code_image(i))}
                w.write_message("/cam1/image_raw/compressed", schemas["sensor_msgs/msg/CompressedImage"], msg, log_time=log_t)
            elif key == "joints":
                msg = {"header": header(t), "name": [f"j{k}" for k in range(6)],
                       "position": truth["joint_pos"][i].tolist(), "velocity": truth["joint_vel"][i].tolist(), "effort": []}
                w.write_message("/joint_states", schemas["sensor_msgs/msg/JointState"], msg, log_time=log_t)
            else:
                v = truth["pose_val"][i]
                msg = {"header": header(t), "pose": {"position": dict(zip("xyz", v[:3], strict=True)),
                                                     "orientation": dict(zip("xyzw", v[3:], strict=True))}}
                w.write_message("/ee_pose", schemas["geometry_msgs/msg/PoseStamped"], msg, log_time=log_t)
    return truth


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
    assert sorted(seg.streams) == ["cam0/rgb", "cam1/rgb", "ee_pose", "joint_states/position", "joint_states/velocity"]
    for name, key in (("cam0/rgb", "cam0"), ("cam1/rgb", "cam1")):
        s = seg.streams[name]
        assert s.kind == "video" and s.shape == (H, W, 3) and s.count == truth[key].size
        stamps = decode_timestamps(store.blob_path(s.timestamps.hash).read_bytes())
        np.testing.assert_array_equal(stamps, truth[key])
        frames = decode_all(store.blob_path(s.blob.hash))
        assert [read_code(f) for f in frames] == list(range(truth[key].size))
    for name, key in (("joint_states/position", "joint_pos"), ("joint_states/velocity", "joint_vel")):
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
    ds = EpisodeDataset(slice_, obs=["cam0/rgb", "cam1/rgb", "joint_states/position"],
                        action="joint_states/velocity", fps=7, shard=None)
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
            np.testing.assert_allclose(sample["joint_states/position"].numpy(), truth["joint_pos"][j].astype(np.float32))
    assert checked >= 10


def test_idempotent_and_stream_selection_via_cli(bag, tmp_path: Path) -> None:
    path, _ = bag
    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers())
    hashes = []
    for root in ("a", "b"):
        args = parser.parse_args([
            "ingest", "mcap", "--root", str(tmp_path / root), "--slice", "slc_0000000c", "--quiet",
            "--stream", "top/rgb=/cam1/image_raw/compressed", "--stream", "arm/q=/joint_states:position",
            "--site", "lab-a", str(path),
        ])
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
        schema = w.register_msgdef("sensor_msgs/msg/JointState", msgdef("sensor_msgs/msg/JointState"))
        for i, t in enumerate(stamps):
            w.write_message("/joint_states", schema, {"header": header(t), "name": ["a"], "position": [float(i)],
                                                      "velocity": [], "effort": []}, log_time=t + i)
    lines: list[str] = []

    class Collect:
        def write(self, s: str) -> None:
            lines.append(s)

        def flush(self) -> None:
            pass

    store = Store(tmp_path / "root")
    m = ingest_mcap(store, [path], "slc_0000000f", progress=Progress(Collect()))
    s = m.segments[0].streams["joint_states/position"]
    assert sorted(m.segments[0].streams) == ["joint_states/position"]  # empty velocity/effort skipped
    t, v = decode_table(store.blob_path(s.blob.hash).read_bytes())
    assert t.tolist() == [T0, T0 + 10**8, T0 + 2 * 10**8] and v[:, 0].tolist() == [0.0, 1.0, 3.0]
    assert any("dropped 1 message" in line for line in lines)
