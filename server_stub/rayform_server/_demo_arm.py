"""A second demo robot: one arm, one wrist camera, 7 joints, everything at 15 Hz.

``rayform-server demo --robot single-arm`` writes it as its own slice (``SINGLE_ARM_SLICE``),
so that the docs and tests can mix two robots whose data differ the way real fleets do:

========================  ======  =========================================================
stream                    rate    content
========================  ======  =========================================================
``hand/rgb``              15 Hz   wrist camera, H.264; capture jitter ~4 ms, ~2 % drops
``arm/joint_pos``         15 Hz   7-D measured joint angles (rad)
``arm/joint_cmd_delta``   15 Hz   7-D action: commanded joint change per control step (rad)
========================  ======  =========================================================

The same pick-and-place task as the bimanual demo (its left arm alone), seeded separately,
so the episodes differ from the bimanual ones. Deterministic like the bimanual demo.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from rayform.errors import InvalidArgumentError
from rayform.format import ColumnarManifest, check_slice_id, hash_bytes
from rayform.manifest import Segment
from rayform.units import human_bytes
from rayform_server._demo_scene import Scene, State, paint_tape, table_texture
from rayform_server._video import DEFAULT_GOP
from rayform_server.builder import SliceBuilder, TableData, VideoData
from rayform_server.store import Store

__all__ = ["SINGLE_ARM_SLICE", "SINGLE_ARM_STREAMS", "DemoKit", "build_single_arm"]

SINGLE_ARM_SLICE = "slc_5e1a0a77"
#: Stream names of the single-arm robot: camera, joints, action.
SINGLE_ARM_STREAMS = ("hand/rgb", "arm/joint_pos", "arm/joint_cmd_delta")
_RATE_HZ = 15.0
_SITE = "lab-oslo"


def _segment_id(seed: int, index: int) -> str:
    return "seg_" + hash_bytes(f"rayform-demo-single-arm:{seed}:{index}".encode())[:16]


@dataclass(frozen=True)
class DemoKit:
    """The bimanual demo's task and timing model, handed over by ``rayform_server.demo`` (they
    stay private to it): the plan class, the capture-time generator, the epoch and the lag."""

    plan: Any
    times: Callable[..., np.ndarray]
    epoch_ns: int
    lag_s: float


def _episode(store_root: str, spec: Any, seed: int, index: int, kit: DemoKit) -> Segment:
    epoch_ns, lag_s, make_plan, times = kit.epoch_ns, kit.lag_s, kit.plan, kit.times
    rng = np.random.default_rng([seed, index, 2])  # 2: not the bimanual demo's episodes
    lo, hi = spec.duration_s
    duration = float(rng.uniform(lo, hi)) if hi > lo else lo
    start_ns = epoch_ns + seed * 86_400 * 10**9 + index * 95 * 10**9 + int(rng.integers(0, 10**9))
    plan = make_plan(rng, duration)
    tex = table_texture(1, seed + 7)
    paint_tape(tex, (float(plan.place[0]), float(plan.place[1])), 0.045, (200, 60, 60))
    scene = Scene(tex, spec.size, np.array([40.0, 150.0, 70.0]))

    def rel(t_ns: np.ndarray) -> np.ndarray:
        return (t_ns - start_ns) / 1e9

    def measured(t_ns: np.ndarray) -> np.ndarray:
        return plan.q(rel(t_ns) - lag_s)

    def frames(t_ns: np.ndarray) -> Iterator[np.ndarray]:
        for t, q in zip(rel(t_ns), measured(t_ns), strict=True):
            yield scene.render_wrist(State(q=q, box=plan.box(float(t), q)))

    cam_t = times(rng, start_ns, duration, _RATE_HZ, 4e6, 0.02)
    joint_t = times(rng, start_ns, duration, _RATE_HZ, 2e5)
    ctrl_t = times(rng, start_ns, duration, _RATE_HZ, 0.0)
    q_joint = measured(joint_t)[:, :7].astype(np.float32)
    ctrl_s = rel(ctrl_t)
    delta = (plan.q(ctrl_s + 1 / _RATE_HZ) - plan.q(ctrl_s))[:, :7].astype(np.float32)
    builder = SliceBuilder(Store(store_root))
    cam, joints, action = SINGLE_ARM_STREAMS
    return builder.add_segment(
        _segment_id(seed, index),
        site=_SITE,
        version=1,
        streams=[
            VideoData(cam, frames(cam_t), cam_t, _RATE_HZ, gop=DEFAULT_GOP),
            TableData(joints, joint_t, q_joint, _RATE_HZ, units="rad"),
            TableData(action, ctrl_t, delta, _RATE_HZ, units="rad"),
        ],
    )


def build_single_arm(
    root: str,
    slice_id: str,
    kit: DemoKit,
    spec: Any,
    *,
    seed: int = 0,
    progress: Callable[[str], None] | None = None,
) -> ColumnarManifest:
    """Generate the single-arm demo into the data root ``root`` and commit ``slice_id``, at the
    bimanual demo's ``spec`` (a ``DemoSpec``: episodes, durations, camera size)."""
    check_slice_id(slice_id, new=True)
    if spec.episodes < 1:
        raise InvalidArgumentError(f"episodes must be at least 1, got {spec.episodes}")
    builder = SliceBuilder(
        Store(root),
        description=f"demo: single-arm pick-and-place, {spec.episodes} episodes (procedurally generated, seed {seed})",
    )
    for i in range(spec.episodes):
        seg = _episode(str(Store(root).root), spec, seed, i, kit)
        builder.segments.append(seg)
        if progress is not None:
            progress(
                f"episode {i + 1}/{spec.episodes}: {seg.id} {seg.duration_s:.1f} s, {human_bytes(seg.nbytes)}"
            )
    return builder.commit(slice_id)
