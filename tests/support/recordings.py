"""Recordings written here as a user's own would be: LeRobot v2.1 datasets and ROS 2 MCAP bags.

Shared by the ingest tests and the docs examples (whose pages ingest a ``my_lerobot_dataset/``
and ``bags/run_00N.mcap``). Frames carry their index as a bit pattern (``*code_image``), so a
test reads back which frame it got.
"""

from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path

import av
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from mcap_ros2.writer import Writer

from rayform_server._video import encode_video


# -- LeRobot v2.1 ------------------------------------------------------------------------------
def write_lerobot_v21(
    root: Path,
    episodes: int = 2,
    n: int = 20,
    fps: int = 10,
    jitter_s: float = 0.0,
    action: bool = False,
    tasks: list[str] | None = None,
    language: bool = False,
) -> dict:
    """A LeRobot v2.1-layout dataset by hand: one parquet file and one MP4 per episode
    (and a 4-D ``action`` column when ``action``; docs/recipes.md ingests one).

    With ``tasks``, ``meta/tasks.jsonl`` lists them and episode ``e`` holds task
    ``e % len(tasks)`` in its first half and ``(e + 1) % len(tasks)`` in its second (when there
    are several). With ``language``, LeRobot 0.6.1's language columns: every frame repeats the
    episode's persistent rows (subtask "reach" at 0 s, "grasp" at frame n // 2; a plan at 0 s)
    and frame 3 carries an interjection and a VQA pair (``truth["language"]``).

    ``truth["t"]`` holds the times the ingest must store: ``frame_index / fps`` snapped to
    ns when ``jitter_s`` is 0, else the float32 timestamps (jittered by up to ``jitter_s``).
    """
    rng = np.random.default_rng(3)
    truth: dict = {"state": [], "t": []}
    features = {
        "observation.images.front": {
            "dtype": "video",
            "shape": [48, 64, 3],
            "names": ["height", "width", "channels"],
        },
        "observation.state": {"dtype": "float32", "shape": [4], "names": None},
        "timestamp": {"dtype": "float32", "shape": [1], "names": None},
        "frame_index": {"dtype": "int64", "shape": [1], "names": None},
        "episode_index": {"dtype": "int64", "shape": [1], "names": None},
        "index": {"dtype": "int64", "shape": [1], "names": None},
        "task_index": {"dtype": "int64", "shape": [1], "names": None},
    }
    if action:
        features["action"] = {"dtype": "float32", "shape": [4], "names": None}
    if language:
        for key in ("language_persistent", "language_events"):
            features[key] = {"dtype": "language", "shape": [1], "names": None}
    info = {
        "codebase_version": "v2.1",
        "fps": fps,
        "chunks_size": 1000,
        "total_episodes": episodes,
        "data_path": "data/chunk-{episode_chunk:03d}/episode_{episode_index:06d}.parquet",
        "video_path": "videos/chunk-{episode_chunk:03d}/{video_key}/episode_{episode_index:06d}.mp4",
        "features": features,
    }
    (root / "meta").mkdir(parents=True)
    (root / "meta" / "info.json").write_text(json.dumps(info))

    def task_of(e: int, i: int) -> int:
        if not tasks:
            return 0
        return (e + (i >= n // 2 and len(tasks) > 1)) % len(tasks)

    (root / "meta" / "episodes.jsonl").write_text(
        "".join(
            json.dumps(
                {
                    "episode_index": e,
                    "tasks": [tasks[k] for k in dict.fromkeys(task_of(e, i) for i in range(n))]
                    if tasks
                    else ["t"],
                    "length": n,
                }
            )
            + "\n"
            for e in range(episodes)
        )
    )
    if tasks:
        (root / "meta" / "tasks.jsonl").write_text(
            "".join(json.dumps({"task_index": k, "task": t}) + "\n" for k, t in enumerate(tasks))
        )
    truth["tasks"] = [[task_of(e, i) for i in range(n)] for e in range(episodes)]
    for e in range(episodes):
        state = rng.standard_normal((n, 4)).astype(np.float32)
        jitter = rng.uniform(0, jitter_s, n) * (np.arange(n) > 0)
        ts = (np.arange(n) / fps + jitter).astype(np.float32)
        table = pa.table(
            {
                "observation.state": pa.FixedSizeListArray.from_arrays(pa.array(state.ravel()), 4),
                "timestamp": ts,
                "frame_index": np.arange(n),
                "episode_index": np.full(n, e),
                "index": np.arange(n) + e * n,
                "task_index": np.array(truth["tasks"][e], np.int64),
            }
        )
        if language:
            persistent, events = _language_rows(n, fps, e)
            table = table.append_column("language_persistent", persistent)
            table = table.append_column("language_events", events)
        if action:
            moves = rng.standard_normal((n, 4)).astype(np.float32)
            table = table.append_column(
                "action", pa.FixedSizeListArray.from_arrays(pa.array(moves.ravel()), 4)
            )
        (root / "data" / "chunk-000").mkdir(parents=True, exist_ok=True)
        pq.write_table(table, root / "data" / "chunk-000" / f"episode_{e:06d}.parquet")
        video = root / "videos" / "chunk-000" / "observation.images.front" / f"episode_{e:06d}.mp4"
        video.parent.mkdir(parents=True, exist_ok=True)
        encode_video([lerobot_code_image(10 * e + i) for i in range(n)], video, rate_hz=fps, gop=2)
        truth["state"].append(state)
        exact = np.rint(np.arange(n) * (1e9 / fps)).astype(np.int64)
        truth["t"].append(
            np.rint(ts.astype(np.float64) * 1e9).astype(np.int64) if jitter_s else exact
        )
    return truth


_PERSISTENT = pa.list_(
    pa.struct(
        [
            ("role", pa.string()),
            ("content", pa.string()),
            ("style", pa.string()),
            ("timestamp", pa.float32()),
            ("camera", pa.string()),
            ("tool_calls", pa.list_(pa.string())),
        ]
    )
)
_EVENTS = pa.list_(
    pa.struct(
        [
            ("role", pa.string()),
            ("content", pa.string()),
            ("style", pa.string()),
            ("camera", pa.string()),
            ("tool_calls", pa.list_(pa.string())),
        ]
    )
)


def _language_rows(n: int, fps: int, e: int) -> tuple[pa.Array, pa.Array]:
    """LeRobot 0.6.1's ``language_persistent`` and ``language_events`` of one episode."""

    def row(content: str, style: str, role: str = "assistant", **kw: object) -> dict:
        return {"role": role, "content": content, "style": style, "camera": None,
                "tool_calls": None, **kw}  # fmt: skip

    half = float(np.float32((n // 2) / fps))  # float32, as LeRobot stores timestamps
    persistent = [
        row(f"reach {e}", "subtask", timestamp=0.0),
        row("grasp", "subtask", timestamp=half),
        row("reach, then grasp", "plan", timestamp=0.0),
    ]
    events: list[list[dict]] = [[] for _ in range(n)]
    events[3] = [
        row("stop!", "interjection", role="user"),
        row("what is in the gripper?", "vqa", role="user", camera="observation.images.front"),
        row("a cube", "vqa", tool_calls=["look"]),
    ]
    return pa.array([persistent] * n, _PERSISTENT), pa.array(events, _EVENTS)


def lerobot_code_image(k: int) -> np.ndarray:
    img = np.zeros((48, 64, 3), np.uint8)
    for bit in range(8):
        if (k >> bit) & 1:
            img[:, bit * 8 : (bit + 1) * 8] = 255
    return img


def read_lerobot_code(img: np.ndarray) -> int:
    return sum(1 << b for b in range(8) if img[:, b * 8 + 2 : b * 8 + 6].mean() > 128)


# -- ROS 2 MCAP ---------------------------------------------------------------------------------
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
            img[:, bit * bw : (bit + 1) * bw] = 255
    return img


def read_code(img: np.ndarray) -> int:
    bw = img.shape[1] // 8
    return sum(1 << b for b in range(8) if img[:, b * bw + 2 : (b + 1) * bw - 2].mean() > 128)


def jpeg(img: np.ndarray) -> bytes:
    ctx = av.CodecContext.create("mjpeg", "w")
    ctx.width, ctx.height, ctx.pix_fmt, ctx.time_base = (
        img.shape[1],
        img.shape[0],
        "yuvj420p",
        Fraction(1, 30),
    )
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


#: What ``write_bag(instruction=True)``'s ``/instruction`` topic says, in order.
INSTRUCTIONS = ["pick up the cube", "place it in the bin"]


def write_bag(
    path: Path, seed: int = 0, *, odd_size_at: int | None = None, instruction: bool = False
) -> dict:
    """A bag: two cameras (raw rgb8 at 10 Hz, JPEG at 15 Hz) with jitter and drops, joints at 50 Hz, a pose at 20 Hz.

    With ``instruction``, a ``std_msgs/msg/String`` topic ``/instruction`` (no header) logged
    at ``truth["instruction"]`` (ns): "pick up the cube", then "place it in the bin"."""
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
        if instruction:
            string = w.register_msgdef("std_msgs/msg/String", "string data")
            truth["instruction"] = np.array([T0 + 100_000_000, T0 + 2_000_000_000])
            for t, text in zip(truth["instruction"].tolist(), INSTRUCTIONS, strict=True):
                w.write_message("/instruction", string, {"data": text}, log_time=t)
        for log_t, key, i in events:
            t = int(truth[key][i])
            if key == "cam0":
                # frame code = index in the *written* (stamp-sorted) sequence
                img = code_image(i) if i != odd_size_at else code_image(i, H + 2, W)
                msg = {
                    "header": header(t),
                    "height": img.shape[0],
                    "width": W,
                    "encoding": "bgr8",
                    "is_bigendian": 0,
                    "step": W * 3,
                    "data": img[:, :, ::-1].tobytes(),
                }
                w.write_message(
                    "/cam0/image_raw", schemas["sensor_msgs/msg/Image"], msg, log_time=log_t
                )
            elif key == "cam1":
                msg = {"header": header(t), "format": "jpeg", "data": jpeg(code_image(i))}
                w.write_message(
                    "/cam1/image_raw/compressed",
                    schemas["sensor_msgs/msg/CompressedImage"],
                    msg,
                    log_time=log_t,
                )
            elif key == "joints":
                msg = {
                    "header": header(t),
                    "name": [f"j{k}" for k in range(6)],
                    "position": truth["joint_pos"][i].tolist(),
                    "velocity": truth["joint_vel"][i].tolist(),
                    "effort": [],
                }
                w.write_message(
                    "/joint_states", schemas["sensor_msgs/msg/JointState"], msg, log_time=log_t
                )
            else:
                v = truth["pose_val"][i]
                msg = {
                    "header": header(t),
                    "pose": {
                        "position": dict(zip("xyz", v[:3], strict=True)),
                        "orientation": dict(zip("xyzw", v[3:], strict=True)),
                    },
                }
                w.write_message(
                    "/ee_pose", schemas["geometry_msgs/msg/PoseStamped"], msg, log_time=log_t
                )
    return truth
