"""A recording reverse proxy in front of a real S3 gateway (SeaweedFS), for the S3 tests.

The server stub presigns against the proxy's ``host:port`` (``--s3-endpoint``); the proxy
forwards every request with its headers untouched, ``Host`` included, so SigV4 signatures
still verify upstream. It records what reached "the object store" (method, key, query,
headers), and can slow object bodies down or hold the next presigned GETs back (to let a
signature expire in flight).
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass

from support.proxy import ProxyHandler, ThreadedProxy

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


class _S3Handler(ProxyHandler):
    def do_HEAD(self) -> None:  # noqa: N802 - http.server API
        self._forward()

    def do_GET(self) -> None:  # noqa: N802 - http.server API
        self._forward()

    def _forward(self) -> None:
        proxy = self.proxy
        path, _, query = self.path.partition("?")
        headers = dict(self.headers.items())
        if self.command == "GET" and "X-Amz-Signature=" in query:
            with proxy._lock:
                hold = proxy.hold_s if proxy.hold_next > 0 else 0.0
                proxy.hold_next -= 1 if hold else 0
            time.sleep(hold)
        status, up_headers, body = proxy.forward(self.command, self.path, headers)
        with proxy._lock:
            proxy.seen.append(
                Seen(self.command, path, query, {k.lower(): v for k, v in headers.items()}, status)
            )
        self.send_response(status)
        length = None
        for k, v in up_headers:
            if k.lower() == "content-length":
                length = v
            elif k.lower() not in _HOP:
                self.send_header(k, v)
        self.send_header(
            "Content-Length", (length if self.command == "HEAD" else None) or str(len(body))
        )
        self.end_headers()
        if self.command != "HEAD":
            self.write_body(body, slowly=status in (200, 206))


class S3Proxy(ThreadedProxy):
    """Forward requests to ``upstream`` unchanged, recording them. Use as a context manager.

    Attributes:
        url: the proxy's base URL (give it to ``--s3-endpoint``).
        seen: every forwarded request, in order.
        delay_s: sleep between 1 KiB chunks of object bodies (GET 200/206).
        hold_s: how long to hold back each of the next ``hold_next`` presigned GETs before
            forwarding them (a signature can expire meanwhile).
    """

    def __init__(self, upstream: str) -> None:
        super().__init__(upstream, _S3Handler)
        self.seen: list[Seen] = []
        self.hold_s = 0.0
        self.hold_next = 0

    def mark(self) -> int:
        """Index to pass to :meth:`object_gets` to count only what comes after now."""
        with self._lock:
            return len(self.seen)

    def object_gets(self, since: int = 0) -> Counter[str]:
        """How many presigned GETs each blob hash got (i.e. transfers from the store)."""
        with self._lock:
            return Counter(
                s.key_hash for s in self.seen[since:] if s.method == "GET" and s.presigned
            )

    def presigned(self, since: int = 0) -> list[Seen]:
        with self._lock:
            return [s for s in self.seen[since:] if s.presigned]
