"""The retry policy's bounds, with httpx.MockTransport and a fake clock-free sleep."""

from __future__ import annotations

import httpx
import pytest

import rayform
from rayform._net._pace import Pace
from rayform._net._retry import RetryableError, RetryPolicy, run_with_retries
from rayform._net._transport import Transport
from rayform.errors import InvalidArgumentError, TransportError

ENDPOINT = "http://stub.test:8765"


def _transport(handler, sleeps: list[float], **kw: object) -> Transport:  # noqa: ANN001
    return Transport(
        ENDPOINT, "tok", http_transport=httpx.MockTransport(handler), sleep=sleeps.append, **kw
    )  # type: ignore[arg-type]


def test_busy_answers_do_not_use_up_attempts_but_the_stall_bound_holds() -> None:
    calls = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(request)
        if len(calls) <= 6:  # six "come back in 2 s" answers, then the data
            return httpx.Response(429 if len(calls) % 2 else 503, headers={"Retry-After": "2"})
        return httpx.Response(200, json={"ok": True})

    sleeps: list[float] = []
    assert _transport(handler, sleeps, attempts=2).get_json("v1/slices", "listing") == {"ok": True}
    assert sleeps == [2.0] * 6
    forever: list[float] = []
    busy = _transport(
        lambda r: httpx.Response(503, headers={"Retry-After": "5"}),
        forever,
        attempts=2,
        stall_timeout=30,
    )
    with pytest.raises(
        TransportError,
        match=r"gave up after 25 s without progress \(the next try, 5 s later, would pass the "
        r"limit of 30 s.*"
        r"RAYFORM_STALL_TIMEOUT.*RAYFORM_ENDPOINT",
    ):
        busy.get_bytes("v1/slices", "listing")
    assert sum(forever) < 30 and len(forever) == 5  # 5 waits of 5 s; a sixth would pass 30 s


def test_store_unavailable_names_the_object_store_behind_the_server() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(
            503,
            headers={"Retry-After": "1"},
            json={
                "error": "store_unavailable",
                "message": "the object store at s3.internal:9000 did not answer within 5 s (ReadTimeoutError)",
            },
        )

    sleeps: list[float] = []
    with pytest.raises(TransportError) as info:
        _transport(handler, sleeps, attempts=3).get_bytes(
            "v1/slices/x/blobs/y", "downloading blob y"
        )
    msg = str(info.value)
    assert msg.startswith(
        "downloading blob y failed after 3 attempts: the object store behind the "
        f"server at {ENDPOINT} did not answer (HTTP 503: the object store at "
        "s3.internal:9000 did not answer"
    )
    assert "RAYFORM_ENDPOINT" not in msg and "tell its operator" in msg
    assert sleeps == [1.0, 1.0]  # store faults use up attempts: the user hears of it soon


def test_stall_timeout_argument_and_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    assert rayform.Client(endpoint=ENDPOINT).stall_timeout == 120.0
    assert rayform.Client(endpoint=ENDPOINT, stall_timeout=7).stall_timeout == 7.0
    monkeypatch.setenv("RAYFORM_STALL_TIMEOUT", "9.5")
    assert rayform.Client(endpoint=ENDPOINT).stall_timeout == 9.5
    assert rayform.Client(endpoint=ENDPOINT)._transport().stall_timeout == 9.5
    for bad in ("0", "-3", "soon", "inf"):
        monkeypatch.setenv("RAYFORM_STALL_TIMEOUT", bad)
        with pytest.raises(
            InvalidArgumentError, match="RAYFORM_STALL_TIMEOUT=.*positive number of seconds"
        ):
            rayform.Client(endpoint=ENDPOINT)
    with pytest.raises(InvalidArgumentError, match="stall_timeout=0"):
        rayform.Client(endpoint=ENDPOINT, stall_timeout=0)


def test_attempts_that_each_made_progress_are_not_reported_as_a_stall() -> None:
    """A store that sends a little and then stalls, every time: each attempt makes progress,
    so the attempts run out, and the error says so, not "gave up after 0 s without progress"
    (what it said when the backoff drawn was longer than the stall bound)."""
    pace = Pace(5.0)

    def trickle_then_stall(seconds_left: float) -> None:
        pace.add(1024)
        raise RetryableError("ReadTimeout: no byte for 5 s")

    sleeps: list[float] = []
    policy = RetryPolicy(
        ENDPOINT, attempts=5, backoff_s=4.0, stall_timeout_s=5.0, sleep=sleeps.append
    )
    with pytest.raises(TransportError) as info:
        run_with_retries(policy, "downloading blob z", trickle_then_stall, pace=pace)
    assert str(info.value).startswith("downloading blob z failed after ")
    assert "without progress" not in str(info.value)
    assert pace.received >= 1024


def test_each_retry_is_logged_naming_the_operation_and_the_wait(
    caplog: pytest.LogCaptureFixture,
) -> None:
    answers = iter([httpx.Response(503, headers={"Retry-After": "3"})])

    def handler(request: httpx.Request) -> httpx.Response:
        return next(answers, httpx.Response(200, json={"ok": True}))

    with caplog.at_level("INFO", logger="rayform.transport"):
        assert _transport(handler, []).get_json("v1/slices", "listing slices") == {"ok": True}
    lines = [r.getMessage() for r in caplog.records if r.name == "rayform.transport"]
    assert lines == ["Retrying listing slices in 3 seconds as it raised RetryableError: HTTP 503."]
