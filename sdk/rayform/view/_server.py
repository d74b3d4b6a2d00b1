"""The viewer's local HTTP server (standard library ``http.server``, one thread per request).

Who may ask: a process on a shared node can reach 127.0.0.1, and a web page can reach it
through DNS rebinding, while this server reads data with the user's token. So every request
must carry the per-run secret of the printed URL (``?key=...``; the first page load turns it
into a cookie), and its ``Host`` header must name an IP address, ``localhost`` or the host the
server was started on (a rebinding attack always names its own domain). What may be asked:
the page's own assets and the JSON/media routes of :class:`~rayform.view._api.ViewAPI`; every
error is a JSON document, never a traceback.
"""

from __future__ import annotations

import contextlib
import hmac
import ipaddress
import json
import re
import secrets
import socket
import sys
import threading
import traceback
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, urlsplit

from rayform.errors import (
    AccessDeniedError,
    ConflictError,
    IntegrityError,
    InvalidArgumentError,
    NotFoundError,
    OfflineError,
    RayformError,
    TransportError,
)
from rayform.view._api import ViewAPI, ViewError, dumps
from rayform.view._frames import frame_jpeg

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from pathlib import Path

__all__ = ["ViewServer"]

_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
}
_CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data: blob:; "
    "media-src 'self'; connect-src 'self'; base-uri 'none'; form-action 'none'; "
    "frame-ancestors 'self'"
)
_CHUNK = 256 * 1024
#: Largest body of a label sent from the page, in bytes.
_MAX_POST = 64 * 1024
_RANGE_RE = re.compile(r"\Abytes=([0-9]*)-([0-9]*)\Z")
#: Byte positions of a ``Range`` past this are taken as this (no file is an exabyte).
_FAR = 10**18


def _position(digits: str) -> int:
    """A byte position of a ``Range`` header, at most :data:`_FAR` (``int()`` of thousands of
    digits raises: an internal error)."""
    digits = digits.lstrip("0") or "0"
    return _FAR if len(digits) > len(str(_FAR)) else min(int(digits), _FAR)


#: RayformError types and the status each is answered with (others: 502).
_STATUS: tuple[tuple[type[RayformError], int], ...] = (
    (ConflictError, 409),
    (InvalidArgumentError, 400),
    (AccessDeniedError, 403),
    (NotFoundError, 404),
    (OfflineError, 503),
    (IntegrityError, 502),
    (TransportError, 502),
)


def _assets() -> dict[str, tuple[bytes, str]]:
    """The page's files (package data), read once: only these names are ever served."""
    out = {}
    for entry in resources.files("rayform.view").joinpath("static").iterdir():
        suffix = "." + entry.name.rpartition(".")[2]
        if entry.is_file() and suffix in _TYPES:
            out[entry.name] = (entry.read_bytes(), _TYPES[suffix])
    return out


class ViewServer(ThreadingHTTPServer):
    """``rayform view``'s server for one slice.

    Args:
        api: what it answers (:class:`~rayform.view._api.ViewAPI` on the slice).
        host: address to listen on (``127.0.0.1``: only this machine).
        port: TCP port; 0 takes a free one.
        quiet: log nothing but server faults to stderr.
    """

    daemon_threads = True
    block_on_close = False

    def __init__(
        self, api: ViewAPI, host: str = "127.0.0.1", port: int = 0, *, quiet: bool = True
    ) -> None:
        self.api = api
        self.secret = secrets.token_urlsafe(24)
        self.host = host
        self.quiet = quiet
        self.assets = _assets()
        if ":" in host:  # an IPv6 address (the class listens on IPv4 by default)
            self.address_family = socket.AF_INET6
        super().__init__((host, port), _Handler)
        self.port = int(self.server_address[1])
        self.cookie = f"rayform_view_{self.port}"
        self._thread: threading.Thread | None = None
        self._conns: set[socket.socket] = set()  # open keep-alive connections, closed by stop
        self._conns_lock = threading.Lock()

    @property
    def url(self) -> str:
        """The page's URL with the secret; whoever has it may read the slice through it."""
        shown = "127.0.0.1" if self.host in ("", "0.0.0.0", "::") else self.host
        if ":" in shown:
            shown = f"[{shown}]"
        return f"http://{shown}:{self.port}/?key={self.secret}"

    def start(self) -> ViewServer:
        """Serve from a daemon thread (notebooks, tests); :meth:`stop` ends it."""
        self._thread = threading.Thread(target=self.serve_forever, name="rayform-view", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving, end open connections (a browser keeps them alive) and close."""
        if self._thread is not None:
            self.shutdown()
            self._thread.join(10)
            self._thread = None
        self.server_close()
        with self._conns_lock:
            conns = list(self._conns)
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)  # its handler thread reads EOF and closes it

    def handle_error(
        self, request: socket.socket | tuple[bytes, socket.socket], client_address: tuple[str, int]
    ) -> None:
        # A browser resets connections it no longer needs (a seek drops a video request).
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)

    def track(self, conn: socket.socket, open_: bool) -> None:
        """Remember (``open_``) or forget a connection a handler serves."""
        with self._conns_lock:
            if open_:
                self._conns.add(conn)
            else:
                self._conns.discard(conn)

    def host_allowed(self, header: str | None) -> bool:
        """Whether a ``Host`` header names this server: an IP address or ``localhost`` (never a
        DNS name a rebinding page could control) or the host it was started on, and its port."""
        if not header:
            return False
        # A port of ASCII digits, at most 5 (int() of thousands of digits raises).
        m = re.fullmatch(r"(\[[0-9a-fA-F:.]+\]|[^:\[\]]+)(?::([0-9]{1,5}))?", header.strip())
        if m is None or int(m.group(2) or 80) != self.port:
            return False
        name = m.group(1).strip("[]").lower()
        if name in ("localhost", self.host.lower()):
            return True
        try:
            ipaddress.ip_address(name)
        except ValueError:
            return False
        return True

    def authorised(self, query: dict[str, str], cookies: str | None) -> tuple[bool, bool]:
        """``(allowed, from the query)``: the request carries the secret, in ``key=`` or in
        this server's cookie."""
        given = query.get("key")
        if given is not None:
            return hmac.compare_digest(given.encode(), self.secret.encode()), True
        for part in (cookies or "").split(";"):
            name, _, value = part.strip().partition("=")
            if name == self.cookie:
                return hmac.compare_digest(value.encode(), self.secret.encode()), False
        return False, False


class _Handler(BaseHTTPRequestHandler):
    server: ViewServer
    protocol_version = "HTTP/1.1"
    # Headers and body go out in two writes: with Nagle's algorithm on, the body of a small
    # answer on a kept-alive connection waits for the browser's delayed ACK (about 40 ms).
    disable_nagle_algorithm = True
    server_version = "rayform-view"
    sys_version = ""

    def setup(self) -> None:
        super().setup()
        self.server.track(self.connection, True)

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            self.server.track(self.connection, False)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 (the base's name)
        if not self.server.quiet:
            super().log_message(format, *args)

    def do_GET(self) -> None:  # noqa: N802 (the base class's name)
        try:
            self._route()
        except (BrokenPipeError, ConnectionResetError):
            pass  # the browser dropped a video request it no longer needs
        except ViewError as exc:
            self._json({"error": str(exc)}, exc.status)
        except RayformError as exc:
            status = next((s for t, s in _STATUS if isinstance(exc, t)), 502)
            self._json({"error": str(exc), "type": type(exc).__name__}, status)
        except Exception:
            print("rayform view: internal error:\n" + traceback.format_exc(), file=sys.stderr)
            self._json(
                {"error": "internal error in rayform view; the terminal has the details"}, 500
            )

    def do_POST(self) -> None:  # noqa: N802 (the base class's name)
        # One write: a label, through the slice's client and its token. Only from this page:
        # the Host check and the key (a SameSite=Strict cookie) as for every request, an
        # Origin naming this server when sent, and a JSON body (a form post from another site
        # cannot set that Content-Type without a preflight this server never answers).
        try:
            self._check_access(dict(parse_qsl(urlsplit(self.path).query)))
            if urlsplit(self.path).path != "/api/label":
                raise ViewError(404, f"no such write {urlsplit(self.path).path[:100]!r}")
            origin = self.headers.get("Origin")
            if origin is not None and origin != f"http://{self.headers.get('Host')}":
                raise ViewError(403, "a label must come from the viewer's own page")
            if not (self.headers.get("Content-Type") or "").startswith("application/json"):
                raise ViewError(415, "send the label as application/json")
            length = self.headers.get("Content-Length") or ""
            if not length.isdigit() or int(length) > _MAX_POST:
                raise ViewError(413, f"a label is a JSON body of at most {_MAX_POST} bytes")
            try:
                body = json.loads(self.rfile.read(int(length)))
            except ValueError as exc:
                raise ViewError(400, f"the body is not JSON: {str(exc)[:100]}") from None
            if not isinstance(body, dict):
                raise ViewError(400, 'send {"segment": ..., "values": {...}}')
            self._json(self.server.api.label(body))
        except ViewError as exc:
            self.close_connection = True  # a refused body may be left unread on the socket
            self._json({"error": str(exc)}, exc.status)
        except RayformError as exc:
            status = next((s for t, s in _STATUS if isinstance(exc, t)), 502)
            self.close_connection = True
            self._json({"error": str(exc), "type": type(exc).__name__}, status)

    def _check_access(self, query: dict[str, str]) -> bool:
        """The Host and key checks of every request; returns whether the key came in the query."""
        if not self.server.host_allowed(self.headers.get("Host")):
            raise ViewError(
                403,
                "the Host header does not name this server (DNS rebinding?); "
                "open the URL that `rayform view` printed",
            )
        allowed, in_query = self.server.authorised(query, self.headers.get("Cookie"))
        if not allowed:
            raise ViewError(
                403,
                "this page needs the secret key of the URL that `rayform view` "
                "printed; open that URL",
            )
        return in_query

    def _route(self) -> None:
        parts = urlsplit(self.path)
        query = dict(parse_qsl(parts.query, keep_blank_values=True))
        if not self.server.host_allowed(self.headers.get("Host")):
            raise ViewError(
                403,
                "the Host header does not name this server (DNS rebinding?); "
                "open the URL that `rayform view` printed",
            )
        allowed, in_query = self.server.authorised(query, self.headers.get("Cookie"))
        if not allowed:
            raise ViewError(
                403,
                "this page needs the secret key of the URL that `rayform view` "
                "printed; open that URL",
            )
        path, api = parts.path, self.server.api
        if path == "/":
            body, ctype = self.server.assets["index.html"]
            cookie = None
            if in_query:  # later requests (scripts, videos) carry it as a cookie
                cookie = (
                    f"{self.server.cookie}={self.server.secret}; HttpOnly; SameSite=Strict; Path=/"
                )
            self._send(200, body, ctype, cookie=cookie)
        elif path.startswith("/static/"):
            asset = self.server.assets.get(path[len("/static/") :])
            if asset is None:
                raise ViewError(404, f"no such file {path[:100]!r}")
            self._send(200, *asset)
        elif path == "/api/slice":
            self._json(api.slice_info())
        elif path == "/api/episodes":
            self._json(api.episodes(query))
        elif path == "/api/episode":
            self._json(api.episode(query))
        elif path == "/api/table":
            self._json(api.table(query))
        elif path == "/api/text":
            self._json(api.text(query))
        elif path == "/api/selection":
            self._json(api.selection(query))
        elif path == "/media":
            self._file(api.video(query).path, "video/mp4")
        elif path == "/frame":
            video, index, rate = api.frame_source(query)
            try:
                self._send(200, frame_jpeg(video, index, rate), "image/jpeg", cache=True)
            except LookupError as exc:
                raise ViewError(404, str(exc)) from exc
        else:
            raise ViewError(404, f"no such page {path[:100]!r}")

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        # The base class's own refusals (unknown method, malformed request line, a line too
        # long) as JSON too, like every other error of this server.
        body = dumps({"error": message or self.responses.get(code, ("error",))[0]})
        self.close_connection = True
        self._headers(code, "application/json", len(body), extra={"Connection": "close"})
        if self.command != "HEAD" and code >= 200 and code not in (204, 304):
            self.wfile.write(body)

    # -- answers ---------------------------------------------------------------------------
    def _headers(
        self,
        status: int,
        ctype: str,
        length: int,
        *,
        cache: bool = False,
        cookie: str | None = None,
        extra: dict[str, str] | None = None,
    ) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(length))
        self.send_header("Content-Security-Policy", _CSP)
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("Referrer-Policy", "no-referrer")  # the URL holds the secret
        # Blobs never change under their name; pages and answers are not kept.
        self.send_header("Cache-Control", "private, max-age=86400" if cache else "no-store")
        if cookie:
            self.send_header("Set-Cookie", cookie)
        for k, v in (extra or {}).items():
            self.send_header(k, v)
        if self.close_connection:  # say so: a client would send its next request on it
            self.send_header("Connection", "close")
        self.end_headers()

    def _send(
        self,
        status: int,
        body: bytes,
        ctype: str,
        *,
        cache: bool = False,
        cookie: str | None = None,
    ) -> None:
        self._headers(status, ctype, len(body), cache=cache, cookie=cookie)
        self.wfile.write(body)

    def _json(self, doc: Mapping[str, Any] | Sequence[Any], status: int = 200) -> None:
        try:
            body = dumps(doc)
        except (TypeError, ValueError):
            body = json.dumps({"error": "answer not JSON-able"}).encode()
            status = 500
        self._send(status, body, "application/json")

    def _file(self, path: Path, ctype: str) -> None:
        """A file, whole or one byte range (``Range: bytes=a-b``), so video can seek."""
        with open(path, "rb") as f:
            size = f.seek(0, 2)
            start, end, status = 0, size - 1, 200
            spec = self.headers.get("Range")
            if spec:
                m = _RANGE_RE.fullmatch(spec.strip())
                if m is None or (not m.group(1) and not m.group(2)):
                    return self._range_refused(size)
                if m.group(1):
                    start = _position(m.group(1))
                    end = min(_position(m.group(2)), size - 1) if m.group(2) else size - 1
                else:  # bytes=-N: the last N bytes
                    start = max(0, size - _position(m.group(2)))
                if start >= size or end < start:
                    return self._range_refused(size)
                status = 206
            extra = {"Accept-Ranges": "bytes"}
            if status == 206:
                extra["Content-Range"] = f"bytes {start}-{end}/{size}"
            self._headers(status, ctype, end - start + 1, cache=True, extra=extra)
            f.seek(start)
            left = end - start + 1
            while left > 0:
                chunk = f.read(min(_CHUNK, left))
                if not chunk:
                    break
                self.wfile.write(chunk)
                left -= len(chunk)
        return None

    def _range_refused(self, size: int) -> None:
        body = dumps({"error": f"unsatisfiable range; the file has {size} bytes"})
        self._headers(
            416, "application/json", len(body), extra={"Content-Range": f"bytes */{size}"}
        )
        self.wfile.write(body)
