"""Matrix row 5: the token never leaks, redirects to another origin drop it, the server refuses
bad requests, cached files cannot be written, and ``rayform cache verify`` catches tampering.

(Server refusals of traversal, limits and scopes live in tests/server/test_server.py; this file adds
the raw-socket cases that file does not try.)
"""

from __future__ import annotations

import logging
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest
from support import DEMO_SLICE, SCRIPTS, TOKEN, ServerProcess
from support.faultproxy import Fault, FaultProxy
from support.reliability import assert_cache_consistent, pull_cmd, sub_env

import rayform
from rayform.errors import RayformError


def test_token_in_no_log_exception_repr_progress_line_or_url(
    demo_server: ServerProcess, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)  # every logger: rayform, httpx, httpcore
    seen: list[str] = []
    with FaultProxy(demo_server.url) as proxy:
        proxy.add(Fault("503", times=2, retry_after_s=0), Fault("reset", times=2))
        client = rayform.Client(endpoint=proxy.url, token=TOKEN, cache_dir=tmp_path / "c")
        slice_ = client.slices.get(DEMO_SLICE)
        client.pull(DEMO_SLICE, jobs=4)
        seen += [
            repr(client),
            repr(slice_),
            repr(client.slices),
            repr(client._transport()),
            slice_._repr_html_() if hasattr(slice_, "_repr_html_") else "",
        ]
        for bad in (
            lambda: client.slices.get("slc_0123abcd"),
            lambda: rayform.Client(
                endpoint=proxy.url, token=TOKEN + "x", cache_dir=tmp_path / "c"
            ).slices.get(DEMO_SLICE),
            lambda: rayform.Client(
                endpoint=proxy.url, token=TOKEN, cache_dir=tmp_path / "c", attempts=1
            ).pull("slc_0123abcd"),
        ):
            with pytest.raises(RayformError) as err:
                bad()
            seen += [str(err.value), repr(err.value)]
        seen += list(proxy.stats.requests)  # every URL the SDK asked for
        cli = subprocess.run(
            pull_cmd(proxy.url, tmp_path / "cli")[:-1],
            env=sub_env(),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert cli.returncode == 0 and "pull slc_7c1e04aa" in cli.stderr  # the progress bar ran
        seen += [cli.stdout, cli.stderr]
        bad_cli = subprocess.run(
            pull_cmd(proxy.url, tmp_path / "cli", slice_id="slc_0123abcd"),
            env=sub_env(),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert bad_cli.returncode == 1
        seen += [bad_cli.stderr]
    assert len(caplog.records) > 10
    seen += [r.getMessage() for r in caplog.records] + [str(r.args) for r in caplog.records]
    leaks = [s for s in seen if TOKEN in s or TOKEN[:12] in s]
    assert not leaks


class _Recorder(BaseHTTPRequestHandler):
    """Origin B (object storage): serves blobs from a store root, records request headers."""

    root: Path
    seen: list[dict[str, str]]

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:  # noqa: N802 - http.server API
        self.seen.append(dict(self.headers.items()))
        digest = self.path.rsplit("/", 1)[-1].split("?")[0]
        body = (self.root / "blobs" / digest[:2] / digest).read_bytes()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


class _Redirector(BaseHTTPRequestHandler):
    """Origin A (the API): answers blob requests with 307 to origin B, forwards the rest."""

    upstream: str
    target: str
    seen: list[dict[str, str]]

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:  # noqa: N802 - http.server API
        self.seen.append(dict(self.headers.items()))
        if "/blobs/" in self.path:
            self.send_response(307)
            self.send_header(
                "Location", f"{self.target}/bucket/{self.path.rsplit('/', 1)[-1]}?X-Sig=abc"
            )
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        r = httpx.get(
            self.upstream + self.path, headers={"Authorization": self.headers["Authorization"]}
        )
        self.send_response(r.status_code)
        self.send_header("Content-Length", str(len(r.content)))
        self.end_headers()
        self.wfile.write(r.content)


def _serve(handler: type[BaseHTTPRequestHandler], host: str = "127.0.0.1") -> ThreadingHTTPServer:
    server = ThreadingHTTPServer((host, 0), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.fixture
def two_origins(demo_server: ServerProcess) -> Iterator[tuple[str, list, list]]:
    seen_a: list[dict[str, str]] = []
    seen_b: list[dict[str, str]] = []
    b = _serve(type("B", (_Recorder,), {"root": demo_server.root, "seen": seen_b}))
    a = _serve(
        type(
            "A",
            (_Redirector,),
            {
                "upstream": demo_server.url,
                "seen": seen_a,
                "target": f"http://localhost:{b.server_address[1]}",
            },
        )
    )
    try:
        yield f"http://127.0.0.1:{a.server_address[1]}", seen_a, seen_b
    finally:
        for s in (a, b):
            s.shutdown()
            s.server_close()


def test_cross_origin_redirect_drops_authorization(
    two_origins: tuple[str, list, list], tmp_path: Path
) -> None:
    url, seen_a, seen_b = two_origins
    client = rayform.Client(endpoint=url, token=TOKEN, cache_dir=tmp_path / "c")
    report = client.pull(DEMO_SLICE, streams=["joints/position"])
    assert report.fetched_blobs == 4 and len(assert_cache_consistent(tmp_path / "c")) == 4
    assert len(seen_b) == 4, "blobs came from the other origin"
    assert all(h.get("Authorization") in (None, "") for h in seen_b)
    assert all(TOKEN not in str(h) for h in seen_b)
    assert all(h.get("Authorization") == f"Bearer {TOKEN}" for h in seen_a)


def _raw(port: int, data: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(data)
        out = b""
        try:
            while chunk := s.recv(65536):
                out += chunk
        except ConnectionResetError:
            pass
    return out


@pytest.mark.parametrize(
    "request_bytes",
    [
        b"GARBAGE\r\n\r\n",
        b"GET /v1/slices HTTP/9.9\r\nHost: x\r\nConnection: close\r\n\r\n",
        b"GET /v1/slices HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 200_000 + b"\r\n\r\n",
        b"GET /v1/slices HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n",
        b"GET /v1/slices?token="
        + TOKEN.encode()
        + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        b"GET /v1/slices HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
        + TOKEN.encode()
        + b"\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\nzz\r\n",
    ],
    ids=[
        "garbage",
        "bad-version",
        "huge-header",
        "negative-length",
        "token-in-query",
        "bad-chunked-body",
    ],
)
def test_server_refuses_malformed_requests(
    demo_server: ServerProcess, request_bytes: bytes
) -> None:
    answer = _raw(demo_server.port, request_bytes)
    status = int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/") else None
    assert status is None or 400 <= status < 500, answer[:200]  # refused, or connection dropped
    assert b'"slices"' not in answer and TOKEN.encode() not in answer
    assert httpx.get(demo_server.url + "/v1/health").status_code == 200  # still serving


def test_cached_files_cannot_be_written_even_by_their_owner(client_env: ServerProcess) -> None:
    top = Path(tempfile.mkdtemp(prefix="rayform-perm-", dir="/tmp"))  # reachable by `nobody`
    try:
        os.chmod(top, 0o755)
        cache = top / "cache"
        rayform.Client(cache_dir=cache).pull(DEMO_SLICE)
        blobs = sorted(p for p in (cache / "blobs").rglob("*") if p.is_file())
        assert len(blobs) == 28 and all(p.stat().st_mode & 0o777 == 0o444 for p in blobs)
        for p in blobs:  # as if `nobody` had pulled them: the owner (root ignores mode bits)
            os.chown(p, 65534, 65534)
        attempt = SCRIPTS / "write_attempt.py"  # as `nobody`: how many opens for writing succeed
        r = subprocess.run(
            [sys.executable, "-I", "-S", str(attempt), *map(str, blobs)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert r.returncode == 0 and r.stdout.strip() == "0", r.stderr + r.stdout
        assert len(assert_cache_consistent(cache)) == 28  # and the bytes are untouched
    finally:
        shutil.rmtree(top)


def test_cache_verify_cli_detects_and_removes_a_tampered_blob(
    client_env: ServerProcess, isolated_env: Path
) -> None:
    client = rayform.Client()
    client.pull(DEMO_SLICE, streams=["joints/position"])
    victim = sorted((isolated_env / "blobs").rglob("*"))[-1]
    os.chmod(victim, 0o644)
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0x01
    victim.write_bytes(bytes(data))
    r = subprocess.run(
        [sys.executable, "-m", "rayform", "cache", "verify", "--json"],
        env={**os.environ},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    assert f'"{victim.name}"' in r.stdout and not victim.exists()
    assert_cache_consistent(isolated_env)
    assert client.pull(DEMO_SLICE, streams=["joints/position"]).fetched_blobs == 1  # healed
