"""Socket reads that end by a deadline, whatever the server trickles.

httpcore gives every socket read the request's whole read timeout. A server that sends one
byte just before each timeout expires (of the status line and headers, or of a body that makes
no progress, such as a slice reference's) would hold a request for as long as it likes. So each
network stream the client opens gets a ``read`` that waits at most until the deadline its
thread has set with :func:`reads_end_by`; a thread that set none reads as before.

Streams are held as httpcore opens them, through its ``trace`` request extension
(:func:`trace`, passed with every request): a pooled connection reused later is already held.
:func:`hold` does it for a response's stream after the fact, for streams the trace did not
see. Both set the ``read`` attribute of httpcore's stream object, the one thing here that
depends on httpcore's internals (``tests/net/test_hostile_timing.py`` would catch a change).

A thread may also give an ``abort`` check (another download found the store stalled,
:mod:`rayform._net._outage`): a read that waits then waits in slices of at most
:data:`POLL_S` and ends with httpcore's ``ReadTimeout`` as soon as the check says so (a socket
read that timed out has consumed nothing: the next slice reads on where it stopped).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import httpcore

__all__ = ["POLL_S", "Bound", "hold", "reads_end_by", "trace"]

#: Seconds a read waits at a time when its thread has an ``abort`` check.
POLL_S = 0.5

_LOCAL = threading.local()
#: httpcore trace events whose ``return_value`` is a new network stream (a plain, TLS or
#: proxied connection; the prefix names the kind of connection).
_NEW_STREAM = (".connect_tcp.complete", ".connect_unix_socket.complete", ".start_tls.complete")


def _deadline() -> float | None:
    return getattr(_LOCAL, "deadline", None)


def _abort() -> Callable[[], bool] | None:
    return getattr(_LOCAL, "abort", None)


class Bound:
    """The deadline :func:`reads_end_by` set for this thread; :meth:`move` changes it."""

    def __init__(self, previous: float | None) -> None:
        self._previous = previous

    def move(self, deadline: float) -> None:
        """This thread's reads end by ``deadline`` from now on (a download whose progress
        moved the stall bound); a deadline set outside the block that is earlier stays."""
        previous = self._previous
        _LOCAL.deadline = deadline if previous is None else min(previous, deadline)


@contextmanager
def reads_end_by(deadline: float, abort: Callable[[], bool] | None = None) -> Iterator[Bound]:
    """Within the block, every read of a held stream by this thread waits at most until
    ``deadline`` (``time.monotonic()`` seconds); a deadline already set that is earlier stays.
    ``abort``, if given, is asked every :data:`POLL_S` of a read's wait whether to end it."""
    previous, previous_abort = _deadline(), _abort()
    _LOCAL.deadline = deadline if previous is None else min(previous, deadline)
    if abort is not None:
        _LOCAL.abort = abort
    try:
        yield Bound(previous)
    finally:
        _LOCAL.deadline, _LOCAL.abort = previous, previous_abort


def hold(stream: Any) -> None:
    """Make ``stream``'s reads keep to their thread's deadline (once; harmless if it has no
    ``read``, as a response a mock transport built in memory)."""
    read = getattr(stream, "read", None)
    if read is None or getattr(read, "_keeps_deadline", False):
        return

    def read_by_deadline(max_bytes: int, timeout: float | None = None) -> bytes:
        deadline, abort = _deadline(), _abort()
        if abort is None:
            if deadline is not None:
                left = max(deadline - time.monotonic(), 0.001)  # 0: a non-blocking socket
                timeout = left if timeout is None else min(timeout, left)
            return bytes(read(max_bytes, timeout))
        start = time.monotonic()
        end = min(
            start + timeout if timeout is not None else float("inf"),
            deadline if deadline is not None else float("inf"),
        )
        while True:
            step = max(min(end - time.monotonic(), POLL_S), 0.001)
            try:
                return bytes(read(max_bytes, step))
            except httpcore.ReadTimeout:
                if time.monotonic() >= end or abort():
                    raise

    read_by_deadline._keeps_deadline = True  # type: ignore[attr-defined]
    stream.read = read_by_deadline


def trace(event: str, info: Mapping[str, Any]) -> None:
    """The ``trace`` extension given to httpcore: hold each network stream it opens."""
    if event.endswith(_NEW_STREAM):
        hold(info.get("return_value"))
