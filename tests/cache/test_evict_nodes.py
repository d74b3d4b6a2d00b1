"""Two nodes train on one bounded cache and evict each other's blobs: no run ever stops.

Each node is its own sshfs mount of one directory (``support/sshnodes.py``): ``flock`` pins
do not cross the mounts, and each mount shows a removed file's cached attributes for 20 s.
Both nodes train online at once (``support/scripts/node_train.py``: real DataLoader workers,
shuffled by episode, each node its own seed) under ``RAYFORM_CACHE_LIMIT`` at 25 % of what
they read, so each node's fetches evict blobs the other reads. Before pins crossed nodes and
readers fetched a vanished blob again, 3 runs of 4 lost a worker to a false
``IntegrityError``, a raw ``FileNotFoundError`` or a ``CacheError`` on a cache that verified
clean. Every epoch of every node must see exactly the samples of an unbounded local run, and
the cache must verify. The many-rounds run is ``stress``-marked.

Skipped, with the reason, without root, ``/dev/fuse``, sshfs or sshd (``scripts/setup.sh``).
"""

from __future__ import annotations

import os
import shutil
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
from support.sshnodes import SshNodes, missing

import rayform
from rayform.cache import pinned
from rayform.cache._live import STALE_S

CHECKOUT = Path(__file__).resolve().parents[2]
EPISODES = 12
TRAIN = SCRIPTS / "node_train.py"
STREAMS = ["cam0/rgb", "wrist/rgb", "joints/position", "joints/position_delta"]

pytestmark = pytest.mark.skipif(missing() is not None, reason=f"two sshfs nodes: {missing()}")


@pytest.fixture(scope="module")
def nodes() -> Iterator[SshNodes]:
    with SshNodes() as n:
        yield n


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    from rayform_server.demo import build_demo

    root = tmp_path_factory.mktemp("demo-evict")
    build_demo(root, slice_id=DEMO_SLICE, small=True, episodes=EPISODES)
    server = ServerProcess(root)
    yield server
    server.stop()


def _env(cache: Path, limit: int | None) -> dict[str, str]:
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": "/tmp",
        "PYTHONPATH": os.pathsep.join(str(CHECKOUT / d) for d in ("sdk", "server_stub", "tests")),
        "RAYFORM_CACHE_DIR": str(cache),
        "RAYFORM_TOKEN": TOKEN,
        "OMP_NUM_THREADS": "1",
    }
    if limit is not None:
        env["RAYFORM_CACHE_LIMIT"] = str(limit)
    return env


def _cmd(url: str, epochs: int, seed: int) -> list[str]:
    return [sys.executable, str(TRAIN), url, DEMO_SLICE, str(epochs), "2", str(seed)]


@pytest.fixture(scope="module")
def reference(server: ServerProcess, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The digest of one epoch's samples, unbounded, on a local disk."""
    cache = tmp_path_factory.mktemp("evict-reference")
    done = subprocess.run(
        _cmd(server.url, 1, 0),
        env={**sub_env(), **_env(cache, None)},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.split()[0]


def _sizes(server: ServerProcess, tmp: Path) -> tuple[int, int]:
    """The limit at 25 % of what the jobs read, and their largest blob (bytes)."""
    client = rayform.Client(endpoint=server.url, token=TOKEN, cache_dir=tmp)
    refs = client.slices.get(DEMO_SLICE).manifest.blobs(STREAMS)
    return sum(r.size for r in refs.values()) // 4, max(r.size for r in refs.values())


def _limit(server: ServerProcess, tmp: Path) -> int:
    return _sizes(server, tmp)[0]


def _train_on_both(
    nodes: SshNodes, server: ServerProcess, reference: str, limit: int, epochs: int, round_: int
) -> int:
    """One round: both nodes train ``epochs`` epochs at once on a fresh shared cache.
    Returns how many blobs the nodes fetched again after losing them mid-read."""
    cache = nodes.export / "cache"
    if cache.exists():
        shutil.rmtree(cache)
    a, b = nodes.mount(f"evict{round_}-a"), nodes.mount(f"evict{round_}-b")
    procs = [
        nodes.run_on(
            node,
            _cmd(server.url, epochs, seed=10 * round_ + i),
            env=_env(mount / "cache", limit),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for i, (node, mount) in enumerate([("node-a", a), ("node-b", b)])
    ]
    outs = [p.communicate(timeout=900) for p in procs]
    for p, (out, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err[-8000:]
        assert "Error" not in err, err[-4000:]  # no error, not even one a worker survived
        assert out.split() == [reference] * epochs, "a node saw other samples under eviction"
    assert_cache_consistent(cache)
    return sum(err.count("vanished or changed while being read") for _, err in outs)


def test_two_nodes_training_on_one_bounded_cache_never_fail(
    nodes: SshNodes, server: ServerProcess, reference: str, tmp_path: Path
) -> None:
    limit, largest = _sizes(server, tmp_path)
    # Two nodes, two DataLoader workers each: the blobs just fetched and not yet counted are
    # at most one per fetching thread (the bound, docs/cache.md).
    with Sampler(nodes.export / "cache", limit, 2 * 2 * FETCH_THREADS * largest) as sizes:
        refetched = _train_on_both(nodes, server, reference, limit, 2, 0)
    print(f"\ntwo nodes, 2 epochs each at a 25 % limit: {refetched} blobs fetched again mid-read")
    print(f"cache size against the limit: {sizes.summary()}")
    assert len(sizes.samples) > 20
    assert sizes.over() == [], f"above the stated bound: {sizes.over()[:5]}"
    assert blob_bytes(nodes.export / "cache") <= sizes.bound(0)


@pytest.mark.stress
def test_two_nodes_training_on_one_bounded_cache_many_rounds(
    nodes: SshNodes, server: ServerProcess, reference: str, tmp_path: Path
) -> None:
    limit = _limit(server, tmp_path)
    refetched = [_train_on_both(nodes, server, reference, limit, 3, r + 1) for r in range(6)]
    print(f"\n6 rounds x two nodes x 3 epochs at a 25 % limit: blobs fetched again {refetched}")


def test_a_reader_killed_on_one_node_stops_pinning_on_the_other(
    nodes: SshNodes, server: ServerProcess, reference: str, tmp_path: Path
) -> None:
    limit, largest = _sizes(server, tmp_path)
    cache = nodes.export / "cache"
    if cache.exists():
        shutil.rmtree(cache)
    a, b = nodes.mount("kill-a"), nodes.mount("kill-b")
    victim = nodes.run_on(
        "node-b",
        _cmd(server.url, 50, seed=7),
        env=_env(b / "cache", limit),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,  # its DataLoader workers get the SIGKILL too
    )
    try:
        deadline = time.monotonic() + 120
        while pinned(cache).readers < 1:
            assert victim.poll() is None, victim.communicate()[1][-4000:]
            assert time.monotonic() < deadline, "node-b's reader pinned nothing in 120 s"
            time.sleep(0.1)
    finally:
        os.killpg(victim.pid, signal.SIGKILL)
        victim.communicate(timeout=60)
    killed_at = time.monotonic()
    # Another host's pins count while its heartbeat goes on: seconds after the kill, none.
    while pinned(cache).readers:
        assert time.monotonic() - killed_at < STALE_S + 20, f"still pinned: {pinned(cache)}"
        time.sleep(0.2)
    print(
        f"\nnode-b's reader SIGKILLed: its pins stopped counting after "
        f"{time.monotonic() - killed_at:.1f} s"
    )
    # node-a then trains under the limit within the bound, evicting what node-b left.
    with Sampler(cache, limit, 2 * FETCH_THREADS * largest) as sizes:
        job = nodes.run_on(
            "node-a",
            _cmd(server.url, 1, seed=8),
            env=_env(a / "cache", limit),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        out, err = job.communicate(timeout=600)
    assert job.returncode == 0, err[-4000:]
    assert out.split() == [reference]
    print(f"node-a after the kill: {sizes.summary()}")
    assert sizes.over() == [], f"above the stated bound: {sizes.over()[:5]}"
    assert blob_bytes(cache) <= sizes.bound(0)
    assert_cache_consistent(cache)
