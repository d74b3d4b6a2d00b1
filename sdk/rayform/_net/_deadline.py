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
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

__all__ = ["Bound", "hold", "reads_end_by", "trace"]

_LOCAL = threading.local()
#: httpcore trace events whose ``return_value`` is a new network stream (a plain, TLS or
#: proxied connection; the prefix names the kind of connection).
_NEW_STREAM = (".connect_tcp.complete", ".connect_unix_socket.complete", ".start_tls.complete")


def _deadline() -> float | None:
    return getattr(_LOCAL, "deadline", None)


class Bound:
    """The deadline :func:`reads_end_by` set for this thread; :meth:`lift` ends it early."""

    def __init__(self, previous: float | None) -> None:
        self._previous = previous

    def lift(self) -> None:
        """Let this thread's reads wait their own timeouts again (as before the bound)."""
        _LOCAL.deadline = self._previous


@contextmanager
def reads_end_by(deadline: float) -> Iterator[Bound]:
    """Within the block, every read of a held stream by this thread waits at most until
    ``deadline`` (``time.monotonic()`` seconds); a deadline already set that is earlier stays."""
    previous = _deadline()
    _LOCAL.deadline = deadline if previous is None else min(previous, deadline)
    try:
        yield Bound(previous)
    finally:
        _LOCAL.deadline = previous


def hold(stream: Any) -> None:
    """Make ``stream``'s reads keep to their thread's deadline (once; harmless if it has no
    ``read``, as a response a mock transport built in memory)."""
    read = getattr(stream, "read", None)
    if read is None or getattr(read, "_keeps_deadline", False):
        return

    def read_by_deadline(max_bytes: int, timeout: float | None = None) -> bytes:
        deadline = _deadline()
        if deadline is not None:
            left = max(deadline - time.monotonic(), 0.001)  # 0 would make the socket non-blocking
            timeout = left if timeout is None else min(timeout, left)
        return bytes(read(max_bytes, timeout))

    read_by_deadline._keeps_deadline = True  # type: ignore[attr-defined]
    stream.read = read_by_deadline


def trace(event: str, info: Mapping[str, Any]) -> None:
    """httpcore's ``trace`` extension: hold each network stream it opens."""
    if event.endswith(_NEW_STREAM):
        hold(info.get("return_value"))
