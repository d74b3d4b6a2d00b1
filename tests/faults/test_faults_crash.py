"""Matrix row 1: SIGKILL a pull, or a DataLoader worker fetching on demand, at random instants.

After every kill each file under ``blobs/`` hashes to its name, and the next pull (or a fresh
loader) completes with a verified cache. Kill instants come from a seeded RNG; the proxy
throttles blob bodies so that most kills land mid-transfer (the test counts them).
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from support import DEMO_SLICE, SCRIPTS, TOKEN
from support.faultproxy import FaultProxy
from support.reliability import assert_cache_consistent, pull_cmd, sub_env

import rayform

THROTTLE_S = 0.01  # per KiB of blob body: the 340 KB demo slice takes ~1.5 s with 4 jobs
OBS = ["cam0/rgb", "wrist/rgb", "joints/position"]
ACTION = "joints/position_delta"


def _parts(cache: Path) -> list[Path]:
    """The non-empty partial downloads in ``cache`` now. A download that completes between
    the listing and the stat is renamed away: it is not partial any more, so it is skipped."""
    tmp = cache / "tmp"
    out = []
    for p in tmp.glob("*.part") if tmp.is_dir() else []:
        try:
            if p.stat().st_size > 0:
                out.append(p)
        except FileNotFoundError:
            continue
    return out


def _blob_requests(fproxy: FaultProxy) -> int:
    while True:
        try:  # the proxy's thread may add a path while we sum
            return sum(n for path, n in list(fproxy.stats.requests.items()) if "/blobs/" in path)
        except RuntimeError:
            continue


def _kill_pulls(fproxy: FaultProxy, tmp_path: Path, kills: int, seed: int) -> Counter[str]:
    """SIGKILL ``kills`` throttled `rayform pull` processes; after each, check and complete a copy."""
    rng = random.Random(seed)
    cache = tmp_path / "cache"
    expected = sorted(
        rayform.Client(endpoint=fproxy.url, token=TOKEN, cache_dir=tmp_path / "ref")
        .slices.get(DEMO_SLICE)
        .manifest.blobs()
    )
    outcomes: Counter[str] = Counter()
    for i in range(kills):
        if cache.is_dir() and len(assert_cache_consistent(cache)) == len(expected):
            shutil.rmtree(cache)  # complete: start the next series of kills from empty
        fproxy.throttle_s = THROTTLE_S
        early, delay = rng.random() < 0.25, rng.uniform(0.05, 0.9)
        started = _blob_requests(fproxy)
        proc = subprocess.Popen(
            pull_cmd(fproxy.url, cache, "--jobs", "4"),
            env=sub_env(),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        if not early:
            # Count the delay from the first blob request, not from the spawn: interpreter and
            # import start-up (slow on a loaded machine) must not decide where the kill lands.
            deadline = time.monotonic() + 60
            while (
                _blob_requests(fproxy) == started
                and proc.poll() is None
                and time.monotonic() < deadline
            ):
                time.sleep(0.005)
        time.sleep(delay)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        done = assert_cache_consistent(cache) if cache.is_dir() else []
        parts = _parts(cache)
        outcomes[
            "mid-transfer"
            if parts
            else "complete"
            if len(done) == len(expected)
            else "between-blobs"
            if done
            else "before-first-byte"
        ] += 1
        # The next pull completes: run it on a copy so the kills keep accumulating on `cache`.
        fproxy.throttle_s = 0.0
        copy = tmp_path / f"next{i}"
        if cache.is_dir():
            shutil.copytree(cache, copy, symlinks=True)
        report = rayform.Client(endpoint=fproxy.url, token=TOKEN, cache_dir=copy).pull(DEMO_SLICE)
        assert report.blobs == len(expected)
        assert assert_cache_consistent(copy) == expected
        assert list((copy / "tmp").glob("*.part")) == [], "leftovers adopted or cleaned"
        shutil.rmtree(copy)
    return outcomes


def test_sigkilled_pulls_leave_no_partial_blob(fproxy: FaultProxy, tmp_path: Path) -> None:
    outcomes = _kill_pulls(fproxy, tmp_path, kills=12, seed=7)
    assert sum(outcomes.values()) == 12
    assert outcomes["mid-transfer"] >= 6, outcomes


@pytest.mark.stress
def test_sixty_sigkilled_pulls_leave_no_partial_blob(fproxy: FaultProxy, tmp_path: Path) -> None:
    t0 = time.monotonic()
    outcomes = _kill_pulls(fproxy, tmp_path, kills=60, seed=20240601)
    print(f"60 kills in {time.monotonic() - t0:.0f} s: {dict(outcomes)}")
    assert outcomes["mid-transfer"] >= 30, outcomes


# A shuffled DataLoader with two workers: prints how many samples it saw, or exits 3 with the
# loader's error on stderr.
_LOADER = [str(SCRIPTS / "crash_loader.py"), DEMO_SLICE, ACTION, *OBS]


def _kill_workers(fproxy: FaultProxy, tmp_path: Path, kills: int) -> int:
    """SIGKILL a DataLoader worker while it writes a blob; a fresh loader then completes."""
    mid = 0
    for i in range(kills):
        cache = tmp_path / f"cache{i}"
        env = sub_env(RAYFORM_ENDPOINT=fproxy.url, RAYFORM_CACHE_DIR=str(cache))
        fproxy.throttle_s = THROTTLE_S
        proc = subprocess.Popen(
            [sys.executable, *_LOADER],
            env=env,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        try:
            victim = None
            deadline = time.monotonic() + 60
            while victim is None and time.monotonic() < deadline and proc.poll() is None:
                for p in _parts(cache):  # tmp/<hash>.<host>.<pid>.<rand>.part: pid is the writer
                    pid = int(p.name.split(".")[2])
                    if pid != proc.pid:
                        victim = pid
                        break
                time.sleep(0.01)
            assert victim is not None, "no worker started fetching on demand"
            os.kill(victim, signal.SIGKILL)
            mid += 1
            _, err = proc.communicate(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
        assert proc.returncode == 3 and f"{victim}" in err, err
        assert_cache_consistent(cache)
        fproxy.throttle_s = 0.0
        fresh = subprocess.run(
            [sys.executable, *_LOADER], env=env, capture_output=True, text=True, timeout=180
        )
        assert fresh.returncode == 0 and int(fresh.stdout) > 0, fresh.stderr
        cached = assert_cache_consistent(cache)
        wanted = (
            rayform.Client(endpoint=fproxy.url, token=TOKEN, cache_dir=cache)
            .slices.get(DEMO_SLICE)
            .manifest.blobs([*OBS, ACTION])
        )
        assert set(wanted) <= set(cached)
        assert list((cache / "tmp").glob("*.part")) == [], "the killed worker's file was adopted"
    return mid


def test_sigkilled_loader_worker_then_fresh_loader_completes(
    fproxy: FaultProxy, tmp_path: Path
) -> None:
    assert _kill_workers(fproxy, tmp_path, kills=1) == 1


@pytest.mark.stress
def test_many_sigkilled_loader_workers(fproxy: FaultProxy, tmp_path: Path) -> None:
    assert _kill_workers(fproxy, tmp_path, kills=6) == 6
