"""What the tests share besides fixtures: the demo slice, the token, a real server process,
free ports, a network ban and a client factory. Import it explicitly
(``from support import ServerProcess``); ``conftest.py`` holds only fixtures. The package's
modules hold the rest (fake servers, proxies, recordings, docs runners), and
``support/scripts/`` the programs that tests run in subprocesses."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

import rayform

__all__ = [
    "DEMO_SLICE",
    "SCRIPTS",
    "TOKEN",
    "WRITE_TOKEN",
    "ServerProcess",
    "forbid_network",
    "free_port",
    "make_client",
    "torchrun",
]

TOKEN = "test-token-3f9c2a7d5e1b"  # long and unique, so leak checks can grep for it
#: A token that may also write (labels, new slices), for servers started with --write-token.
WRITE_TOKEN = "write-token-8a7b6c5d4e3f"
#: The slice the session's small demo root holds (the ``demo_root`` fixture).
DEMO_SLICE = "slc_7c1e04aa"


def forbid_network(
    monkeypatch: pytest.MonkeyPatch, why: str = "a socket was opened in offline mode"
) -> None:
    """Make every outgoing socket connection in this process fail the test with ``why``."""

    def no_network(self: socket.socket, *args: object) -> None:
        raise AssertionError(f"{why}: {args}")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    monkeypatch.setattr(socket.socket, "connect_ex", no_network)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def make_client(url: str, cache: Path, **kw: object) -> rayform.Client:
    """A client of the server at ``url`` with the test token and its own cache directory."""
    return rayform.Client(endpoint=url, token=TOKEN, cache_dir=cache, **kw)


class ServerProcess:
    """`rayform-server serve` in a real subprocess on a loopback port."""

    def __init__(
        self, root: Path, *args: str, token: str | None = TOKEN, env: dict[str, str] | None = None
    ) -> None:
        self.root = root
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [
            sys.executable,
            "-m",
            "rayform_server",
            "serve",
            "--root",
            str(root),
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            *args,
        ]
        if token is not None:
            cmd += ["--token", token]
        self.cmd = cmd
        self.env = {**os.environ, **env} if env else None  # e.g. AWS_* for an S3 blob store
        self.proc: subprocess.Popen[bytes] | None = None
        self.start()

    def start(self) -> None:
        self.proc = subprocess.Popen(
            self.cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=self.env
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                err = self.proc.stderr.read().decode() if self.proc.stderr else ""
                raise RuntimeError(f"server exited: {err}")
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


TESTS = Path(__file__).resolve().parents[1]
#: Programs that tests run in subprocesses: ``[sys.executable, str(SCRIPTS / "name.py"), ...]``.
SCRIPTS = TESTS / "support" / "scripts"


def torchrun(
    world: int,
    script: str | Path,
    *args: str,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
    timeout: float = 240,
) -> None:
    """Run ``script`` under ``torch.distributed.run`` with ``world`` local ranks (gloo on
    loopback); fails the test with the ranks' stderr if any rank fails.

    The checkout's ``tests``, ``sdk`` and ``server_stub`` come first on ``PYTHONPATH`` so the
    ranks run the code under test, whatever is installed.
    """
    path = [str(TESTS), str(TESTS.parent / "sdk"), str(TESTS.parent / "server_stub")]
    full = {**os.environ, **(env or {}), "OMP_NUM_THREADS": "1"}
    full["PYTHONPATH"] = os.pathsep.join(
        [*path, *(env or {}).get("PYTHONPATH", "").split(os.pathsep)]
    ).rstrip(os.pathsep)
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nproc_per_node={world}",
        "--nnodes=1",
        f"--master_port={free_port()}",
        str(script),
        *args,
    ]
    done = subprocess.run(cmd, cwd=cwd, env=full, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stderr[-4000:]
