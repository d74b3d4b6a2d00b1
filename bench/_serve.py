"""``rayform-server serve`` on loopback for a benchmark, the one way every bench module starts it."""

from __future__ import annotations

import contextlib
import os
import secrets
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

__all__ = ["serving"]


@contextlib.contextmanager
def serving(
    root: Path,
    token: str | None = None,
    server_dir: str | None = None,
    write_token: str | None = None,
) -> Iterator[tuple[str, str]]:
    """``(url, token)`` of ``rayform-server serve`` on ``root`` (a random token unless given),
    ready to answer, until exit; a server that dies or is not up within 30 s is an error.
    ``server_dir``: serve with the ``rayform_server`` package found there (another commit's
    ``server_stub``) instead of the installed one. ``write_token``: a token that may also
    write labels and slices."""
    token = token or secrets.token_hex(16)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    cmd = [sys.executable, "-m", "rayform_server", "serve", "--root", str(root)]
    cmd += ["--host", "127.0.0.1", "--port", str(port), "--token", token]
    if write_token is not None:
        cmd += ["--write-token", write_token]
    env = dict(os.environ)
    if server_dir is not None:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (server_dir, env.get("PYTHONPATH")) if p)
    server = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(url + "/v1/health", timeout=1).status_code == 200:
                    break
            if server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"rayform-server did not start on {url}")
            time.sleep(0.1)
        yield url, token
    finally:
        server.terminate()
        server.wait(timeout=30)
