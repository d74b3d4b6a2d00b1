"""A recording reverse proxy in front of a real S3 gateway (SeaweedFS), for the S3 tests.

The server stub presigns against the proxy's ``host:port`` (``--s3-endpoint``); the proxy
forwards every request with its headers untouched, ``Host`` included, so SigV4 signatures
still verify upstream. It records what reached "the object store" (method, key, query,
headers), and can slow object bodies down or hold the next presigned GETs back (to let a
signature expire in flight).
"""

from __future__ import annotations

import http.client
import threading
import time
from collections import Counter
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

__all__ = ["S3Proxy", "Seen"]

_HOP = ("connection", "keep-alive", "transfer-encoding", "content-length")


@dataclass(frozen=True)
class Seen:
    """One request that reached the object store through the proxy."""

    method: str
    path: str  # without the query, e.g. /rayform-blobs/demo/ab/abcd...
    query: str
    headers: dict[str, str]  # lower-cased names
    status: int

    @property
    def presigned(self) -> bool:
        return "X-Amz-Signature=" in self.query

    @property
    def key_hash(self) -> str:
        return self.path.rsplit("/", 1)[-1]


class S3Proxy:
    """Forward requests to ``upstream`` unchanged, recording them. Use as a context manager.

    Attributes:
        url: the proxy's base URL (give it to ``--s3-endpoint``).
        seen: every forwarded request, in order.
        delay_s: sleep between 1 KiB chunks of object bodies (GET 200/206).
        hold_s: how long to hold back each of the next ``hold_next`` presigned GETs before
            forwarding them (a signature can expire meanwhile).
    """

    def __init__(self, upstream: str) -> None:
        up = urlsplit(upstream)
        self._up = (up.hostname or "127.0.0.1", up.port or 80)
        self.seen: list[Seen] = []
        self.delay_s = 0.0
        self.hold_s = 0.0
        self.hold_next = 0
        self._lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def do_HEAD(self) -> None:  # noqa: N802 - http.server API
                self._forward()

            def do_GET(self) -> None:  # noqa: N802 - http.server API
                self._forward()

            def _forward(self) -> None:
                path, _, query = self.path.partition("?")
                headers = dict(self.headers.items())
                if self.command == "GET" and "X-Amz-Signature=" in query:
                    with proxy._lock:
                        hold = proxy.hold_s if proxy.hold_next > 0 else 0.0
                        proxy.hold_next -= 1 if hold else 0
                    time.sleep(hold)
                conn = http.client.HTTPConnection(*proxy._up, timeout=30)
                conn.request(self.command, self.path, headers=headers)
                resp = conn.getresponse()
                body = resp.read()
                conn.close()
                with proxy._lock:
                    proxy.seen.append(Seen(self.command, path, query,
                                           {k.lower(): v for k, v in headers.items()}, resp.status))
                self.send_response(resp.status)
                for k, v in resp.getheaders():
                    if k.lower() not in _HOP:
                        self.send_header(k, v)
                length = resp.getheader("content-length") if self.command == "HEAD" else None
                self.send_header("Content-Length", length or str(len(body)))
                self.end_headers()
                if self.command == "HEAD":
                    return
                try:
                    if proxy.delay_s and resp.status in (200, 206):
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

    def __enter__(self) -> S3Proxy:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def mark(self) -> int:
        """Index to pass to :meth:`object_gets` to count only what comes after now."""
        with self._lock:
            return len(self.seen)

    def object_gets(self, since: int = 0) -> Counter[str]:
        """How many presigned GETs each blob hash got (i.e. transfers from the store)."""
        with self._lock:
            return Counter(s.key_hash for s in self.seen[since:] if s.method == "GET" and s.presigned)

    def presigned(self, since: int = 0) -> list[Seen]:
        with self._lock:
            return [s for s in self.seen[since:] if s.presigned]
