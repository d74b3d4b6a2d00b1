"""The demo slice: deterministic, and shaped like real robot data (rates, jitter, drops, sites)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import av
import numpy as np
import pytest
from support import DEMO_SLICE

from rayform.format import SEGMENT_ID_RE, decode_table, decode_timestamps
from rayform.manifest import Manifest
from rayform_server.demo import SITES, build_demo
from rayform_server.store import Store

STREAMS = {"cam0/rgb", "wrist/rgb", "joints/position", "joints/position_delta", "ee/pose"}


@pytest.fixture(scope="module")
def store(demo_root: Path) -> Store:
    return Store(demo_root)


@pytest.fixture(scope="module")
def manifest(store: Store) -> Manifest:
    return store.load_manifest(store.get_slice(DEMO_SLICE)["manifest"])


def _blob(store: Store, digest: str) -> bytes:
    return store.blob_path(digest).read_bytes()


def test_small_demo_is_deterministic_and_idempotent(tmp_path: Path, manifest: Manifest) -> None:
    again = build_demo(tmp_path / "a", slice_id=DEMO_SLICE, small=True)
    assert again.hash == manifest.hash  # same seed, another root: same bytes
    blobs_before = sorted(p.name for p in (tmp_path / "a" / "blobs").rglob("*") if p.is_file())
    assert build_demo(tmp_path / "a", slice_id=DEMO_SLICE, small=True).hash == manifest.hash
    blobs_after = sorted(p.name for p in (tmp_path / "a" / "blobs").rglob("*") if p.is_file())
    assert blobs_before == blobs_after == sorted(manifest.blobs())
    assert list((tmp_path / "a" / "tmp").iterdir()) == []
    other = build_demo(tmp_path / "b", slice_id=DEMO_SLICE, small=True, seed=1)
    assert other.hash != manifest.hash


def test_demo_shape_sites_versions(manifest: Manifest) -> None:
    assert len(manifest.segments) == 4
    assert {s.site for s in manifest.segments} == set(SITES)
    assert {s.version for s in manifest.segments} == {1, 2}
    assert all(SEGMENT_ID_RE.match(s.id) for s in manifest.segments)
    assert len({s.id for s in manifest.segments}) == 4
    for seg in manifest.segments:
        assert set(seg.streams) == STREAMS
        st = seg.streams
        assert st["cam0/rgb"].kind == st["wrist/rgb"].kind == "video"
        assert st["cam0/rgb"].rate_hz == st["wrist/rgb"].rate_hz == 30.0
        assert st["cam0/rgb"].shape == (96, 128, 3)
        assert st["joints/position"].rate_hz == 200.0 and st["joints/position"].shape == (14,)
        assert st["joints/position"].units == "rad"
        assert st["joints/position_delta"].rate_hz == 50.0 and st[
            "joints/position_delta"
        ].shape == (14,)
        pose = st["ee/pose"]
        assert (pose.rate_hz, pose.shape, pose.frame, pose.quantity, pose.units) == (
            100.0,
            (7,),
            "opencv",
            "pose",
            "m",
        )
        starts = [s.t0_ns for s in st.values()]
        assert len(set(starts)) == len(starts), "each stream starts at its own time"
        assert seg.start_ns == min(starts) and 1.8 < seg.duration_s < 2.1


def test_camera_timestamps_jitter_and_drop(store: Store, manifest: Manifest) -> None:
    drops = 0
    for seg in manifest.segments:
        for name in ("cam0/rgb", "wrist/rgb"):
            s = seg.streams[name]
            t = decode_timestamps(_blob(store, s.timestamps.hash))
            assert t.size == s.count and t[0] == s.t0_ns and t[-1] == s.t1_ns
            dt_ms = np.diff(t) / 1e6
            regular = dt_ms[dt_ms < 50]
            assert 0.5 < regular.std() < 5.0, "a few ms of capture jitter"
            assert abs(regular.mean() - 1000 / 30) < 1.0
            gaps = dt_ms[dt_ms >= 50]
            assert np.all((gaps > 55) & (gaps < 80)), "a dropped frame leaves a ~2-period gap"
            drops += gaps.size
    assert drops >= len(manifest.segments) * 2


def test_joint_streams_are_smooth_and_actions_match_motion(
    store: Store, manifest: Manifest
) -> None:
    for seg in manifest.segments:
        tq, q = decode_table(_blob(store, seg.streams["joints/position"].blob.hash))
        assert q.dtype == np.float32 and q.shape == (tq.size, 14)
        assert np.all(np.abs(np.diff(tq) / 1e6 - 5.0) < 1.0)  # 200 Hz, sub-ms jitter
        assert np.abs(np.diff(q, axis=0)).max() < 0.03  # smooth: < 6 rad/s
        assert np.ptp(q[:, :7], axis=0).max() > 0.2  # and it really moves
        ta, a = decode_table(_blob(store, seg.streams["joints/position_delta"].blob.hash))
        assert np.allclose(np.diff(ta), 20_000_000, atol=1)  # 50 Hz control ticks
        # The commanded deltas integrate to the measured motion (up to the 15 ms lag).
        i0, i1 = np.searchsorted(tq, ta[0]), np.searchsorted(tq, ta[-1])
        np.testing.assert_allclose(a[:-1].sum(axis=0), q[i1] - q[i0], atol=0.08)


def test_ee_pose_is_consistent(store: Store, manifest: Manifest) -> None:
    for seg in manifest.segments:
        t, pose = decode_table(_blob(store, seg.streams["ee/pose"].blob.hash))
        np.testing.assert_allclose(np.linalg.norm(pose[:, 3:], axis=1), 1.0, atol=1e-5)
        # OpenCV world: y points down, so the gripper above the table has y <= 0.
        assert np.all(pose[:, 1] < 0.01) and pose[:, 1].min() < -0.15
        path = np.linalg.norm(np.diff(pose[:, :3], axis=0), axis=1)
        assert path.sum() > 0.1 and path.max() < 0.02  # > 10 cm of travel, no jumps (100 Hz)


def test_videos_decode_to_moving_textured_frames(store: Store, manifest: Manifest) -> None:
    seg = manifest.segments[0]
    for name in ("cam0/rgb", "wrist/rgb"):
        s = seg.streams[name]
        with av.open(str(store.blob_path(s.blob.hash))) as c:
            frames = [f.to_ndarray(format="rgb24") for f in c.decode(video=0)]
        assert len(frames) == s.count and frames[0].shape == s.shape
        assert all(f.std() > 10 for f in frames[:: len(frames) // 4]), "textured, not flat"
        diff = np.abs(frames[len(frames) // 2].astype(int) - frames[0].astype(int)).mean()
        assert diff > 3, f"{name} content moves"


def test_demo_cli_prints_progress(tmp_path: Path) -> None:
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "rayform_server",
            "demo",
            "--root",
            str(tmp_path),
            "--small",
            "--slice",
            "slc_0000aaaa",
            "--jobs",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    assert "episode 4/4" in r.stderr and "slc_0000aaaa" in r.stderr
    r = subprocess.run(
        [sys.executable, "-m", "rayform_server", "slices", "--root", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0 and "slc_0000aaaa" in r.stdout and "4 segments" in r.stdout


def test_parallel_build_matches_serial(tmp_path: Path, manifest: Manifest) -> None:
    assert build_demo(tmp_path, slice_id=DEMO_SLICE, small=True, jobs=2).hash == manifest.hash
