"""The demo's second robot (``rayform-server demo --robot single-arm``, issue 23), and the
default bimanual demo byte for byte as it was before the second robot existed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from support import DEMO_SLICE

from rayform_server.demo import SINGLE_ARM_SLICE, SINGLE_ARM_STREAMS, build_demo
from rayform_server.store import Store

# The small bimanual demo's manifest hash before --robot existed (same encoder as this
# checkout's tests use), in the one manifest format: what `rayform-server migrate` makes of that
# demo's version 2 manifest 31195fa0895f19b0... The default demo must not change by a byte.
BIMANUAL_SMALL_HASH = "43f7c061eff69cfe99210ef38e498337f5e664097368213facc83199a4caa494"


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rayform_server", "demo", *args],
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_default_demo_is_byte_identical_and_single_arm_is_its_own_slice(
    tmp_path: Path, demo_root: Path
) -> None:
    r = _run("--root", str(tmp_path), "--small", "--jobs", "1")
    assert r.returncode == 0, r.stderr
    store = Store(tmp_path)
    assert store.get_slice(DEMO_SLICE)["manifest"] == BIMANUAL_SMALL_HASH
    assert Store(demo_root).get_slice(DEMO_SLICE)["manifest"] == BIMANUAL_SMALL_HASH
    r = _run("--root", str(tmp_path), "--small", "--robot", "single-arm")
    assert r.returncode == 0, r.stderr
    assert SINGLE_ARM_SLICE in r.stderr and "episode 4/4" in r.stderr
    digest = store.get_slice(SINGLE_ARM_SLICE)["manifest"]
    assert store.get_slice(DEMO_SLICE)["manifest"] == BIMANUAL_SMALL_HASH  # untouched
    manifest = store.load_manifest(digest)
    assert len(manifest.segments) == 4
    cam, joints, action = SINGLE_ARM_STREAMS
    for seg in manifest.segments:
        st = seg.streams
        assert set(st) == set(SINGLE_ARM_STREAMS)
        assert st[cam].kind == "video" and st[cam].shape == (96, 128, 3)
        assert st[joints].shape == (7,) and st[action].shape == (7,)
        assert {s.rate_hz for s in st.values()} == {15.0}
        assert 1.8 < seg.duration_s < 2.1
    # Deterministic: another root, the same manifest.
    assert (
        build_demo(tmp_path / "again", SINGLE_ARM_SLICE, small=True, robot="single-arm").hash
        == digest
    )
    r = _run("--root", str(tmp_path), "--small", "--robot", "single-arm", "--renditions", "48")
    assert r.returncode == 2 and "plain build" in r.stderr
