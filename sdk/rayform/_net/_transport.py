"""The thin HTTP layer: connection reuse, retries, typed errors, resumable blob downloads.

Retries live here and nowhere else (the policy is in :mod:`rayform._net._retry`): connection errors,
timeouts, ``5xx`` and ``429`` are retried with exponential backoff and jitter (honouring
``Retry-After``), within a bound on the time without progress; ``4xx`` answers never are.
Redirects are followed by hand: the same origin keeps the ``Authorization`` header, any other
origin (an object store's presigned URL) never receives it; an expired presigned URL (``403``
from the other origin) makes us ask the stub again for a fresh one.

Metadata (slice references, manifests, pages, error bodies) is read as raw bytes, streaming,
up to a cap (the size the protocol declares, or a small fixed one), within the stall bound as a
whole (a status line, headers and body trickled byte by byte end there:
:mod:`rayform._net._deadline`), and never decompressed: a body with a ``Content-Encoding``
other than ``identity`` is refused (:class:`~rayform.errors.ProtocolError`).

The ``httpx.Client`` is created lazily, per process (a :class:`~rayform._process.PerProcess`):
a ``Transport`` pickled into a DataLoader worker or inherited through ``fork`` opens its own
connections on first use.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import httpx

from rayform._net._deadline import hold, reads_end_by, trace
from rayform._net._pace import Pace
from rayform._net._retry import (
    RetryableError,
    RetryPolicy,
    Side,
    Watch,
    check_first,
    run_with_retries,
)
from rayform._process import PerProcess
from rayform._seams import DownloadSink, ProgressCallback
from rayform._untrusted import loads, shown
from rayform.errors import (
    AccessDeniedError,
    ConflictError,
    IntegrityError,
    InvalidArgumentError,
    NotFoundError,
    ProtocolError,
    TransportError,
)

__all__ = ["ERROR_BODY_CAP", "JSON_CAP", "Transport"]

T = TypeVar("T")

log = logging.getLogger("rayform.transport")


_SIGNED_QUERY_RE = re.compile(r"([?&](?:[A-Za-z0-9-]*signature|sig)=)[^&'\"\s]+", re.IGNORECASE)


class _RedactSignedUrls(logging.Filter):
    """Hide the signature of presigned URLs in httpx's and httpcore's log lines.

    httpx logs every request URL at INFO; httpcore logs response headers (``Location``) at
    DEBUG. A presigned URL's signature is a credential until it expires.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a malformed record is not ours to fix
            return True
        if _SIGNED_QUERY_RE.search(message):
            record.msg, record.args = _SIGNED_QUERY_RE.sub(r"\1<hidden>", message), ()
        return True


_REDACT = _RedactSignedUrls()
for _name in (
    "httpx",
    "httpcore.http11",
    "httpcore.http2",
    "httpcore.connection",
    "httpcore.proxy",
):
    logging.getLogger(_name).addFilter(_REDACT)

_MAX_REDIRECTS = 5
_MAX_URL_REFRESHES = 2
_MAX_RETRY_AFTER_S = 60.0

#: Bytes read of a JSON answer (a slice reference or listing) unless the caller says otherwise.
JSON_CAP = 4 * 2**20
#: Bytes read of an error body: its message is shown capped anyway.
ERROR_BODY_CAP = 64 * 2**10
#: Characters of a server's error message shown in an error.
_MESSAGE_CHARS = 500


#: The ``error`` code of a server ``503`` that means its object store did not answer.
STORE_UNAVAILABLE = "store_unavailable"


def _origin(url: httpx.URL) -> tuple[str, str, int | None]:
    port = url.port or {"http": 80, "https": 443}.get(url.scheme)
    return url.scheme, url.host, port


def _retry_after(resp: httpx.Response) -> float | None:
    value = resp.headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(0.0, min(float(value), _MAX_RETRY_AFTER_S))
    except ValueError:
        return None  # HTTP-date form: fall back to our own backoff


def _declared_size(resp: httpx.Response) -> int | None:
    """The blob's full size in bytes as the server declares it (Content-Range or -Length)."""
    if resp.status_code == 206:
        value = resp.headers.get("content-range", "").rpartition("/")[2]
    else:
        value = resp.headers.get("content-length", "")
    # ASCII digits only ("²".isdigit() is true) and at most 18 of them (int64, digit limit).
    return int(value) if re.fullmatch(r"[0-9]{1,18}", value) else None


def _server_error(resp: httpx.Response, deadline: float | None = None) -> tuple[str, str]:
    """``(error code, message)`` of a JSON error body, or empty strings; both safe to show.

    At most :data:`ERROR_BODY_CAP` bytes are read, and nothing after ``deadline``.
    """
    try:
        body = _read_capped(resp, ERROR_BODY_CAP, deadline)
        doc = loads(body)
        code = str(doc.get("error") or "")
        message = str(doc.get("message") or doc.get("error") or "").strip()
        return shown(code, 64), shown(message, _MESSAGE_CHARS)
    except Exception:
        return "", ""


def _read_capped(resp: httpx.Response, cap: int, deadline: float | None) -> bytes:
    """Up to ``cap`` raw bytes of the body (what is beyond, or arrives after ``deadline``, is
    left unread: the connection is then closed rather than reused)."""
    out = bytearray()
    hold(resp.extensions.get("network_stream"))
    with contextlib.nullcontext() if deadline is None else reads_end_by(deadline):
        for chunk in _raw(resp):
            out += chunk
            if len(out) >= cap or (deadline is not None and time.monotonic() > deadline):
                break
    return bytes(out[:cap])


def _raw(resp: httpx.Response) -> Iterator[bytes]:
    """The body's bytes as they came (a response built in memory, as a mock transport's, holds
    them already)."""
    if resp.is_stream_consumed:
        yield resp.content
    else:
        yield from resp.iter_raw()


def _check_encoding(resp: httpx.Response, what: str, server: str) -> None:
    """Refuse a compressed body: httpx would decode it whatever we asked for, and a small
    compressed body can expand to gigabytes."""
    encoding = resp.headers.get("content-encoding", "identity").strip().lower()
    if encoding not in ("", "identity"):
        raise ProtocolError(
            f"{what}: {server} answered with Content-Encoding {shown(encoding, 40)!r} although "
            "the client asks for 'identity'; nothing was read. A proxy in between may be "
            "compressing answers: configure it to pass them through unchanged."
        )


def _host(url: httpx.URL) -> str:
    """``host:port`` of a URL: what errors may show of an object store's presigned URL."""
    port = _origin(url)[2]
    return f"{url.host}:{port}" if port else url.host


def _network_failure(
    exc: httpx.TransportError, timeout_s: float, side: Side = "server", host: str | None = None
) -> RetryableError:
    name = type(exc).__name__
    if isinstance(exc, httpx.TimeoutException):
        reason = f"{name}: no answer within {timeout_s:.3g} s"
    else:
        reason = name + (f": {shown(exc)}" if str(exc) else "")  # may quote what the peer sent
    return RetryableError(reason, side=side, host=host)


class Transport:
    """HTTP access to one Rayform server.

    Args:
        endpoint: base URL, e.g. ``http://127.0.0.1:8765``.
        token: bearer token (never logged, never shown).
        timeout: connect/read timeout per request in seconds (each attempt; never more than
            the time left under ``stall_timeout``).
        attempts: total attempts per request, first one included ("come back later" answers,
            ``429``/``503`` with ``Retry-After``, are waited out without using one up).
        stall_timeout: seconds an operation may go without progress, retries included, before
            it fails with :class:`~rayform.errors.TransportError`.
        min_rate: bytes per second a download must average over a stall bound for its bytes
            to count as progress (0: any byte does; :mod:`rayform._net._pace`).
        watch: what else ends a download early: another download's stall on this host
            (:class:`~rayform._net._outage.Outages`).
        backoff_s: base of the exponential backoff in seconds (jittered, capped at 10 s).
        http_transport: an ``httpx`` transport to use instead of the network (tests).
        sleep: the sleep function used between retries (tests).
    """

    def __init__(
        self,
        endpoint: str,
        token: str | None,
        *,
        timeout: float = 30.0,
        attempts: int = 5,
        stall_timeout: float = 120.0,
        backoff_s: float = 0.25,
        min_rate: float = 0.0,
        watch: Watch | None = None,
        http_transport: httpx.BaseTransport | None = None,
        sleep: Callable[[float], None] | None = None,
    ) -> None:
        self.endpoint = httpx.URL(endpoint.rstrip("/") + "/")
        self._token = token
        self.timeout = timeout
        self.attempts = max(1, attempts)
        self.stall_timeout = stall_timeout
        self.backoff_s = backoff_s
        self.min_rate = min_rate
        self.watch = watch
        self._http_transport = http_transport
        self._sleep = sleep
        self._client: PerProcess[httpx.Client] = PerProcess(self._open_client)

    def __repr__(self) -> str:
        return f"<Transport {self.endpoint} token={'***' if self._token else None}>"

    # -- connections -----------------------------------------------------------------------
    def _open_client(self) -> httpx.Client:
        return httpx.Client(
            timeout=httpx.Timeout(self.timeout),
            follow_redirects=False,
            limits=httpx.Limits(max_connections=64, max_keepalive_connections=32),
            transport=self._http_transport,
            headers={"Accept-Encoding": "identity", "User-Agent": "rayform-sdk"},
        )

    def _http(self) -> httpx.Client:
        return self._client.get()

    @property
    def connected(self) -> bool:
        """Whether this process holds an HTTP connection pool (opened by its first request)."""
        return self._client.peek() is not None

    def close(self) -> None:
        """Close this process's connections (a later request reopens them)."""
        client = self._client.clear()
        if client is not None:
            client.close()

    def _url(self, path: str) -> httpx.URL:
        return self.endpoint.join(path.lstrip("/"))

    def _headers(self, url: httpx.URL) -> dict[str, str]:
        if self._token and _origin(url) == _origin(self.endpoint):
            return {"Authorization": f"Bearer {self._token}"}
        return {}

    # -- retries ---------------------------------------------------------------------------
    def _policy(self) -> RetryPolicy:
        return RetryPolicy(
            str(self.endpoint).rstrip("/"),
            self.attempts,
            self.backoff_s,
            self.stall_timeout,
            self._sleep,
        )

    def _with_retries(self, what: str, fn: Callable[[float], T], pace: Pace | None = None) -> T:
        watch = self.watch if pace is not None else None
        return run_with_retries(self._policy(), what, fn, pace=pace, watch=watch)

    def _timeout(self, left_s: float) -> httpx.Timeout:
        return httpx.Timeout(min(self.timeout, left_s))

    def _stream(
        self,
        client: httpx.Client,
        url: httpx.URL,
        left_s: float,
        headers: dict[str, str] | None = None,
    ) -> contextlib.AbstractContextManager[httpx.Response]:
        """``GET url`` as a streamed response; each connection it opens keeps to the deadlines
        of :mod:`rayform._net._deadline`."""
        return client.stream(
            "GET",
            url,
            headers=self._headers(url) if headers is None else headers,
            timeout=self._timeout(left_s),
            extensions={"trace": trace},
        )

    def _check(
        self,
        resp: httpx.Response,
        what: str,
        host: str | None = None,
        deadline: float | None = None,
    ) -> None:
        status = resp.status_code
        if status < 300:
            return
        if status == 429 or status >= 500:
            after = _retry_after(resp)
            code, message = _server_error(resp, deadline)
            busy = status in (429, 503) and after is not None and after > 0
            if host is not None:  # the object store answered itself
                raise RetryableError(f"HTTP {status}", after, side="direct", host=host, busy=busy)
            if code == STORE_UNAVAILABLE:  # the server is fine; what it stands in front of is not
                raise RetryableError(f"HTTP {status}: {message}", after, side="store")
            raise RetryableError(f"HTTP {status}", after, busy=busy)
        msg = _server_error(resp, deadline)[1]
        detail = f" ({msg})" if msg else ""
        if status == 400:
            raise InvalidArgumentError(f"{what}: the server rejected the request{detail}")
        if status == 401 and not self._token:
            raise AccessDeniedError(
                f"{what}: the server requires an access token and RAYFORM_TOKEN is not set; "
                "set RAYFORM_TOKEN to your token (or pass token= to rayform.Client)"
            )
        if status == 401:
            raise AccessDeniedError(
                f"{what}: the server did not accept the access token; check RAYFORM_TOKEN "
                "(or the token= argument) and that it has not expired"
            )
        if status == 403:
            raise AccessDeniedError(
                f"{what}: access denied{detail}; ask the data owners to extend your token's scope"
            )
        if status == 404:
            raise NotFoundError(f"{what}: not found{detail}")
        if status == 409:
            raise ConflictError(f"{what}: refused{detail}")
        if status in (405, 411, 413, 422):
            raise InvalidArgumentError(f"{what}: the server refused the request{detail}")
        raise TransportError(f"{what}: unexpected HTTP {status}{detail}")

    # -- requests --------------------------------------------------------------------------
    @property
    def server(self) -> str:
        """``the server at <endpoint>``: how errors name this side."""
        return f"the server at {str(self.endpoint).rstrip('/')}"

    def get_bytes(self, path: str, what: str, *, limit: int = JSON_CAP) -> bytes:
        """GET ``path`` (relative to the endpoint) and return the body, with retries.

        Args:
            path: relative to the endpoint.
            what: what is being done, for error messages.
            limit: the most bytes the answer may hold (what the protocol declares for it).

        Raises:
            ProtocolError: the body is longer than ``limit`` or compressed.
            TransportError: no complete answer within the stall bound (the whole request,
                body included, counts: there is no progress short of the complete answer).
        """

        def once(left_s: float) -> bytes:
            url = self._url(path)
            deadline = time.monotonic() + left_s
            try:
                # The whole request, status line and headers included, ends by the deadline.
                with reads_end_by(deadline), self._stream(self._http(), url, left_s) as resp:
                    self._check(resp, what, deadline=deadline)
                    return self._read_body(resp, what, limit, deadline - left_s, deadline)
            except httpx.TransportError as exc:
                raise _network_failure(exc, min(self.timeout, left_s)) from None

        return self._with_retries(what, once)

    def get_bytes_unless(
        self, path: str, what: str, etag: str, *, limit: int = JSON_CAP
    ) -> bytes | None:
        """:meth:`get_bytes` with ``If-None-Match: "etag"``: ``None`` when the server answers
        ``304`` (it still hands out what ``etag`` names, and the caller holds a copy), else the
        body. The server checks access as for any GET; no body crosses the network.

        Raises:
            as :meth:`get_bytes`.
        """

        def once(left_s: float) -> bytes | None:
            url = self._url(path)
            headers = {**self._headers(url), "If-None-Match": f'"{etag}"'}
            deadline = time.monotonic() + left_s
            try:
                with (
                    reads_end_by(deadline),
                    self._stream(self._http(), url, left_s, headers) as resp,
                ):
                    if resp.status_code == 304:
                        return None
                    self._check(resp, what, deadline=deadline)
                    return self._read_body(resp, what, limit, deadline - left_s, deadline)
            except httpx.TransportError as exc:
                raise _network_failure(exc, min(self.timeout, left_s)) from None

        return self._with_retries(what, once)

    def _read_body(
        self, resp: httpx.Response, what: str, limit: int, started: float, deadline: float
    ) -> bytes:
        _check_encoding(resp, what, self.server)
        declared = _declared_size(resp)
        too_long = (
            f"{what}: {self.server} answered more than the {limit} bytes this answer "
            "may hold; nothing was kept. The server (or a proxy in front of it) is "
            "misbehaving: report it to its operator."
        )
        if declared is not None and declared > limit:
            raise ProtocolError(too_long)
        body = bytearray()

        def incomplete() -> RetryableError:
            return RetryableError(
                f"the answer was still incomplete after {time.monotonic() - started:.3g} s "
                f"({len(body)} bytes received)"
            )

        hold(resp.extensions.get("network_stream"))
        try:
            with reads_end_by(deadline):
                for chunk in _raw(resp):
                    body += chunk
                    if len(body) > limit:
                        raise ProtocolError(too_long)
                    if time.monotonic() > deadline:
                        raise incomplete()
        except httpx.TimeoutException:
            if time.monotonic() < deadline - 0.05:  # the per-read timeout, not the deadline
                raise
            raise incomplete() from None
        return bytes(body)

    def get_json(self, path: str, what: str, *, limit: int = JSON_CAP) -> Any:
        """GET ``path`` and parse the JSON body (at most ``limit`` bytes).

        Raises:
            ProtocolError: the body is not JSON (or too long, or compressed).
        """
        return self._parsed(self.get_bytes(path, what, limit=limit), what)

    def post_json(self, path: str, doc: object, what: str, *, limit: int = JSON_CAP) -> Any:
        """POST ``doc`` as JSON to ``path`` and parse the JSON answer (at most ``limit`` bytes).

        Retried like a GET: every write of the protocol lands once however often it is sent
        (a label write that landed already changes nothing the second time; a published slice
        is named by its content), so a lost answer costs a resend, never a duplicate.

        Raises:
            ConflictError: ``409``, a write that conflicts with one that landed first.
            InvalidArgumentError: ``400``/``413``, a write the server refuses as malformed.
            AccessDeniedError: ``401``/``403``, the token may not write there.
            ProtocolError: the answer is not JSON (or too long, or compressed).
        """
        return self._parsed(
            self._with_retries(what, lambda left: self._post_once(path, doc, what, limit, left)),
            what,
        )

    def post_json_once(
        self, path: str, doc: object, what: str, *, limit: int = JSON_CAP, timeout_s: float = 10.0
    ) -> Any:
        """:meth:`post_json` in one attempt of at most ``timeout_s`` seconds, never retried:
        for requests that only save work, whose caller has a way without them.

        Raises:
            RetryableError: the server was busy, failed or did not answer in time.
            TransportError: any other refusal (as :meth:`post_json`), or invalid JSON.
        """
        return self._parsed(
            self._post_once(path, doc, what, limit, min(timeout_s, self.timeout)), what
        )

    def _parsed(self, data: bytes, what: str) -> Any:
        try:
            return loads(data)
        except ValueError as exc:
            raise ProtocolError(f"{what}: {self.server} answered invalid JSON ({exc})") from None

    def _post_once(self, path: str, doc: object, what: str, limit: int, left_s: float) -> bytes:
        body = json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()
        url = self._url(path)
        headers = {**self._headers(url), "Content-Type": "application/json"}
        deadline = time.monotonic() + left_s
        try:
            with (
                reads_end_by(deadline),
                self._http().stream(
                    "POST",
                    url,
                    content=body,
                    headers=headers,
                    timeout=self._timeout(left_s),
                    extensions={"trace": trace},
                ) as resp,
            ):
                self._check(resp, what, deadline=deadline)
                return self._read_body(resp, what, limit, deadline - left_s, deadline)
        except httpx.TransportError as exc:
            raise _network_failure(exc, min(self.timeout, left_s)) from None

    def check_store(self, what: str, waiting_since: float | None = None) -> None:
        """Refuse a download about to start, or end a wait on another thread's or process's
        download of the same blob, if the store has just been found stalled
        (:mod:`rayform._net._outage`).

        Args:
            what: the download, for the error.
            waiting_since: ``time.time()`` when the caller began to wait for the blob; a
                failure recorded after it (by any process on this host) ends the wait.
                Default now: only this process's own recent failure refuses.

        Raises:
            TransportError: saying which download gave up, and when the store is tried again.
        """
        if self.watch is not None:
            pace = Pace(self.stall_timeout, self.min_rate, waiting_since)
            check_first(self._policy(), what, pace, self.watch)

    def download(
        self,
        path: str,
        part: DownloadSink,
        what: str,
        on_bytes: ProgressCallback | None = None,
        *,
        waiting_since: float | None = None,
        start_url: str | None = None,
    ) -> None:
        """Fill ``part`` from ``part.offset`` to its end with the blob at ``path``.

        A broken connection is retried and the download continues where it stopped, with
        ``Range: bytes=<offset>-``. Bytes received at the minimum rate count as progress (see
        ``stall_timeout`` and ``min_rate``).

        Args:
            path: the blob's URL path, relative to the endpoint.
            part: where the bytes go (the cache's partial file).
            what: what is being done, for error messages.
            on_bytes: called with the size of each chunk written (progress bars).
            waiting_since: ``time.time()`` when the caller began to wait for this blob (before
                waiting on another process's download of it); default now.
            start_url: where to GET the bytes first: a presigned URL the server gave for this
                blob (``POST .../blob-urls``), instead of the blob path and its ``307``. If the
                store refuses it (``403``: expired; ``404``), the blob path is asked.
        """
        pace = Pace(self.stall_timeout, self.min_rate, waiting_since)
        first = [start_url]  # emptied once the store refused it: retries ask the blob path

        def once(left_s: float) -> None:
            if part.remaining <= 0:
                return
            self._download_once(path, part, what, pace, on_bytes, first)

        self._with_retries(what, once, pace)

    def _download_once(
        self,
        path: str,
        part: DownloadSink,
        what: str,
        pace: Pace,
        on_bytes: ProgressCallback | None,
        first: list[str | None],
    ) -> None:
        given = first[0]
        try:
            url = httpx.URL(given) if given is not None else self._url(path)
        except httpx.InvalidURL:  # not one httpx can send: the blob path gives another
            first[0] = given = None
            url = self._url(path)
        redirects = refreshes = 0
        client = self._http()
        timeout = self._timeout(max(pace.left_s(), 0.05))
        while True:
            headers = self._headers(url)
            if part.offset:
                headers["Range"] = f"bytes={part.offset}-"
            foreign = _origin(url) != _origin(self.endpoint)
            host = _host(url) if foreign else None
            side: Side = "direct" if foreign else "server"
            try:
                self._stream_once(
                    client, url, headers, part, what, pace, host, on_bytes, given is not None
                )
                return
            except httpx.TimeoutException as exc:
                if pace.left_s() > 0.05 or pace.why() == "without progress":
                    raise _network_failure(exc, float(timeout.read or 0), side, host) from None
                # Bytes came, too few to count: the minimum rate, not a silent server, ended it.
                raise RetryableError("the body came too slowly", side=side, host=host) from None
            except httpx.TransportError as exc:
                raise _network_failure(exc, float(timeout.read or 0), side, host) from None
            except _Redirect as redirect:
                if redirect.refresh:
                    first[0] = given = None
                    refreshes += 1
                    if refreshes > _MAX_URL_REFRESHES:
                        raise AccessDeniedError(
                            f"{what}: the object store refused {refreshes} fresh download URLs; "
                            "check the server's storage credentials"
                        ) from None
                    url, redirects = self._url(path), 0
                elif redirect.location is not None:
                    redirects += 1
                    if redirects > _MAX_REDIRECTS:
                        raise TransportError(f"{what}: too many redirects") from None
                    try:
                        url = url.join(redirect.location)
                    except httpx.InvalidURL:
                        raise ProtocolError(
                            f"{what}: {self.server} redirected to an invalid URL "
                            f"{shown(redirect.location, 80)!r}; report it to its operator"
                        ) from None

    def _stream_once(
        self,
        client: httpx.Client,
        url: httpx.URL,
        headers: dict[str, str],
        part: DownloadSink,
        what: str,
        pace: Pace,
        host: str | None,
        on_bytes: ProgressCallback | None = None,
        given: bool = False,
    ) -> None:
        """One GET of the blob into ``part``; raises :class:`_Redirect` to go elsewhere
        (``given``: ``url`` came with the blob's other URLs, not from a ``307``).

        Every read, status line and headers included, ends by the stall bound of ``pace``
        (a ``time.monotonic()`` deadline that only the body's bytes move, when they come at
        the minimum rate), or as soon as the transport's watch says another download found the
        store stalled.
        """
        foreign = host is not None
        left_s = max(pace.left_s(), 0.05)
        watch = self.watch
        abort = (lambda: watch.check(pace) is not None) if watch is not None else None
        with (
            reads_end_by(pace.deadline(), abort) as bound,
            self._stream(client, url, left_s, headers) as resp,
        ):
            status = resp.status_code
            if status in (301, 302, 303, 307, 308) and "location" in resp.headers:
                raise _Redirect(resp.headers["location"])
            if foreign and status == 403:  # presigned URL expired: ask the stub again
                raise _Redirect(None, refresh=True)
            if given and status == 404:  # signed without a look: the blob path says what is gone
                raise _Redirect(None, refresh=True)
            if status == 416 and part.offset:
                part.restart()  # our partial copy is longer than the blob: start over
                raise _Redirect(str(url))
            self._check(resp, what, host, deadline=time.monotonic() + min(self.timeout, left_s))
            _check_encoding(resp, what, f"the object store at {host}" if foreign else self.server)
            if status == 200 and part.offset:
                part.restart()  # the range was ignored: take the whole body
            elif status == 206:
                start = resp.headers.get("content-range", "").removeprefix("bytes ").split("-")[0]
                if start != str(part.offset):
                    raise RetryableError(f"unexpected Content-Range {shown(start, 40)!r}")
            total = _declared_size(resp)
            if total is not None and total != part.expected_size:
                raise IntegrityError(
                    f"{what}: the server holds {total} bytes for this blob but its manifest "
                    f"declares {part.expected_size}; nothing was cached. The data on the "
                    "server is inconsistent: report it to the data owners."
                )
            for chunk in _raw(resp):  # raw: never decompressed (see _check_encoding)
                part.write(chunk)
                pace.add(len(chunk))
                bound.move(pace.deadline())
                if on_bytes is not None:
                    on_bytes(len(chunk))
                if pace.left_s() <= 0:  # a trickle below the minimum rate
                    raise RetryableError(
                        "the body came too slowly",
                        side="direct" if foreign else "server",
                        host=host,
                    )
            if part.remaining > 0:
                raise RetryableError(
                    f"connection closed after {part.offset} of {part.expected_size} bytes",
                    side="direct" if foreign else "server",
                    host=host,
                )


# A signal that steers the download loop, not an error: it never leaves this module.
class _Redirect(Exception):  # noqa: N818
    """Go to ``location`` (relative to the current URL), or ask the server again (``refresh``)."""

    def __init__(self, location: str | None, *, refresh: bool = False) -> None:
        super().__init__(location)
        self.location = location
        self.refresh = refresh
