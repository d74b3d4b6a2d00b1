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
from rayform.errors import InvalidArgumentError, TransportError
from rayform.manifest import BlobRef

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


def _table_ref(client: rayform.Client) -> BlobRef:
    return next(iter(client.slices.get(DEMO_SLICE).segments)).streams["joints/position"].blob


def _trickled(server: HostileServer, demo_root: Path, ref: BlobRef, bps: float) -> None:
    body = (demo_root / "blobs" / ref.hash[:2] / ref.hash).read_bytes()
    server.answers[f"/v1/slices/{DEMO_SLICE}/blobs/{ref.hash}"] = Answer(200, body, trickle_bps=bps)


def test_a_body_trickled_a_byte_at_a_time_ends_at_the_minimum_rate(
    demo_root: Path, tmp_path: Path
) -> None:
    # One body byte every 2.5 s, each inside the 30 s read timeout: every byte restarted the
    # stall clock, so a 600-byte blob took 25 minutes (a larger one, as long as the server
    # liked). Below the minimum rate (1 KiB/s by default) bytes are not progress.
    server = HostileServer(demo_root)
    try:
        client = _client(server, tmp_path)
        ref = _table_ref(client)
        _trickled(server, demo_root, ref, 1 / 2.5)
        t0 = time.monotonic()
        with pytest.raises(TransportError) as info:
            client.pull(DEMO_SLICE, streams=["joints/position"])
        assert time.monotonic() - t0 < STALL_S + HEAD_MARGIN_S
        message = str(info.value)
        assert "below the minimum rate" in message and "RAYFORM_MIN_RATE" in message, message
        assert "without progress" not in message, message  # the rule that ended it, not the other
    finally:
        server.stop()


def test_the_minimum_rate_is_read_from_the_environment(
    demo_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """100 B/s (25 B chunks) for a 600-byte blob (6 s, past a 3 s bound): below the default
    minimum rate it ends; with RAYFORM_MIN_RATE=4/s (12 B per bound: one chunk, so a loaded
    machine that runs this server's thread only now and then still passes) it is progress and
    the pull completes."""
    server = HostileServer(demo_root)
    try:
        ref = _table_ref(_client(server, tmp_path))
        _trickled(server, demo_root, ref, 100)
        with pytest.raises(TransportError, match="below the minimum rate"):
            _client(server, tmp_path).pull(DEMO_SLICE, streams=["joints/position"])
        monkeypatch.setenv("RAYFORM_MIN_RATE", "4/s")
        _client(server, tmp_path).pull(DEMO_SLICE, streams=["joints/position"])
        assert (tmp_path / "cache" / "blobs" / ref.hash[:2] / ref.hash).is_file()
    finally:
        server.stop()


@pytest.mark.parametrize("bad", ["fast", "-1", "1KiB/min"])
def test_a_bad_minimum_rate_is_refused_up_front(bad: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAYFORM_MIN_RATE", bad)
    with pytest.raises(InvalidArgumentError, match="RAYFORM_MIN_RATE=.*bytes per second"):
        rayform.Client(endpoint="http://127.0.0.1:9")
