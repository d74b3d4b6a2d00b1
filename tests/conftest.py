"""Shared fixtures: isolated environment and cache for every test, real servers on loopback."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

TOKEN = "test-token-3f9c2a7d5e1b"  # long and unique, so leak checks can grep for it

_RAYFORM_ENV = ("RAYFORM_ENDPOINT", "RAYFORM_TOKEN", "RAYFORM_CACHE_DIR", "RAYFORM_OFFLINE")


@pytest.fixture(autouse=True)
def isolated_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test gets its own cache dir and no RAYFORM_* variables from the outside."""
    for name in _RAYFORM_ENV:
        monkeypatch.delenv(name, raising=False)
    cache = tmp_path / "cache"
    monkeypatch.setenv("RAYFORM_CACHE_DIR", str(cache))
    return cache


def forbid_network(monkeypatch: pytest.MonkeyPatch, why: str = "a socket was opened in offline mode") -> None:
    """Make every outgoing socket connection in this process fail the test with ``why``."""

    def no_network(self: socket.socket, *args: object) -> None:
        raise AssertionError(f"{why}: {args}")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    monkeypatch.setattr(socket.socket, "connect_ex", no_network)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    """`rayform-server serve` in a real subprocess on a loopback port."""

    def __init__(self, root: Path, *args: str, token: str | None = TOKEN,
                 env: dict[str, str] | None = None) -> None:
        self.root = root
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [sys.executable, "-m", "rayform_server", "serve", "--root", str(root),
               "--host", "127.0.0.1", "--port", str(self.port), *args]
        if token is not None:
            cmd += ["--token", token]
        self.cmd = cmd
        self.env = {**os.environ, **env} if env else None  # e.g. AWS_* for an S3 blob store
        self.proc: subprocess.Popen[bytes] | None = None
        self.start()

    def start(self) -> None:
        self.proc = subprocess.Popen(self.cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                     env=self.env)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited: {self.proc.stderr.read().decode()}")
            try:
                if httpx.get(self.url + "/v1/health", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                time.sleep(0.05)
        raise RuntimeError("server did not become healthy in 30 s")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc is not None and self.proc.stderr:
            self.proc.stderr.close()


@pytest.fixture(scope="session")
def demo_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small demo data root (built once per session): slice DEMO_SLICE."""
    from rayform_server.demo import build_demo

    root = tmp_path_factory.mktemp("demo-root")
    build_demo(root, slice_id=DEMO_SLICE, small=True)
    return root


DEMO_SLICE = "slc_7c1e04aa"


@pytest.fixture(scope="session")
def demo_server(demo_root: Path) -> Iterator[ServerProcess]:
    """A real server stub serving the small demo root with bearer token TOKEN."""
    server = ServerProcess(demo_root)
    yield server
    server.stop()


@pytest.fixture
def client_env(demo_server: ServerProcess, monkeypatch: pytest.MonkeyPatch) -> ServerProcess:
    """RAYFORM_ENDPOINT/RAYFORM_TOKEN pointing at the demo server."""
    monkeypatch.setenv("RAYFORM_ENDPOINT", demo_server.url)
    monkeypatch.setenv("RAYFORM_TOKEN", TOKEN)
    return demo_server


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Callable[[str], Path]]:
    """``tmpfs("size=2m,ro")`` mounts a small tmpfs (read-only or nearly full caches; we run
    as root, so permission bits alone cannot make a directory unwritable). Unmounted after."""
    mounts: list[Path] = []

    def mount(options: str) -> Path:
        point = tmp_path / f"mnt{len(mounts)}"
        point.mkdir()
        subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(point)], check=True)
        mounts.append(point)
        return point

    try:
        yield mount
    finally:
        for point in reversed(mounts):
            subprocess.run(["umount", "-l", str(point)], check=False)


os.environ.setdefault("OMP_NUM_THREADS", "1")
