"""Matrix row 2: many processes on one cache directory, with working, fake and stale locks.

8 ``rayform pull`` processes and 2 DataLoader-driven datasets fetching on demand share one cache
behind a throttled proxy (so they overlap). With working locks each blob crosses the wire once;
with a ``flock`` that "succeeds" for everyone (as on some Lustre/NFS mounts, simulated by
replacing it in the subprocesses) the download claims still make it once, and the cache is
exactly right. A lock left by a SIGKILLed or frozen holder delays the others by seconds at most.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support import DEMO_SLICE, SCRIPTS, TOKEN
from support.faultproxy import FaultProxy
from support.reliability import assert_cache_consistent, pull_cmd, sub_env

import rayform

OBS = ["cam0/rgb", "joints/position"]
ACTION = "joints/position_delta"

# Replaces the per-host flock with one that always "acquires" at once, for everyone (as on
# Lustre or NFS without working locks); the claims (rayform.cache._claims) stay.
# `rayform`, and a DataLoader with two workers that prints how many samples it saw.
_PULL = str(SCRIPTS / "rayform_cli.py")
_LOADER = [str(SCRIPTS / "crowd_loader.py")]


def _crowd(url: str, cache: Path) -> None:
    env = sub_env(RAYFORM_ENDPOINT=url, RAYFORM_CACHE_DIR=str(cache))
    procs = [
        subprocess.Popen(
            [sys.executable, _PULL, *pull_cmd(url, cache, "--jobs", "4")[3:]],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(8)
    ]
    procs += [
        subprocess.Popen(
            [sys.executable, *_LOADER, DEMO_SLICE, ACTION, *OBS],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=240) for p in procs]
    for p, (_, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err
    assert outs[-1][0] == outs[-2][0] and int(outs[-1][0]) > 0  # both datasets saw every sample


def test_eight_pullers_and_two_datasets_share_one_cache(fproxy: FaultProxy, tmp_path: Path) -> None:
    fproxy.throttle_s = 0.002
    cache = tmp_path / "shared"
    _crowd(fproxy.url, cache)
    expected = sorted(
        rayform.Client(endpoint=fproxy.url, token=TOKEN, cache_dir=tmp_path / "ref")
        .slices.get(DEMO_SLICE)
        .manifest.blobs()
    )
    assert assert_cache_consistent(cache) == expected
    assert list((cache / "tmp").iterdir()) == []
    assert set(fproxy.stats.transfers) == set(expected)
    # One claim per blob, no flock (which lies on some filesystems): each blob crosses once.
    assert dict(fproxy.stats.transfers) == {h: 1 for h in expected}, "each blob once"


def _holder(fproxy: FaultProxy, cache: Path) -> subprocess.Popen[bytes]:
    """A throttled pull that is writing (and holding the claims of) some blobs."""
    fproxy.throttle_s = 0.05
    proc = subprocess.Popen(
        pull_cmd(fproxy.url, cache, "--jobs", "2"), env=sub_env(), stderr=subprocess.DEVNULL
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if (cache / "tmp").is_dir() and any(
            p.stat().st_size > 1024 for p in (cache / "tmp").glob("*.part")
        ):
            return proc
        time.sleep(0.02)
    proc.kill()
    raise AssertionError("the holder never started writing")


def _timed_pull(fproxy: FaultProxy, cache: Path) -> float:
    fproxy.throttle_s = 0.0
    t0 = time.monotonic()
    report = rayform.Client(endpoint=fproxy.url, token=TOKEN, cache_dir=cache).pull(DEMO_SLICE)
    assert report.blobs == len(assert_cache_consistent(cache)) == 28
    return time.monotonic() - t0


def test_claim_of_a_sigkilled_holder_delays_nobody(fproxy: FaultProxy, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    holder = _holder(fproxy, cache)
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    assert list((cache / "claims").glob("*.claim")), "the claims stay behind"
    assert _timed_pull(fproxy, cache) < 3.0
    assert list((cache / "tmp").glob("*.part")) == []


@pytest.mark.stress
def test_claim_of_a_frozen_holder_delays_others_by_the_stale_time(
    fproxy: FaultProxy, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    holder = _holder(fproxy, cache)
    holder.send_signal(signal.SIGSTOP)  # alive, holding its claims, making no progress
    try:
        waited = _timed_pull(fproxy, cache)
        # A frozen holder beats no more: its claim is taken over after the 15 s stale time,
        # one wait on one clock, as the claim is the only lock.
        assert 12.0 < waited < 25.0, waited
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
