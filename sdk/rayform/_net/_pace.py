"""The progress of one network operation, against the stall bound and the minimum rate.

Two rules end an operation that is not getting anywhere, both measured over one stall bound
(``stall_timeout``, default 120 s):

* **the stall rule**: no byte at all for a whole stall bound;
* **the minimum rate**: fewer than ``min_rate x stall bound`` bytes in a whole stall bound
  (``RAYFORM_MIN_RATE``, default 1 KiB/s, so 120 KiB per 120 s). A server that sends one byte
  just inside each read timeout made the first rule useless: each byte restarted its clock.

So the clock of the stall bound restarts only once ``min_rate x stall bound`` bytes have come
since it last restarted; a transfer at or above the minimum rate restarts it within every
bound, a trickle never does. A minimum rate of 0 is the stall rule alone (any byte restarts
the clock). :meth:`Pace.why` says which rule ended an operation.
"""

from __future__ import annotations

import math
import time

from rayform.units import human_bytes

__all__ = ["Pace"]


class Pace:
    """Bytes received by one operation and when it last made progress.

    Args:
        stall_s: the stall bound in seconds.
        min_rate: the minimum rate in bytes per second (0: any byte is progress).
        waiting_since: ``time.time()`` when the caller began waiting for this operation (a
            fetch may wait on another process's download first); default now.

    Attributes:
        received: bytes received so far (every attempt).
        slept: seconds a fake sleep (tests) stood for: they count as elapsed.
    """

    def __init__(self, stall_s: float, min_rate: float = 0.0, waiting_since: float | None = None):
        self.stall_s = stall_s
        self.min_rate = min_rate
        #: Bytes that make progress: the minimum rate over one stall bound, at least one.
        self.needed = max(1, math.ceil(min_rate * stall_s))
        self.received = 0
        self.slept = 0.0
        self._mark = time.monotonic()
        self._mark_bytes = 0
        self._mark_wall = time.time() if waiting_since is None else min(waiting_since, time.time())

    def now(self) -> float:
        """The operation's clock: ``time.monotonic()`` plus the fake sleeps."""
        return time.monotonic() + self.slept

    def add(self, n: int) -> None:
        """``n`` more bytes arrived: the clock restarts if they complete :attr:`needed`."""
        self.received += n
        if self.received - self._mark_bytes >= self.needed:
            self._mark, self._mark_bytes = time.monotonic(), self.received
            self._mark_wall = time.time()

    def silent_s(self) -> float:
        """Seconds since the operation last made progress (or began)."""
        return self.now() - self._mark

    def left_s(self) -> float:
        """Seconds left before the stall bound (negative once past)."""
        return self.stall_s - self.silent_s()

    def deadline(self) -> float:
        """The ``time.monotonic()`` at which the stall bound passes, as things stand."""
        return self._mark + self.stall_s - self.slept

    def idle_since(self) -> float:
        """``time.time()`` of the last progress, or of when the caller began waiting."""
        return self._mark_wall

    def why(self) -> str:
        """Which rule the time without progress breaks, for the error that ends it."""
        got = self.received - self._mark_bytes
        if got == 0 or self.min_rate <= 0:
            return "without progress"
        return (
            f"below the minimum rate (only {human_bytes(got)} in that time, less than "
            f"{human_bytes(self.min_rate)}/s: RAYFORM_MIN_RATE)"
        )
