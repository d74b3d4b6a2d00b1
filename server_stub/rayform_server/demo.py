"""A demo slice that looks like real bimanual robot data, generated procedurally.

Each episode is a pick-and-place: the left arm reaches a box on the table, grasps it, carries
it to a taped target and returns home while the right arm idles. Streams (names match the
public ``EpisodeDataset`` example):

========================  ======  =========================================================
stream                    rate    content
========================  ======  =========================================================
``cam0/rgb``              30 Hz   overhead camera, H.264; capture jitter ~2 ms, ~2 % drops
``wrist/rgb``             30 Hz   left wrist camera, H.264; same jitter and drops
``joints/position``       200 Hz  14-D measured joint angles (rad), smooth
``joints/position_delta`` 50 Hz   14-D action: commanded joint change per control step (rad)
``ee/pose``               100 Hz  left tool pose x, y, z (m), qx, qy, qz, qw, OpenCV frame
========================  ======  =========================================================

The small demo records 2 s per episode: the beginning of the same task (the reach), so that
speeds stay realistic. Every stream starts a few ms after the episode start, at its own offset. Episodes alternate
between two sites (``lab-berkeley``: wood table, ``lab-zurich``: cutting mat); every third
episode (index 1, 4, 7, ...) is a re-processed version 2. Everything derives from ``seed``, so
the same call writes the same bytes and the same manifest hash (building twice is a no-op).
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from rayform.errors import InvalidArgumentError
from rayform.format import ColumnarManifest, check_slice_id, hash_bytes
from rayform.manifest import Segment
from rayform.units import human_bytes
from rayform_server._demo_arm import SINGLE_ARM_SLICE, SINGLE_ARM_STREAMS, DemoKit, build_single_arm
from rayform_server._demo_scene import (
    ARM_BASES,
    BOX_SIZE,
    Scene,
    State,
    fk,
    ik_down,
    paint_tape,
    pose_ros_to_opencv,
    table_texture,
)
from rayform_server._video import DEFAULT_GOP
from rayform_server.builder import SliceBuilder, TableData, VideoData
from rayform_server.store import Store

__all__ = [
    "DEMO_SLICE",
    "ROBOTS",
    "SINGLE_ARM_SLICE",
    "SINGLE_ARM_STREAMS",
    "SITES",
    "DemoSpec",
    "build_demo",
    "build_episode",
    "demo_spec",
    "segment_id",
]

DEMO_SLICE = "slc_7c1e04aa"
#: ``--robot`` values: the bimanual demo (the default, unchanged) and a second embodiment.
ROBOTS = ("bimanual", "single-arm")
SITES = ("lab-berkeley", "lab-zurich")
_EPOCH_NS = 1_767_225_600_000_000_000  # 2026-01-01T00:00:00Z
_CAMERA_HZ, _JOINT_HZ, _CONTROL_HZ, _POSE_HZ = 30.0, 200.0, 50.0, 100.0
_LAG_S = 0.015  # the measured joints trail the command by 15 ms
_MIN_TASK_S = 6.0
_HOME = (np.array([0.22, 0.26, 0.24]), np.array([0.22, -0.26, 0.24]))


@dataclass(frozen=True)
class DemoSpec:
    """Size of a demo build.

    Attributes:
        episodes: number of segments.
        duration_s: (min, max) episode length in seconds.
        size: camera ``(H, W)`` in pixels.
    """

    episodes: int
    duration_s: tuple[float, float]
    size: tuple[int, int]


def demo_spec(small: bool) -> DemoSpec:
    """The full demo (20 episodes of 6-8 s at 240x320) or the small one (4 x 2 s, 96x128)."""
    if small:
        return DemoSpec(episodes=4, duration_s=(2.0, 2.0), size=(96, 128))
    return DemoSpec(episodes=20, duration_s=(6.0, 8.0), size=(240, 320))


def segment_id(seed: int, index: int) -> str:
    """The demo's segment ID for episode ``index``: ``seg_`` + 16 hex from (seed, index)."""
    return "seg_" + hash_bytes(f"rayform-demo:{seed}:{index}".encode())[:16]


def _smoothstep(s: np.ndarray) -> np.ndarray:
    """Minimum-jerk profile on [0, 1] (zero velocity and acceleration at both ends)."""
    s = np.clip(s, 0.0, 1.0)
    return s * s * s * (10 - 15 * s + 6 * s * s)


class _Plan:
    """The commanded 14-D joint trajectory of one episode and where the box is."""

    def __init__(self, rng: np.random.Generator, duration_s: float) -> None:
        # The task always takes at least _MIN_TASK_S, so joint speeds stay realistic (a few
        # rad/s); a shorter recording (the small demo) captures only its beginning.
        self.duration_s = max(duration_s, _MIN_TASK_S)
        left = ARM_BASES[0]
        while True:
            pick = np.array([rng.uniform(0.30, 0.50), rng.uniform(0.12, 0.32), 0.0])
            place = np.array([rng.uniform(0.28, 0.46), rng.uniform(-0.08, 0.06), 0.0])
            if (
                np.hypot(*(place[:2] - left)) < 0.62
                and np.hypot(*(pick[:2] - left)) < 0.62
                and np.hypot(*(pick[:2] - place[:2])) > 0.12
            ):
                break
        self.pick, self.place = pick, place
        self.box_yaw0 = rng.uniform(-0.6, 0.6)
        grasp_z = BOX_SIZE / 2
        above = 0.16 + rng.uniform(0, 0.04)
        # (fraction of the episode, fingertip target, gripper opening 0..1, wrist roll)
        roll = rng.uniform(-0.3, 0.3)
        keys = [
            (0.00, _HOME[0], 1.0, 0.0),
            (0.08, _HOME[0], 1.0, 0.0),
            (0.24, pick + [0, 0, above], 1.0, roll),
            (0.34, pick + [0, 0, grasp_z], 1.0, roll),
            (0.40, pick + [0, 0, grasp_z], 0.15, roll),
            (0.50, pick + [0, 0, above + 0.03], 0.15, roll * 0.5),
            (0.66, place + [0, 0, above], 0.15, -roll),
            (0.74, place + [0, 0, grasp_z + 0.004], 0.15, -roll),
            (0.80, place + [0, 0, grasp_z + 0.004], 1.0, -roll),
            (0.90, place + [0, 0, above], 1.0, 0.0),
            (1.00, _HOME[0], 1.0, 0.0),
        ]
        jitter = np.r_[0, rng.uniform(-0.015, 0.015, len(keys) - 2), 0]
        self.key_t = np.array([k[0] for k in keys]) + jitter
        self.key_t[-1] = 1.0
        self.key_t *= self.duration_s
        self.key_q = np.zeros((len(keys), 7))
        for i, (_, tip, grip, r) in enumerate(keys):
            a = ik_down(np.asarray(tip, float), left)
            self.key_q[i] = [a[0], a[1], a[2], 0.0, a[3], r, grip]
        self.grasp_t, self.release_t = self.key_t[4], self.key_t[8]
        self.right_home = ik_down(_HOME[1], ARM_BASES[1])
        self.right_freq = rng.uniform(0.1, 0.3, 7)
        self.right_phase = rng.uniform(0, 2 * np.pi, 7)
        self.right_amp = np.array([0.06, 0.04, 0.04, 0.05, 0.05, 0.08, 0.05])

    def q(self, t_s: np.ndarray) -> np.ndarray:
        """Commanded joints ``(N, 14)`` (rad) at times ``t_s (N,)`` seconds from the start."""
        t = np.clip(np.asarray(t_s, float), 0.0, self.duration_s)
        seg = np.clip(np.searchsorted(self.key_t, t, side="right") - 1, 0, len(self.key_t) - 2)
        t0, t1 = self.key_t[seg], self.key_t[seg + 1]
        s = _smoothstep((t - t0) / np.maximum(t1 - t0, 1e-9))[:, None]
        left = self.key_q[seg] + s * (self.key_q[seg + 1] - self.key_q[seg])
        rh = self.right_home
        right_base = np.array([rh[0], rh[1], rh[2], 0.0, rh[3], 0.0, 0.5])
        wave = self.right_amp * np.sin(2 * np.pi * self.right_freq * t[:, None] + self.right_phase)
        right = right_base + wave - self.right_amp * np.sin(self.right_phase)
        return np.concatenate([left, right], axis=1)

    def box(self, t_s: float, q_meas: np.ndarray) -> np.ndarray:
        """Box bottom-centre x, y, z (m) and yaw (rad) at ``t_s`` given measured joints."""
        if t_s < self.grasp_t:
            return np.array([*self.pick[:2], 0.0, self.box_yaw0])
        if t_s >= self.release_t:
            q_rel = self.q(np.array([self.release_t - _LAG_S]))[0]
            yaw = (
                self.box_yaw0
                + self._tool_yaw(q_rel)
                - self._tool_yaw(self.q(np.array([self.grasp_t]))[0])
            )
            return np.array([*self.place[:2], 0.0, yaw])
        pts = fk(q_meas[:7], ARM_BASES[0])
        tip = pts["tip"]
        yaw = (
            self.box_yaw0
            + self._tool_yaw(q_meas)
            - self._tool_yaw(self.q(np.array([self.grasp_t]))[0])
        )
        return np.array([tip[0], tip[1], max(0.0, tip[2] - BOX_SIZE / 2), yaw])

    @staticmethod
    def _tool_yaw(q: np.ndarray) -> float:
        return float(q[0] + q[3] + q[5])


def _times(
    rng: np.random.Generator,
    start_ns: int,
    duration_s: float,
    rate_hz: float,
    jitter_ns: float,
    drop_frac: float = 0.0,
) -> np.ndarray:
    """Capture times (ns, int64, strictly increasing) of a stream with jitter and drops."""
    offset_ns = int(rng.integers(1_000_000, 25_000_000))
    period_ns = 1e9 / rate_hz
    n = int((duration_s * 1e9 - offset_ns) // period_ns) + 1
    clip = 0.4 * period_ns
    jit = np.clip(rng.normal(0.0, jitter_ns, n), -clip, clip) if jitter_ns else np.zeros(n)
    t = start_ns + offset_ns + np.round(np.arange(n) * period_ns + jit).astype(np.int64)
    if drop_frac > 0:
        k = max(1, int(round(drop_frac * n)))
        drop = rng.choice(np.arange(1, n - 1), size=k, replace=False)
        t = np.delete(t, drop)
    return t


def build_episode(
    store_root: str,
    spec: DemoSpec,
    seed: int,
    index: int,
    gop: int = DEFAULT_GOP,
    renditions: tuple[int, ...] = (),
) -> Segment:
    """Render, encode (keyframe every ``gop`` frames) and store episode ``index`` into the data
    root ``store_root``, with camera renditions at the heights ``renditions``; returns its
    segment (not yet part of any slice)."""
    rng = np.random.default_rng([seed, index])
    lo, hi = spec.duration_s
    duration = float(rng.uniform(lo, hi)) if hi > lo else lo
    start_ns = _EPOCH_NS + seed * 86_400 * 10**9 + index * 95 * 10**9 + int(rng.integers(0, 10**9))
    plan = _Plan(rng, duration)

    def rel(t_ns: np.ndarray) -> np.ndarray:
        return (t_ns - start_ns) / 1e9

    def measured(t_ns: np.ndarray) -> np.ndarray:
        return plan.q(rel(t_ns) - _LAG_S)

    site = index % len(SITES)
    tex = table_texture(site, seed)
    paint_tape(
        tex,
        (float(plan.place[0]), float(plan.place[1])),
        0.045,
        (40, 110, 210) if site else (230, 200, 40),
    )
    box_color = np.array(
        rng.choice([[200, 40, 35], [40, 150, 70], [230, 140, 30], [140, 60, 170]]), float
    )
    scene = Scene(tex, spec.size, box_color)

    cam_t = {
        name: _times(rng, start_ns, duration, _CAMERA_HZ, 2e6, 0.02)
        for name in ("cam0/rgb", "wrist/rgb")
    }
    joint_t = _times(rng, start_ns, duration, _JOINT_HZ, 1e5)
    ctrl_t = _times(rng, start_ns, duration, _CONTROL_HZ, 0.0)
    pose_t = _times(rng, start_ns, duration, _POSE_HZ, 2e5)

    def frames(t_ns: np.ndarray, render: Callable[[State], np.ndarray]):  # noqa: ANN202
        qs = measured(t_ns)
        for t, q in zip(rel(t_ns), qs, strict=True):
            yield render(State(q=q, box=plan.box(float(t), q)))

    q_joint = measured(joint_t).astype(np.float32)
    ctrl_s = rel(ctrl_t)
    delta = (plan.q(ctrl_s + 1 / _CONTROL_HZ) - plan.q(ctrl_s)).astype(np.float32)
    pts = fk(measured(pose_t)[:, :7], ARM_BASES[0])
    pose = pose_ros_to_opencv(pts["tip"], pts["yaw"], pts["pitch"], pts["roll"]).astype(np.float32)

    builder = SliceBuilder(Store(store_root), renditions=renditions)
    return builder.add_segment(
        segment_id(seed, index),
        site=SITES[site],
        version=2 if index % 3 == 1 else 1,
        streams=[
            VideoData(
                "cam0/rgb",
                frames(cam_t["cam0/rgb"], scene.render_cam0),
                cam_t["cam0/rgb"],
                _CAMERA_HZ,
                gop=gop,
            ),
            VideoData(
                "wrist/rgb",
                frames(cam_t["wrist/rgb"], scene.render_wrist),
                cam_t["wrist/rgb"],
                _CAMERA_HZ,
                gop=gop,
            ),
            TableData("joints/position", joint_t, q_joint, _JOINT_HZ, units="rad"),
            TableData("joints/position_delta", ctrl_t, delta, _CONTROL_HZ, units="rad"),
            TableData(
                "ee/pose", pose_t, pose, _POSE_HZ, units="m", frame="opencv", quantity="pose"
            ),
        ],
    )


def build_demo(
    root: str | os.PathLike[str],
    slice_id: str = DEMO_SLICE,
    *,
    small: bool = False,
    seed: int = 0,
    jobs: int = 1,
    progress: Callable[[str], None] | None = None,
    episodes: int | None = None,
    renditions: tuple[int, ...] = (),
    robot: str = "bimanual",
) -> ColumnarManifest:
    """Generate the demo episodes into the data root ``root`` and commit slice ``slice_id``.

    Deterministic: the same ``(small, seed)`` always writes the same blobs and manifest, so
    calling it again on the same root changes nothing.

    Args:
        root: data root directory (created if missing).
        slice_id: the slice to create or replace, e.g. ``"slc_7c1e04aa"``.
        small: 4 episodes of 2 s at 96x128 (for tests) instead of 20 of 6-8 s at 240x320.
        seed: everything random derives from it.
        jobs: episodes built in parallel processes (1 = in this process).
        progress: called with one line of text per finished episode.
        episodes: number of episodes (default: the spec's, 20 or 4 with ``small``).
        renditions: heights (even, pixels) of smaller copies of each camera video to store
            too; heights at or above the cameras' are skipped with a warning. A slice with
            renditions is committed as a format version 3 manifest (columnar pages that list them).
        robot: ``"bimanual"`` (this module's demo) or ``"single-arm"`` (one wrist camera, 7
            joints, 15 Hz, other stream names; ``rayform_server._demo_arm``; built in this
            process, without renditions). Pass its own slice ID, e.g. ``SINGLE_ARM_SLICE``.

    Returns:
        The committed manifest.

    Raises:
        InvalidArgumentError: ``slice_id`` is malformed or ``jobs`` is below 1.
    """
    if robot not in ROBOTS:
        raise InvalidArgumentError(f"robot={robot!r}: use one of {', '.join(ROBOTS)}")
    if robot == "single-arm":
        if renditions:
            raise InvalidArgumentError("the single-arm demo has no renditions: drop --renditions")
        kit = DemoKit(
            plan=_Plan, times=_times, epoch_ns=_EPOCH_NS, lag_s=_LAG_S
        )  # same task, scene and timing
        arm_spec = (
            demo_spec(small)
            if episodes is None
            else replace(demo_spec(small), episodes=int(episodes))
        )
        return build_single_arm(str(root), slice_id, kit, arm_spec, seed=seed, progress=progress)
    check_slice_id(slice_id, new=True)
    if jobs < 1:
        raise InvalidArgumentError(f"jobs must be at least 1, got {jobs}")
    spec = demo_spec(small)
    if episodes is not None:
        if episodes < 1:
            raise InvalidArgumentError(f"episodes must be at least 1, got {episodes}")
        spec = replace(spec, episodes=int(episodes))
    store = Store(root)
    root_s = str(Path(store.root))
    builder = SliceBuilder(
        store,
        description=f"demo: bimanual pick-and-place, {spec.episodes} episodes from {len(SITES)} sites "
        f"(procedurally generated, seed {seed})",
    )

    def report(seg: Segment, i: int) -> None:
        builder.segments.append(seg)
        if progress is not None:
            progress(
                f"episode {i + 1}/{spec.episodes}: {seg.id} {seg.site} v{seg.version} "
                f"{seg.duration_s:.1f} s, {human_bytes(seg.nbytes)}"
            )

    if jobs == 1:
        for i in range(spec.episodes):
            report(build_episode(root_s, spec, seed, i, renditions=renditions), i)
    else:
        # "spawn": a fresh interpreter per worker, safe whatever threads the caller runs.
        with ProcessPoolExecutor(
            max_workers=jobs, mp_context=multiprocessing.get_context("spawn")
        ) as pool:
            futures = [
                pool.submit(build_episode, root_s, spec, seed, i, DEFAULT_GOP, renditions)
                for i in range(spec.episodes)
            ]
            for i, fut in enumerate(futures):
                report(fut.result(), i)
    return builder.commit(slice_id)
