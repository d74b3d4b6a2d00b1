"""The rules of a store's recorded stall (``rayform._net._outage``), process by process.

Real files in a real cache; a second process is a second ``Outages`` on the same file (what
it holds in memory is per process). The end-to-end case, 8 DataLoader workers against a
stalled store, is ``tests/torch/test_stalled_store_training.py``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from support import DEMO_SLICE, ServerProcess, make_client

from rayform._net._outage import Outages
from rayform._net._pace import Pace
from rayform._net._transport import Transport
from rayform.cache import Cache
from rayform.cache._claims import blob_claim
from rayform.errors import TransportError

STALL_S = 8.0


def _outages(cache: Path) -> Outages:
    return Outages(Cache(cache), "stub-00000000.host.outage", STALL_S)


def test_a_download_already_waiting_ends_one_started_later_goes_on(tmp_path: Path) -> None:
    here, other = _outages(tmp_path), _outages(tmp_path)
    waiting = Pace(STALL_S, 1024, waiting_since=time.time() - STALL_S / 2)  # idle 4 s
    just_now = Pace(STALL_S, 1024, waiting_since=time.time() - 0.5)  # idle less than 2 s
    time.sleep(0.01)
    other.record("ReadTimeout: no answer within 8 s")
    assert here.path.is_file()
    reason = here.check(waiting)
    assert reason is not None and "ReadTimeout: no answer within 8 s" in reason
    assert "received nothing for 4 s" in reason
    assert here.check(just_now) is None  # a quarter bound of its own silence first
    # A download that starts after the record, in a process that saw no failure of its own:
    # the store gets its full bound (a transient fault does not poison a later run).
    assert _outages(tmp_path).check(Pace(STALL_S, 1024)) is None


def test_a_download_that_made_progress_after_the_record_goes_on(tmp_path: Path) -> None:
    pace = Pace(STALL_S, 0, waiting_since=time.time() - STALL_S)
    _outages(tmp_path).record("stalled")
    time.sleep(0.01)
    pace.add(1)  # a byte after the record: this download's store answers
    assert _outages(tmp_path).check(pace) is None


def test_a_process_whose_download_gave_up_waits_a_quarter_bound_for_one_bound(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mine = _outages(tmp_path)
    mine.record("stalled")
    t0 = time.time()
    probe = Pace(STALL_S, 1024, waiting_since=t0)
    # A new download asks the store: one that is back answers at once (a notebook that retries
    # as soon as the store returns is not refused).
    assert mine.check(probe) is None
    assert _outages(tmp_path).check(probe) is None  # another process: in full
    # While that one asks, the others end before their first request.
    assert "another is asking it now" in (mine.check(Pace(STALL_S, 1024)) or "")
    monkeypatch.setattr(time, "time", lambda: t0 + STALL_S / 4 + 0.5)
    assert "waits at most that long" in (mine.check(probe) or "")
    assert _outages(tmp_path).check(probe) is None  # another process: still in full
    later = t0 + STALL_S / 2 + 1  # a quarter bound after that one ended, within the bound
    monkeypatch.setattr(time, "time", lambda: later)
    answered = Pace(STALL_S, 1024, waiting_since=later)
    assert mine.check(answered) is None  # the next one asks
    answered.add(2048)
    assert mine.check(answered) is None  # ... and the store answers: full bounds again
    assert mine.check(Pace(STALL_S, 1024)) is None


def test_the_transport_asks_the_store_again_after_its_own_failure(tmp_path: Path) -> None:
    requests: list[httpx.Request] = []
    outages = _outages(tmp_path)
    transport = Transport(
        "http://stub.test:8765",
        None,
        stall_timeout=STALL_S,
        watch=outages,
        http_transport=httpx.MockTransport(lambda r: requests.append(r) or httpx.Response(200)),
    )
    transport.check_store("downloading blob 1a2b...")  # nothing recorded: goes on
    outages.record("stalled")
    transport.check_store("downloading blob 1a2b...")  # a first request is always made
    assert requests == []


def test_a_read_only_cache_keeps_the_rule_within_the_process(
    tmpfs: Callable[[str], Path],
) -> None:
    outages = _outages(tmpfs("size=1m,ro"))
    waiting = Pace(STALL_S, 1024, waiting_since=time.time() - STALL_S)
    outages.record("stalled")  # cannot be written: no error, and the process still knows
    assert not outages.path.exists()
    assert outages.check(waiting) is not None


def test_a_fetch_waiting_behind_another_download_of_the_blob_ends_with_the_record(
    demo_server: ServerProcess, tmp_path: Path
) -> None:
    # The server is healthy: the download holding the blob's claim stands for one that the
    # stalled store holds. Before, the waiter waited until the claim showed no progress for the
    # cache's 10 s and then downloaded in full; a DataLoader worker's sample waited so behind
    # read-ahead downloads started after the record, each a whole bound (2-4 bounds in all).
    cache = tmp_path / "cache"
    client = make_client(demo_server.url, cache, stall_timeout=STALL_S)
    slice_ = client.slices.get(DEMO_SLICE)
    ref = next(iter(slice_.blobs().values()))
    watch = client._transport().watch
    assert isinstance(watch, Outages)
    other = Outages(Cache(cache), watch.path.name, STALL_S)  # another process, same host
    claim = cache / "claims" / f"{ref.hash}.claim"
    claim.parent.mkdir(parents=True, exist_ok=True)
    errors: list[BaseException] = []

    def fetch() -> None:
        try:
            slice_.blob_path(ref)
        except BaseException as exc:  # noqa: BLE001 - handed to the test's thread
            errors.append(exc)

    with blob_claim(claim, done=lambda: False) as held:
        assert held.held
        waiter = threading.Thread(target=fetch)
        t0 = time.monotonic()
        waiter.start()
        time.sleep(0.3)  # the waiter is behind the claim, past its first look
        other.record("ReadTimeout: no answer within 8 s")
        waiter.join(60)
        elapsed = time.monotonic() - t0
    assert not waiter.is_alive()
    assert len(errors) == 1 and isinstance(errors[0], TransportError), errors
    assert "gave up" in str(errors[0]) and "ReadTimeout: no answer within 8 s" in str(errors[0])
    assert elapsed < 10.0  # the claim's own give-up (10 s without progress) did not end it
    assert not client.cache.has_blob(ref.hash)
