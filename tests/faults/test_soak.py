"""Matrix row 6: load and soak. 16 concurrent clients against the server stub for a bounded
time with no errors; 10 epochs of a DataLoader with persistent workers with flat memory."""

from __future__ import annotations

import os
import random
import threading
import time
from pathlib import Path

import httpx
import pytest
from support import DEMO_SLICE, TOKEN, ServerProcess
from support.reliability import assert_cache_consistent
from torch.utils.data import DataLoader

import rayform
from rayform.torch import EpisodeDataset


def _hammer(
    url: str, tmp_path: Path, seconds: float, clients: int = 16
) -> tuple[int, list[BaseException]]:
    """``clients`` threads, each resolving the slice and pulling a random stream into a fresh
    cache, again and again for ``seconds``. Returns (pulls completed, errors)."""
    streams = ["cam0/rgb", "wrist/rgb", "joints/position", "joints/position_delta", "ee/pose"]
    done = [0] * clients
    errors: list[BaseException] = []
    stop = time.monotonic() + seconds

    def worker(i: int) -> None:
        rng = random.Random(i)
        k = 0
        while time.monotonic() < stop and not errors:
            cache = tmp_path / f"c{i}-{k}"
            try:
                client = rayform.Client(endpoint=url, token=TOKEN, cache_dir=cache)
                report = client.pull(DEMO_SLICE, streams=[rng.choice(streams)], jobs=2)
                assert report.fetched_blobs == report.blobs > 0
                assert len(assert_cache_consistent(cache)) == report.blobs
                client.close()
            except BaseException as exc:  # noqa: BLE001 - collected and asserted below
                errors.append(exc)
            done[i] += 1
            k += 1

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(seconds + 120)
    return sum(done), errors


def test_sixteen_concurrent_clients(demo_server: ServerProcess, tmp_path: Path) -> None:
    pulls, errors = _hammer(demo_server.url, tmp_path, seconds=6)
    assert not errors, errors[:3]
    assert pulls >= 16
    assert httpx.get(demo_server.url + "/v1/health").status_code == 200


@pytest.mark.stress
def test_sixteen_concurrent_clients_soak(demo_root: Path, tmp_path: Path) -> None:
    server = ServerProcess(demo_root)
    try:
        pulls, errors = _hammer(server.url, tmp_path, seconds=90)
        print(f"16 clients, 90 s: {pulls} pulls")
        assert not errors, errors[:3]
        assert pulls >= 160
        assert server.proc is not None and server.proc.poll() is None
    finally:
        server.stop()


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError(f"no VmRSS for {pid}")


def _children(pid: int) -> list[int]:
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        out += [int(c) for c in (task / "children").read_text().split()]
    return out


def test_ten_epochs_with_persistent_workers_keep_memory_flat(client_env: ServerProcess) -> None:
    client = rayform.Client()
    obs = ["cam0/rgb", "wrist/rgb", "joints/position"]
    client.pull(DEMO_SLICE, streams=[*obs, "joints/position_delta"])
    ds = EpisodeDataset(
        client.slices.get(DEMO_SLICE), obs=obs, action="joints/position_delta", fps=15, horizon=16
    )
    loader = DataLoader(ds, batch_size=16, num_workers=2, persistent_workers=True, shuffle=True)
    per_epoch: list[int] = []
    before = set(_children(os.getpid()))
    for epoch in range(10):
        ds.set_epoch(epoch)
        assert sum(len(b["t_ns"]) for b in loader) == len(ds)
        workers = sorted(set(_children(os.getpid())) - before)
        assert len(workers) == 2, "persistent workers stay the same two processes"
        per_epoch.append(sum(_rss_kib(w) for w in workers))
    del loader
    # Epoch 0 warms decoders and caches; after that, memory must not keep growing.
    growth_kib = max(per_epoch[2:]) - per_epoch[1]
    assert growth_kib < 24 * 1024, per_epoch
