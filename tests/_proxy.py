"""A tiny counting reverse proxy for tests: sits between the SDK and a real server stub.

It records every request (path, ``Range`` header, bytes sent), can corrupt the bytes of chosen
blobs, and can slow blob transfers down so that a test can kill a puller mid-transfer.
"""

from __future__ import annotations

import http.client
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

__all__ = ["CountingProxy"]

_PASS_HEADERS = ("content-type", "content-length", "content-range", "etag", "accept-ranges",
                 "www-authenticate", "retry-after", "location")


class CountingProxy:
    """Forward GET requests to ``upstream``, counting them. Use as a context manager.

    Attributes:
        url: the proxy's base URL.
        requests: ``(path, range header or None)`` of every request, in order.
        corrupt: blob hashes whose bytes are served with one byte flipped.
        delay_s: sleep between 1 KiB chunks of blob bodies (slows transfers down).
    """

    def __init__(self, upstream: str) -> None:
        up = urlsplit(upstream)
        self._up_host, self._up_port = up.hostname or "127.0.0.1", up.port or 80
        self.requests: list[tuple[str, str | None]] = []
        self.corrupt: set[str] = set()
        self.delay_s = 0.0
        self._lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:  # noqa: N802 - http.server API
                with proxy._lock:
                    proxy.requests.append((self.path, self.headers.get("Range")))
                conn = http.client.HTTPConnection(proxy._up_host, proxy._up_port, timeout=30)
                headers = {k: v for k, v in self.headers.items()
                           if k.lower() in ("authorization", "range")}
                conn.request("GET", self.path, headers=headers)
                resp = conn.getresponse()
                body = resp.read()
                conn.close()
                blob = "/blobs/" in self.path and resp.status in (200, 206)
                digest = self.path.rsplit("/", 1)[-1]
                if blob and digest in proxy.corrupt and body:
                    body = bytes([body[0] ^ 0xFF]) + body[1:]
                self.send_response(resp.status)
                for k, v in resp.getheaders():
                    if k.lower() in _PASS_HEADERS:
                        self.send_header(k, v)
                self.end_headers()
                try:
                    if blob and proxy.delay_s:
                        for i in range(0, len(body), 1024):
                            self.wfile.write(body[i:i + 1024])
                            self.wfile.flush()
                            time.sleep(proxy.delay_s)
                    else:
                        self.wfile.write(body)
                except (BrokenPipeError, ConnectionResetError):
                    self.close_connection = True

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> CountingProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def blob_gets(self) -> Counter[str]:
        """How many times each blob hash was requested."""
        with self._lock:
            return Counter(p.rsplit("/", 1)[-1] for p, _ in self.requests if "/blobs/" in p)
