"""Reverse proxies for tests: loopback HTTP servers that sit in front of a real server.

:class:`ThreadedProxy` holds what they share (a threaded server on 127.0.0.1, forwarding one
request upstream, writing a body slowly so a test can kill a client mid-transfer).
:class:`CountingProxy` sits between the SDK and the server stub: it records every request
(path, ``Range``), can corrupt the bytes of chosen blobs and slow blob transfers down. The S3
tests' recording proxy (``support.s3proxy.S3Proxy``) builds on the same base; the asyncio
fault injector (``support.faultproxy.FaultProxy``) is separate because it must break
connections at the socket level.
"""

from __future__ import annotations

import http.client
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

__all__ = ["CountingProxy", "ProxyHandler", "ThreadedProxy"]

_PASS_HEADERS = (
    "content-type",
    "content-length",
    "content-range",
    "etag",
    "accept-ranges",
    "www-authenticate",
    "retry-after",
    "location",
)


class ProxyHandler(BaseHTTPRequestHandler):
    """Request handler with keep-alive, no access log, and its proxy at ``self.proxy``."""

    protocol_version = "HTTP/1.1"

    @property
    def proxy(self) -> Any:
        return self.server.proxy  # type: ignore[attr-defined]

    def log_message(self, *args: object) -> None:
        pass

    def answer(
        self, status: int, up_headers: list[tuple[str, str]], body: bytes, *, slowly: bool
    ) -> None:
        """Send upstream's answer on: its status, the headers worth passing, its body."""
        self.send_response(status)
        for k, v in up_headers:
            if k.lower() in _PASS_HEADERS:
                self.send_header(k, v)
        self.end_headers()
        self.write_body(body, slowly=slowly)

    def write_body(self, body: bytes, *, slowly: bool) -> None:
        """Write ``body``; with ``slowly``, 1 KiB at a time with ``proxy.delay_s`` between."""
        try:
            if slowly and self.proxy.delay_s:
                for i in range(0, len(body), 1024):
                    self.wfile.write(body[i : i + 1024])
                    self.wfile.flush()
                    time.sleep(self.proxy.delay_s)
            else:
                self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True


class ThreadedProxy:
    """A threaded HTTP server on a free loopback port. Use as a context manager.

    Attributes:
        url: the proxy's base URL.
        delay_s: sleep between 1 KiB chunks of bodies written with ``slowly=True``.
    """

    def __init__(self, upstream: str, handler: type[ProxyHandler]) -> None:
        up = urlsplit(upstream)
        self._up = (up.hostname or "127.0.0.1", up.port or 80)
        self.delay_s = 0.0
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._server.daemon_threads = True
        self._server.proxy = self  # type: ignore[attr-defined]
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def forward(
        self, method: str, target: str, headers: dict[str, str], body: bytes | None = None
    ) -> tuple[int, list[tuple[str, str]], bytes]:
        """Send one request upstream; returns ``(status, headers, body)``."""
        conn = http.client.HTTPConnection(*self._up, timeout=30)
        try:
            conn.request(method, target, body=body, headers=headers)
            resp = conn.getresponse()
            return resp.status, resp.getheaders(), resp.read()
        finally:
            conn.close()

    def __enter__(self) -> Any:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()


class _CountingHandler(ProxyHandler):
    def do_GET(self) -> None:  # noqa: N802 - http.server API
        proxy = self.proxy
        with proxy._lock:
            proxy.requests.append((self.path, self.headers.get("Range")))
        headers = {
            k: v
            for k, v in self.headers.items()
            if k.lower() in ("authorization", "range", "if-none-match")
        }
        status, up_headers, body = proxy.forward("GET", self.path, headers)
        with proxy._lock:
            proxy.answers.append((self.path, status, len(body)))
        blob = "/blobs/" in self.path and status in (200, 206)
        if blob and self.path.rsplit("/", 1)[-1] in proxy.corrupt and body:
            body = bytes([body[0] ^ 0xFF]) + body[1:]
        self.answer(status, up_headers, body, slowly=blob)

    def do_POST(self) -> None:  # noqa: N802 - http.server API
        """Forwarded as it is (the blob-URL batches), not counted."""
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        headers = {
            k: v for k, v in self.headers.items() if k.lower() in ("authorization", "content-type")
        }
        status, up_headers, answer = self.proxy.forward("POST", self.path, headers, body)
        self.answer(status, up_headers, answer, slowly=False)


class CountingProxy(ThreadedProxy):
    """Forward GET requests to ``upstream``, counting them (and POSTs, uncounted).

    Attributes:
        requests: ``(path, range header or None)`` of every request, in order.
        answers: ``(path, status, body bytes)`` of every answer from upstream, in order.
        corrupt: blob hashes whose bytes are served with one byte flipped.
    """

    def __init__(self, upstream: str) -> None:
        super().__init__(upstream, _CountingHandler)
        self.requests: list[tuple[str, str | None]] = []
        self.answers: list[tuple[str, int, int]] = []
        self.corrupt: set[str] = set()

    def blob_gets(self) -> Counter[str]:
        """How many times each blob hash was requested."""
        with self._lock:
            return Counter(p.rsplit("/", 1)[-1] for p, _ in self.requests if "/blobs/" in p)
