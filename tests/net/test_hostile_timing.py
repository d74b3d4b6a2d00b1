"""A hostile server cannot stretch the client past its stall bound or draw a request storm.

A real server on loopback (``support.hostile.HostileServer``) times its answers against the
client's bounds. Bounds are generous (a loaded 2-core CI machine), never exact timings: each
case measures well outside them without the fix it guards.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import DEMO_SLICE, TOKEN
from support.hostile import Answer, HostileServer

import rayform
from rayform.errors import TransportError

SLC = "slc_0badc0de"
STALL_S = 3.0
#: How late the client may end past its stall bound.
MARGIN_S = 1.5
#: The same for the trickled heads, whose clock also covers resolving the slice: without the
#: bound they would run for the whole head (1 KiB at 2.5 s a byte is 43 minutes).
HEAD_MARGIN_S = 6.0


@pytest.fixture
def server(tmp_path: Path) -> Iterator[HostileServer]:
    s = HostileServer(tmp_path / "no-root")  # every path the cases use is scripted
    yield s
    s.stop()


def _client(server: HostileServer, tmp_path: Path) -> rayform.Client:
    return rayform.Client(server.url, TOKEN, cache_dir=tmp_path / "cache", stall_timeout=STALL_S)


@pytest.mark.parametrize("status", [200, 500])
def test_a_byte_just_before_each_read_timeout_ends_within_the_stall_bound(
    status: int, server: HostileServer, tmp_path: Path
) -> None:
    # One byte every 2.8 s, each just inside the 3 s read timeout: each read used to get the
    # whole timeout, so the request ran to about 5.6 s (the body, or the 500's error body).
    server.answers[f"/v1/slices/{SLC}"] = Answer(
        status, b" " * 100, {"Content-Type": "application/json"}, trickle_bps=1 / 2.8
    )
    t0 = time.monotonic()
    with pytest.raises(TransportError) as info:
        _client(server, tmp_path).slices.get(SLC)
    elapsed = time.monotonic() - t0
    assert elapsed < STALL_S + MARGIN_S, elapsed
    message = str(info.value)
    assert f"the limit is {STALL_S:g} s" in message, message
    # Every duration the message states is one the client kept to.
    stated = [float(s) for s in re.findall(r"after ([0-9.]+) s", message)]
    assert stated and all(s <= STALL_S + MARGIN_S for s in stated), message


def test_a_status_line_trickled_byte_by_byte_ends_within_the_stall_bound(
    server: HostileServer, tmp_path: Path
) -> None:
    # The status line and headers, one byte every 2.5 s: each byte came inside the 3 s read
    # timeout, so the request never ended (1 KiB of headers would take 43 minutes).
    server.answers[f"/v1/slices/{SLC}"] = Answer(
        200, b"{}", {"X-Padding": "a" * 1024}, head_byte_s=2.5
    )
    t0 = time.monotonic()
    with pytest.raises(TransportError, match="without progress"):
        _client(server, tmp_path).slices.get(SLC)
    assert time.monotonic() - t0 < STALL_S + HEAD_MARGIN_S


def test_a_blob_whose_headers_trickle_ends_within_the_stall_bound(
    demo_root: Path, tmp_path: Path
) -> None:
    # A blob's body bytes are progress; the bytes before it are not. The same trickle before
    # a blob's body held each download for as long as the server liked.
    server = HostileServer(demo_root)
    try:
        client = _client(server, tmp_path)
        ref = next(iter(client.slices.get(DEMO_SLICE).segments)).streams["cam0/rgb"].blob
        server.answers[f"/v1/slices/{DEMO_SLICE}/blobs/{ref.hash}"] = Answer(
            200, b"x" * ref.size, {"X-Padding": "a" * 1024}, head_byte_s=2.5
        )
        t0 = time.monotonic()
        with pytest.raises(TransportError, match="without progress"):
            client.pull(DEMO_SLICE, streams=["cam0/rgb"])
        assert time.monotonic() - t0 < STALL_S + HEAD_MARGIN_S
    finally:
        server.stop()


def test_a_tiny_retry_after_does_not_make_a_request_storm(
    server: HostileServer, tmp_path: Path
) -> None:
    # "Come back later" uses up no attempt: a Retry-After of a microsecond used to draw
    # hundreds of requests a second until the stall bound.
    server.answers[f"/v1/slices/{SLC}"] = Answer(503, b"", {"Retry-After": "0.000001"})
    t0 = time.monotonic()
    with pytest.raises(TransportError, match="HTTP 503"):
        _client(server, tmp_path).slices.get(SLC)
    assert time.monotonic() - t0 < STALL_S + MARGIN_S
    # The default 0.25 s backoff allows 13 requests in 3 s; the storm sent hundreds.
    assert 2 <= len(server.requests) < 40, len(server.requests)
