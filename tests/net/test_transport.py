"""Edge cases of the HTTP layer with httpx.MockTransport: retries, ranges, redirects, errors."""

from __future__ import annotations

import pickle
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from rayform._net._transport import Transport
from rayform.cache._partial import PartialBlob
from rayform.errors import AccessDeniedError, InvalidArgumentError, NotFoundError, TransportError
from rayform.format import hash_bytes

SECRET = "s3cr3t-token-for-transport-tests"
DATA = bytes(range(256)) * 400  # 102400 bytes
HASH = hash_bytes(DATA)


def _transport(
    handler: Callable[[httpx.Request], httpx.Response],
    sleeps: list[float] | None = None,
    attempts: int = 4,
) -> Transport:
    return Transport(
        "http://stub.test:8765",
        SECRET,
        attempts=attempts,
        http_transport=httpx.MockTransport(handler),
        sleep=(sleeps.append if sleeps is not None else lambda s: None),
    )


def _part(tmp_path: Path) -> PartialBlob:
    return PartialBlob(tmp_path / f"{HASH}.h.1.x.part", HASH, len(DATA), 0o644)


def _range_response(request: httpx.Request, body: bytes = DATA) -> httpx.Response:
    rng = request.headers.get("range")
    if rng:
        start = int(rng.removeprefix("bytes=").split("-")[0])
        return httpx.Response(
            206,
            content=body[start:],
            headers={"Content-Range": f"bytes {start}-{len(body) - 1}/{len(body)}"},
        )
    return httpx.Response(200, content=body)


def test_503_retried_honouring_retry_after_then_succeeds() -> None:
    calls = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(request)
        if len(calls) < 3:
            return httpx.Response(503, headers={"Retry-After": "2"}, json={"error": "unavailable"})
        return httpx.Response(200, json={"ok": True})

    sleeps: list[float] = []
    assert _transport(handler, sleeps).get_json("v1/slices", "listing") == {"ok": True}
    assert len(calls) == 3 and sleeps == [2.0, 2.0]
    assert calls[0].headers["authorization"] == f"Bearer {SECRET}"


@pytest.mark.parametrize(
    ("status", "error"),
    [
        (400, InvalidArgumentError),
        (401, AccessDeniedError),
        (403, AccessDeniedError),
        (404, NotFoundError),
    ],
)
def test_4xx_never_retried_and_typed(status: int, error: type[Exception]) -> None:
    calls = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(request)
        return httpx.Response(status, json={"error": "x", "message": "server says no"})

    with pytest.raises(error) as info:
        _transport(handler).get_json("v1/slices/slc_00000000", "resolving")
    assert len(calls) == 1
    assert SECRET not in str(info.value)
    if status == 401:
        assert "RAYFORM_TOKEN" in str(info.value)


def test_connection_errors_become_transport_error_after_retries() -> None:
    calls = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(request)
        raise httpx.ConnectError("connection refused")

    sleeps: list[float] = []
    with pytest.raises(TransportError, match="after 4 attempts") as info:
        _transport(handler, sleeps).get_bytes("v1/slices", "listing")
    assert len(calls) == 4 and len(sleeps) == 3
    assert all(0 <= s <= 10 for s in sleeps)
    assert SECRET not in str(info.value)


class _BreakingStream(httpx.SyncByteStream):
    def __init__(self, body: bytes, break_at: int) -> None:
        self.body, self.break_at = body, break_at

    def __iter__(self) -> Iterator[bytes]:
        yield self.body[: self.break_at]
        raise httpx.ReadError("connection reset by peer")


def test_broken_download_resumes_with_range(tmp_path: Path) -> None:
    calls = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(request)
        if len(calls) == 1:
            return httpx.Response(
                200,
                stream=_BreakingStream(DATA, 40_000),
                headers={"Content-Length": str(len(DATA))},
            )
        return _range_response(request)

    part = _part(tmp_path)
    _transport(handler).download("v1/slices/slc_00000000/blobs/" + HASH, part, "downloading")
    assert part.finish() == HASH
    assert [c.headers.get("range") for c in calls] == [None, "bytes=40000-"]


def test_ignored_range_restarts_from_zero(tmp_path: Path) -> None:
    part = _part(tmp_path)
    part.write(DATA[:1000])
    _transport(lambda r: httpx.Response(200, content=DATA)).download("b", part, "downloading")
    assert part.finish() == HASH


def test_redirect_to_other_origin_drops_authorization_and_refreshes_expired_url(
    tmp_path: Path,
) -> None:
    seen: list[tuple[str, str | None]] = []
    presigned = iter(["expired", "fresh"])

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append((request.url.host, request.headers.get("authorization")))
        if request.url.host == "stub.test":
            return httpx.Response(
                307, headers={"Location": f"https://bucket.s3.test/blob?sig={next(presigned)}"}
            )
        if request.url.params["sig"] == "expired":
            return httpx.Response(403, text="<Error>Request has expired</Error>")
        return _range_response(request)

    part = _part(tmp_path)
    _transport(handler).download("v1/slices/slc_00000000/blobs/" + HASH, part, "downloading")
    assert part.finish() == HASH
    assert seen == [
        ("stub.test", f"Bearer {SECRET}"),
        ("bucket.s3.test", None),
        ("stub.test", f"Bearer {SECRET}"),
        ("bucket.s3.test", None),
    ]


@pytest.mark.parametrize(
    ("start_url", "store_status", "expected_hosts"),
    [
        ("https://bucket.s3.test/blob?sig=batch", 200, ["bucket.s3.test"]),
        # Refused by the store (expired; signed for an object that is gone): the blob path.
        ("https://bucket.s3.test/blob?sig=batch", 403, ["bucket.s3.test", "stub.test", "bucket"]),
        ("https://bucket.s3.test/blob?sig=batch", 404, ["bucket.s3.test", "stub.test", "bucket"]),
        ("http://[::1/blob", 200, ["stub.test", "bucket"]),  # not a URL httpx can send
    ],
    ids=["used", "expired", "gone", "invalid"],
)
def test_a_url_given_for_the_blob_is_tried_first_then_the_blob_path(
    tmp_path: Path, start_url: str, store_status: int, expected_hosts: list[str]
) -> None:
    seen: list[tuple[str, str | None]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append((request.url.host, request.headers.get("authorization")))
        if request.url.host == "stub.test":
            return httpx.Response(307, headers={"Location": "https://bucket.test/blob?sig=fresh"})
        if request.url.params["sig"] == "batch" and store_status != 200:
            return httpx.Response(store_status, text="<Error>no</Error>")
        return _range_response(request)

    part = _part(tmp_path)
    _transport(handler).download(
        "v1/slices/slc_00000000/blobs/" + HASH, part, "downloading", start_url=start_url
    )
    assert part.finish() == HASH
    assert [host for host, _ in seen] == [
        "bucket.test" if h == "bucket" else h for h in expected_hosts
    ]
    assert all(auth is None for host, auth in seen if host != "stub.test"), "no token to a store"


def test_same_origin_redirect_keeps_authorization(tmp_path: Path) -> None:
    seen = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers.get("authorization"))
        if request.url.path == "/old":
            return httpx.Response(308, headers={"Location": "/new"})
        return httpx.Response(200, content=DATA)

    part = _part(tmp_path)
    _transport(handler).download("old", part, "downloading")
    assert seen == [f"Bearer {SECRET}"] * 2


def test_transport_pickles_without_connections() -> None:
    t = Transport("http://stub.test:8765", SECRET)
    t._http()  # opens the connection pool, as a first request would
    assert t.connected
    clone = pickle.loads(pickle.dumps(t))
    assert not clone.connected and "***" in repr(clone) and SECRET not in repr(clone)
    t.close()
    assert not t.connected
