"""Synthetic slices for the EpisodeDataset tests: data that knows its own ground truth.

Every video frame encodes its own frame index as 16 black/white 16x16 blocks (large enough to
survive H.264), and every table row encodes its own record index, so a test can tell exactly
which record the dataset returned and compare it with the timestamps the test wrote.

Grid used by the tests: ``FPS = 10`` Hz from ``t0`` (the first video frame, which is the
latest first record), so grid time ``k`` is ``t0 + k * 100 ms``. The video has frames planted
exactly on grid time 3, 1 ns before grid time 5 and 1 ns after grid time 7, and a gap (dropped
frames) over grid times 11..14.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from rayform.slice import Slice
from rayform_server.builder import SliceBuilder, TableData, VideoData
from rayform_server.store import Store
from support.fakes import store_slice

FPS = 10
MS = 1_000_000
SQ = float(np.sqrt(0.5))
#: A 90 degree yaw (about +z) in ROS, quaternion x, y, z, w.
YAW90 = (0.0, 0.0, SQ, SQ)
SLICE_ID = "slc_0123abcd"


def encode_index_frame(i: int, size: int = 64) -> np.ndarray:
    """``(size, size, 3) uint8`` frame whose 4x4 blocks spell ``i`` in binary."""
    bits = (i >> np.arange(16)) & 1
    img = np.kron(bits.reshape(4, 4) * 255, np.ones((size // 4, size // 4))).astype(np.uint8)
    return np.repeat(img[:, :, None], 3, axis=2)


def decode_index_frame(chw: np.ndarray) -> int:
    """Inverse of :func:`encode_index_frame` on a decoded ``(3, H, W)`` frame."""
    gray = np.asarray(chw, dtype=np.float64).mean(axis=0)
    h, w = gray.shape
    blocks = gray.reshape(4, h // 4, 4, w // 4).mean(axis=(1, 3)).reshape(-1)
    return int(((blocks > 127).astype(np.int64) << np.arange(16)).sum())


def _jittered(
    rng: np.random.Generator, start: int, end: int, rate_hz: float, jitter_ms: float
) -> np.ndarray:
    n = int((end - start) * rate_hz / 1e9) + 1
    t = start + np.rint(np.arange(n) * 1e9 / rate_hz + rng.uniform(-jitter_ms, jitter_ms, n) * MS)
    t[0] = start
    return np.unique(t.astype(np.int64))


@dataclass
class SegmentTruth:
    id: str
    site: str
    version: int
    t0: int
    video_t: np.ndarray
    joints_t: np.ndarray
    action_t: np.ndarray
    pose_t: np.ndarray
    tool_t: np.ndarray
    end: int = field(default=0)


def video_times(rng: np.random.Generator, t0: int, seconds: float) -> np.ndarray:
    base = _jittered(rng, t0, t0 + int(seconds * 1e9), 30, 4)
    planted = np.array([t0 + 300 * MS, t0 + 500 * MS - 1, t0 + 700 * MS + 1], dtype=np.int64)
    keep = np.ones(base.size, bool)
    for p in planted:
        keep &= np.abs(base - p) > 10 * MS
    keep &= ~((base > t0 + 1050 * MS) & (base < t0 + 1450 * MS))  # dropped frames
    keep[0] = True
    return np.unique(np.concatenate([base[keep], planted]))


def build_slice(
    root: Path, cache_dir: Path, seconds: tuple[float, ...] = (3.0, 2.0), gop: int = 10
) -> tuple[Slice, list[SegmentTruth]]:
    """A slice with one segment per entry of ``seconds`` (video keyframe interval ``gop``);
    returns it and the ground truth."""
    store = Store(root)
    builder = SliceBuilder(store, description="dataset tests")
    rng = np.random.default_rng(1234)
    truths = []
    for n, secs in enumerate(seconds):
        seg_id = f"seg_{n + 1:08x}"
        t0 = 1_700_000_000_000_000_000 + n * 100_000_000_000
        vt = video_times(rng, t0, secs)
        end = int(vt[-1])
        jt = _jittered(rng, t0 - 5 * MS, end + 200 * MS, 100, 2)
        at = _jittered(rng, t0 - 7 * MS, end + 200 * MS, 50, 3)
        pt = _jittered(rng, t0 - 9 * MS, end + 200 * MS, 20, 3)
        tt = _jittered(rng, t0 - 9 * MS, end + 200 * MS, 20, 3)
        ji, ai, pi, ti = (np.arange(x.size, dtype=np.float32) for x in (jt, at, pt, tt))
        pose = np.stack([1 + pi, 2 + 0 * pi, 3 + 0 * pi, *(v + 0 * pi for v in YAW90)], axis=1)
        tool = np.stack([1 + 0 * ti, 2 + 0 * ti, 3 + ti], axis=1)
        site, version = ("lab-a", 1) if n % 2 == 0 else ("lab-b", 2)
        builder.add_segment(
            seg_id,
            site=site,
            version=version,
            streams=[
                VideoData(
                    "cam0/rgb",
                    (encode_index_frame(i) for i in range(vt.size)),
                    vt,
                    rate_hz=30,
                    gop=gop,
                ),
                TableData(
                    "joints/position",
                    jt,
                    np.stack([ji, ji * 0.5], axis=1),
                    rate_hz=100,
                    units="rad",
                ),
                TableData(
                    "joints/position_delta",
                    at,
                    np.stack([ai, -ai], axis=1),
                    rate_hz=50,
                    units="rad",
                ),
                TableData(
                    "ee/pose", pt, pose.astype(np.float32), rate_hz=20, frame="ros", quantity="pose"
                ),
                TableData(
                    "tool/position",
                    tt,
                    tool.astype(np.float32),
                    rate_hz=20,
                    frame="opencv",
                    quantity="position",
                ),
            ],
        )
        truths.append(SegmentTruth(seg_id, site, version, t0, vt, jt, at, pt, tt, end))
    manifest = builder.commit(SLICE_ID)
    return store_slice(SLICE_ID, manifest, store, cache_dir), truths
