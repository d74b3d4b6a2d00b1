"""A misbehaving object store or server stub: every case completes or fails clearly, in bounded time.

The stub runs on a real SeaweedFS (``weed mini``); a hung store is emulated with SIGSTOP (the
kernel still accepts connections, nothing ever answers), a dead one with SIGKILL. The client
uses a short stall bound (``stall_timeout``) so these run in seconds; the default is 120 s.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from support import DEMO_SLICE, TOKEN, ServerProcess
from support.faultproxy import Fault, FaultProxy
from support.reliability import assert_cache_consistent, pull_cmd, sub_env
from support.seaweed import BUCKET, SeaweedS3
from torch.utils.data import DataLoader

import rayform
from rayform.errors import TransportError
from rayform.torch import EpisodeDataset

PREFIX = "faults"
STALL_S = 6.0  # the client's bound in these tests
SLACK_S = 4.0  # what a loaded 2-core machine may add


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedS3]:
    s3 = SeaweedS3(tmp_path_factory.mktemp("weed-faults"))
    yield s3
    s3.stop()


@pytest.fixture(scope="module")
def root(store: SeaweedS3, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("faults-root")
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "rayform_server",
            "demo",
            "--root",
            str(root),
            "--small",
            "--jobs",
            "1",
            "--blobs",
            f"s3://{BUCKET}/{PREFIX}",
            "--s3-endpoint",
            store.endpoint,
        ],
        env={**os.environ, **store.env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    return root


@contextmanager
def _stub(root: Path, store: SeaweedS3) -> Iterator[ServerProcess]:
    server = ServerProcess(root, "--store-timeout", "1", env=store.env)
    try:
        yield server
    finally:
        server.stop()


@contextmanager
def _stopped(pid: int, group: bool = True) -> Iterator[None]:
    """SIGSTOP a process (group) for the duration: it keeps its sockets, answers nothing."""
    kill = os.killpg if group else os.kill
    kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        kill(pid, signal.SIGCONT)


def _client(url: str, cache: Path, **kw: object) -> rayform.Client:
    kw.setdefault("stall_timeout", STALL_S)
    kw.setdefault("timeout", 4.0)  # the stub gives up on the store after about 2 x 1 s
    return rayform.Client(endpoint=url, token=TOKEN, cache_dir=cache, **kw)


def _no_secret(text: str) -> None:
    assert TOKEN not in text and "X-Amz-Signature" not in text and "Traceback" not in text, text


def _first_video(client: rayform.Client) -> rayform.manifest.BlobRef:
    return client.slices.get(DEMO_SLICE).segments[0].streams["cam0/rgb"].blob


def test_stalled_store_fails_naming_the_store_behind_the_server(
    root: Path, store: SeaweedS3, tmp_path: Path
) -> None:
    with _stub(root, store) as server:  # a fresh stub: it must ask the store about every blob
        client = _client(server.url, tmp_path / "cache")
        ref = _first_video(client)
        with _stopped(store.procs["mini"].pid):
            t0 = time.monotonic()
            with pytest.raises(TransportError) as info:
                client.ensure_blob(DEMO_SLICE, ref)
            elapsed = time.monotonic() - t0
            env = sub_env(RAYFORM_STALL_TIMEOUT=str(STALL_S))
            t1 = time.monotonic()
            cli = subprocess.run(
                pull_cmd(server.url, tmp_path / "cli-cache"),
                env=env,
                capture_output=True,
                text=True,
                timeout=60,
            )
            cli_elapsed = time.monotonic() - t1
            assert assert_cache_consistent(tmp_path / "cache") == []
        assert client.ensure_blob(DEMO_SLICE, ref).is_file()  # the store is back: so is the data
    message = str(info.value)
    assert f"the object store behind the server at {server.url} did not answer" in message
    assert f"the object store at {store.endpoint.removeprefix('http://')} did not answer" in message
    assert "RAYFORM_ENDPOINT" not in message
    assert elapsed < STALL_S + SLACK_S, elapsed
    assert cli.returncode == 1 and cli.stderr.startswith("rayform: error:"), cli.stderr
    # A pull asks for its blobs' URLs in one request (signing needs no store), then meets the
    # stalled store itself: the message names that store's host.
    host = store.endpoint.removeprefix("http://")
    sent = f"the object store at {host} (where the server at {server.url} sent the download)"
    assert f"{sent} did not answer" in cli.stderr, cli.stderr
    assert cli_elapsed < STALL_S + SLACK_S + 5
    _no_secret(message + cli.stderr)
    assert assert_cache_consistent(tmp_path / "cache") == [ref.hash]


def test_stalled_store_after_redirect_fails_naming_its_host(
    root: Path, store: SeaweedS3, tmp_path: Path
) -> None:
    with _stub(root, store) as server:
        warm = _client(server.url, tmp_path / "warm")
        ref = _first_video(warm)
        warm.ensure_blob(DEMO_SLICE, ref)  # the stub now knows the blob: it redirects at once
        client = _client(server.url, tmp_path / "cache")
        client.slices.get(DEMO_SLICE)
        with _stopped(store.procs["mini"].pid):
            t0 = time.monotonic()
            with pytest.raises(TransportError) as info:
                client.ensure_blob(DEMO_SLICE, ref)
            elapsed = time.monotonic() - t0
    message = str(info.value)
    host = store.endpoint.removeprefix("http://")
    assert (
        f"the object store at {host} (where the server at {server.url} sent the download)"
        in message
    )
    assert "ReadTimeout" in message and "RAYFORM_ENDPOINT" not in message
    assert elapsed < STALL_S + SLACK_S, elapsed
    _no_secret(message)
    assert assert_cache_consistent(tmp_path / "cache") == []
    assert [p for p in (tmp_path / "cache" / "tmp").glob("*.part") if p.stat().st_size] == []


def test_stalled_stub_fails_naming_the_server(root: Path, store: SeaweedS3, tmp_path: Path) -> None:
    with _stub(root, store) as server:
        client = _client(server.url, tmp_path / "cache")
        ref = _first_video(client)
        assert server.proc is not None
        with _stopped(server.proc.pid, group=False):
            t0 = time.monotonic()
            with pytest.raises(
                TransportError,
                match=r"ReadTimeout.*without progress.*"
                r"server .* is reachable \(RAYFORM_ENDPOINT\)",
            ) as info:
                client.ensure_blob(DEMO_SLICE, ref)
            elapsed = time.monotonic() - t0
    assert elapsed < STALL_S + SLACK_S, elapsed
    assert "object store" not in str(info.value)
    _no_secret(str(info.value))


def test_random_busy_answers_are_ridden_through(demo_server: ServerProcess, tmp_path: Path) -> None:
    with FaultProxy(demo_server.url) as proxy:
        proxy.busy_rate = 0.3  # 503 or 429 with Retry-After: 1 to 30 % of requests
        client = _client(proxy.url, tmp_path / "cache", attempts=2)
        report = client.pull(DEMO_SLICE, streams=["cam0/rgb", "joints/position"], jobs=8)
        assert report.fetched_blobs == 12
        ds = EpisodeDataset(
            _client(proxy.url, tmp_path / "stream", attempts=2).slices.get(DEMO_SLICE),
            obs=["ee/pose"],
            action="joints/position_delta",
            fps=15,
            horizon=4,
        )
        n = sum(len(b["t_ns"]) for b in DataLoader(ds, batch_size=16, num_workers=2))
        assert n == len(ds)
        assert proxy.stats.faults["busy"] >= 5  # enough to matter, with only 2 attempts each
    assert len(assert_cache_consistent(tmp_path / "cache")) == 12


def test_connection_reset_mid_blob_while_streaming(
    demo_server: ServerProcess, tmp_path: Path
) -> None:
    with FaultProxy(demo_server.url) as proxy:
        slice_ = _client(proxy.url, tmp_path / "cache").slices.get(DEMO_SLICE)
        proxy.add(Fault("reset", times=3), Fault("truncate", times=1))  # < attempts on any one blob
        ds = EpisodeDataset(
            slice_,
            obs=["cam0/rgb", "joints/position"],
            action="joints/position_delta",
            fps=15,
            horizon=4,
        )
        got = [b["t_ns"] for b in DataLoader(ds, batch_size=16, num_workers=2)]
        assert proxy.pending() == 0
    clean = EpisodeDataset(
        _client(demo_server.url, tmp_path / "cache").slices.get(DEMO_SLICE),
        obs=["cam0/rgb", "joints/position"],
        action="joints/position_delta",
        fps=15,
        horizon=4,
    )
    want = [b["t_ns"] for b in DataLoader(clean, batch_size=16)]
    assert all((a == b).all() for a, b in zip(got, want, strict=True))
    wanted = slice_.manifest.blobs(["cam0/rgb", "joints/position", "joints/position_delta"])
    assert assert_cache_consistent(tmp_path / "cache") == sorted(wanted)  # every blob intact


def test_store_down_fails_naming_it_within_the_bound(
    root: Path, store: SeaweedS3, tmp_path: Path
) -> None:
    """Last in the module: the store is killed for good."""
    with _stub(root, store) as server:
        warm = _client(server.url, tmp_path / "warm")
        slice_ = warm.slices.get(DEMO_SLICE)
        known = slice_.segments[0].streams["cam0/rgb"].blob
        warm.ensure_blob(DEMO_SLICE, known)
        store.kill("mini")
        client = _client(server.url, tmp_path / "cache")
        client.slices.get(DEMO_SLICE)
        unknown = slice_.segments[1].streams["cam0/rgb"].blob
        t0 = time.monotonic()
        with pytest.raises(TransportError) as asked:  # the stub asks the store: refused
            client.ensure_blob(DEMO_SLICE, unknown)
        with pytest.raises(TransportError) as direct:  # the stub redirects: refused
            client.ensure_blob(DEMO_SLICE, known)
        elapsed = time.monotonic() - t0
    host = store.endpoint.removeprefix("http://")
    assert f"the object store behind the server at {server.url} did not answer" in str(asked.value)
    assert f"the object store at {host} (where the server" in str(direct.value)
    assert "ConnectError" in str(direct.value)
    assert "RAYFORM_ENDPOINT" not in str(asked.value) + str(direct.value)
    assert elapsed < 2 * (STALL_S + SLACK_S), elapsed
    _no_secret(str(asked.value) + str(direct.value))
    assert assert_cache_consistent(tmp_path / "cache") == []
