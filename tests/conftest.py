"""Fixtures only: isolated environment and cache for every test, real servers on loopback.

What tests share besides fixtures (the token, the demo slice ID, ``ServerProcess``...) is in the
``support`` package (``tests/support/``); import it from there, never from this file.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from support import DEMO_SLICE, TOKEN, WRITE_TOKEN, ServerProcess
from support.faultproxy import FaultProxy

# Dumps the stacks of a hung test's process and its DataLoader workers before it times out.
pytest_plugins = ["support.hangdump"]

_RAYFORM_ENV = ("RAYFORM_ENDPOINT", "RAYFORM_TOKEN", "RAYFORM_CACHE_DIR", "RAYFORM_OFFLINE")


@pytest.fixture(autouse=True)
def isolated_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test gets its own cache dir, its own state dir (the packet decoder's checks kept
    on disk: a test that breaks a decoder on purpose must not leave its verdict to the next)
    and no RAYFORM_* variables from the outside."""
    for name in _RAYFORM_ENV:
        monkeypatch.delenv(name, raising=False)
    cache = tmp_path / "cache"
    monkeypatch.setenv("RAYFORM_CACHE_DIR", str(cache))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    return cache


@pytest.fixture(scope="session")
def demo_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small demo data root (built once per session): slice DEMO_SLICE."""
    from rayform_server.demo import build_demo

    root = tmp_path_factory.mktemp("demo-root")
    build_demo(root, slice_id=DEMO_SLICE, small=True)
    return root


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
def write_server(demo_root: Path, tmp_path: Path) -> Iterator[ServerProcess]:
    """A private copy of the small demo root, served with the read token TOKEN and the write
    token WRITE_TOKEN (labels and published slices stay in this test)."""
    root = tmp_path / "write-root"
    shutil.copytree(demo_root, root)
    server = ServerProcess(root, "--write-token", WRITE_TOKEN)
    yield server
    server.stop()


@pytest.fixture
def fproxy(demo_server: ServerProcess) -> Iterator[FaultProxy]:
    """A fault-injecting proxy in front of the demo server (see ``support/faultproxy.py``)."""
    with FaultProxy(demo_server.url) as p:
        yield p


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
