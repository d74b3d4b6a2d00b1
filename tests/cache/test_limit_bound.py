"""The cache limit's stated bound holds at every sample while jobs train on one node.

Two training jobs (real DataLoader workers, shuffled by episode, each its own seed) share one
cache on a local disk under ``RAYFORM_CACHE_LIMIT`` at 25 % of what they read, while this test
samples the bytes of the cache's blobs: never above ``max(limit, pinned) + threads x largest
blob`` (docs/cache.md). Then a reader is killed with SIGKILL while it pins blobs: its pins stop
counting at once on its own node (its PID is gone), and a prune gets the cache under the limit.
The same on two sshfs nodes is in ``test_evict_nodes.py``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import DEMO_SLICE, SCRIPTS, TOKEN, ServerProcess
from support.cachesize import FETCH_THREADS, Sampler, blob_bytes
from support.reliability import assert_cache_consistent, sub_env

import rayform
from rayform.cache import Cache, pinned

EPISODES = 12
TRAIN = SCRIPTS / "node_train.py"
STREAMS = ["cam0/rgb", "wrist/rgb", "joints/position", "joints/position_delta"]
WORKERS = 2


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    from rayform_server.demo import build_demo

    root = tmp_path_factory.mktemp("demo-bound")
    build_demo(root, slice_id=DEMO_SLICE, small=True, episodes=EPISODES)
    server = ServerProcess(root)
    yield server
    server.stop()


def _sizes(server: ServerProcess, tmp: Path) -> tuple[int, int]:
    client = rayform.Client(endpoint=server.url, token=TOKEN, cache_dir=tmp)
    refs = client.slices.get(DEMO_SLICE).manifest.blobs(STREAMS)
    return sum(r.size for r in refs.values()) // 4, max(r.size for r in refs.values())


def _job(url: str, cache: Path, limit: int, epochs: int, seed: int) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(TRAIN), url, DEMO_SLICE, str(epochs), str(WORKERS), str(seed)],
        env=sub_env(RAYFORM_CACHE_DIR=str(cache), RAYFORM_CACHE_LIMIT=str(limit)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its workers too get the SIGKILL of the group
    )


def test_two_jobs_on_one_node_stay_within_the_bound(server: ServerProcess, tmp_path: Path) -> None:
    limit, largest = _sizes(server, tmp_path / "probe")
    cache = tmp_path / "cache"
    with Sampler(cache, limit, 2 * WORKERS * FETCH_THREADS * largest) as sizes:
        jobs = [_job(server.url, cache, limit, 2, seed) for seed in (1, 2)]
        outs = [j.communicate(timeout=600) for j in jobs]
    for j, (out, err) in zip(jobs, outs, strict=True):
        assert j.returncode == 0, err[-4000:]
        assert "Error" not in err, err[-4000:]
        digests = out.split()
        assert len(digests) == 2 and digests[0] == digests[1]  # every epoch the same samples
    assert outs[0][0].split() == outs[1][0].split()
    print(f"\none node, two jobs at a 25 % limit: {sizes.summary()}")
    assert len(sizes.samples) > 20
    assert sizes.over() == [], f"above the stated bound: {sizes.over()[:5]}"
    assert blob_bytes(cache) <= sizes.bound(0)
    assert_cache_consistent(cache)


def test_a_killed_readers_pins_stop_counting_and_the_cache_gets_under(
    server: ServerProcess, tmp_path: Path
) -> None:
    limit, _ = _sizes(server, tmp_path / "probe")
    cache = tmp_path / "cache"
    job = _job(server.url, cache, limit, 50, 3)
    try:
        deadline = time.monotonic() + 120
        while pinned(cache).readers < 1:
            assert job.poll() is None, job.communicate()[1][-4000:]
            assert time.monotonic() < deadline, "the reader pinned nothing in 120 s"
            time.sleep(0.05)
        assert pinned(cache).hashes
        # What `rayform cache du` says of it: the limit, and what a live reader pins.
        du = subprocess.run(
            [sys.executable, "-m", "rayform", "cache", "du", "--json", "--limit", str(limit)],
            env=sub_env(RAYFORM_CACHE_DIR=str(cache)),
            capture_output=True,
            text=True,
            check=True,
        )
        report = json.loads(du.stdout)
        assert report["limit"] == limit
        assert report["readers"] >= 1 and report["processes"] >= 1
        assert 0 < report["pinned_bytes"] <= report["blob_bytes"]
        assert report["pinned_blobs"] >= 1
    finally:
        os.killpg(job.pid, signal.SIGKILL)
        job.communicate(timeout=60)
    # Its workers die with it (one process group); their PIDs are gone on this node at once.
    deadline = time.monotonic() + 30
    while pinned(cache).readers:
        assert time.monotonic() < deadline, f"pins of a killed reader still count: {pinned(cache)}"
        time.sleep(0.1)
    assert not list((cache / "pins").iterdir())  # removed on the way, by whoever saw them dead
    Cache(cache).prune(limit)
    assert blob_bytes(cache) <= limit
    assert_cache_consistent(cache)
