"""The rules of a store's recorded stall (``rayform._net._outage``), process by process.

Real files in a real cache; a second process is a second ``Outages`` on the same file (what
it holds in memory is per process). The end-to-end case, 8 DataLoader workers against a
stalled store, is ``tests/torch/test_stalled_store_training.py``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from rayform._net._outage import Outages
from rayform._net._pace import Pace
from rayform._net._transport import Transport
from rayform.cache import Cache
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


def test_a_process_whose_download_gave_up_refuses_new_ones_for_one_bound(tmp_path: Path) -> None:
    mine = _outages(tmp_path)
    mine.record("stalled")
    assert "tries the store again only 8 s after" in (mine.check(Pace(STALL_S, 1024)) or "")
    assert _outages(tmp_path).check(Pace(STALL_S, 1024)) is None  # another process: in full


def test_the_transport_refuses_before_the_first_request(tmp_path: Path) -> None:
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
    with pytest.raises(TransportError, match="failed before its first attempt: another download"):
        transport.check_store("downloading blob 1a2b...")
    assert requests == []


def test_a_read_only_cache_keeps_the_rule_within_the_process(
    tmpfs: Callable[[str], Path],
) -> None:
    outages = _outages(tmpfs("size=1m,ro"))
    waiting = Pace(STALL_S, 1024, waiting_since=time.time() - STALL_S)
    outages.record("stalled")  # cannot be written: no error, and the process still knows
    assert not outages.path.exists()
    assert outages.check(waiting) is not None
