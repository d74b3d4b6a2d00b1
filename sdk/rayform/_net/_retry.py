"""The retry policy of the HTTP layer: bounded attempts, bounded time, and who failed.

One operation (a request, or a whole blob download with its resumptions) is retried on
connection errors, timeouts, ``5xx`` and ``429``:

* an answer that asks us to come back later (``429``/``503`` with ``Retry-After > 0``) is a
  server shedding load: we wait as told and it does not use up an attempt, so a server that
  answers such to a fraction of requests is ridden through;
* a ``Retry-After`` is waited out, but never for less than the backoff we would use anyway
  (its upper end, without jitter): a server asking for a microsecond gets no request storm;
* any other failure uses up one of ``attempts``; our own backoff never takes more than half the
  time left before the bound, so the try after it has the other half;
* whatever happens, the operation ends within ``stall_timeout_s`` seconds *without progress*
  (a download that receives bytes makes progress: its clock starts again).

The error that ends it names the side that failed, by host only (a presigned URL's signature
is a credential): the Rayform server (``RAYFORM_ENDPOINT``), the object store behind it (the
server said so in its ``503``), or the object store the server redirected the download to.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, TypeVar

from rayform.errors import TransportError

__all__ = ["RetryPolicy", "Retryable", "Side", "run_with_retries"]

log = logging.getLogger("rayform.transport")

T = TypeVar("T")

#: ``server``: the Rayform server itself; ``store``: the object store behind it, as the
#: server reported; ``direct``: the object store the server redirected a download to.
Side = Literal["server", "store", "direct"]


class Retryable(Exception):
    """A failure worth retrying (network, timeout, 5xx, 429).

    Args:
        reason: short description, e.g. ``"HTTP 503"`` or ``"ReadTimeout: ..."``; never a URL.
        retry_after: seconds the server asked us to wait (``Retry-After``), if any.
        side: which side failed.
        host: ``host:port`` of the side that failed, for ``direct``.
        busy: the server asked us to come back later: does not use up an attempt.
    """

    def __init__(
        self,
        reason: str,
        retry_after: float | None = None,
        *,
        side: Side = "server",
        host: str | None = None,
        busy: bool = False,
    ) -> None:
        super().__init__(reason)
        self.reason = reason
        self.retry_after = retry_after
        self.side: Side = side
        self.host = host
        self.busy = busy


@dataclass
class RetryPolicy:
    """How long and how often one operation is tried.

    Attributes:
        endpoint: the server's base URL (named in errors).
        attempts: failures (other than "come back later" answers) before giving up.
        backoff_s: base of the jittered exponential backoff in seconds (capped at 10 s).
        stall_timeout_s: seconds without progress after which the operation fails.
        sleep: the sleep function (tests pass a fake one; its seconds count as elapsed).
    """

    endpoint: str
    attempts: int
    backoff_s: float
    stall_timeout_s: float
    sleep: Callable[[float], None] | None = None


def _message(
    what: str, n: int, exc: Retryable, policy: RetryPolicy, spent_s: float, wait_s: float | None
) -> str:
    # wait_s: the wait before the next try, when that try would have come past the stall bound
    # (the reason for giving up); None when the attempts ran out first.
    bound = ""
    if wait_s is not None:
        limit = f"{policy.stall_timeout_s:g} s"
        why = (
            f"the next try, {wait_s:.0f} s later, would pass the limit of {limit}"
            if wait_s >= 1
            else f"the limit is {limit}"
        )
        bound = (
            f"; gave up after {spent_s:.0f} s without progress ({why}: "
            "Client(stall_timeout=...) or RAYFORM_STALL_TIMEOUT)"
        )
    offline = "cached data stays usable with RAYFORM_OFFLINE=1."
    head = f"{what} failed after {n} attempt{'s' if n != 1 else ''}"
    if exc.side == "store":
        return (
            f"{head}: the object store behind the server at {policy.endpoint} did not answer "
            f"({exc.reason}){bound}. The server itself is up: tell its operator that its "
            f"storage is down or stalled, then retry; {offline}"
        )
    if exc.side == "direct":
        return (
            f"{head}: the object store at {exc.host} (where the server at {policy.endpoint} "
            f"sent the download) did not answer: {exc.reason}{bound}. The server itself is "
            f"up: tell its operator that its storage is down or unreachable from here, then "
            f"retry; {offline}"
        )
    return (
        f"{head}: {exc.reason}{bound}. Check that the server {policy.endpoint} is reachable "
        f"(RAYFORM_ENDPOINT), then retry; {offline}"
    )


def run_with_retries(
    policy: RetryPolicy,
    what: str,
    fn: Callable[[float], T],
    *,
    progress: Callable[[], int] | None = None,
) -> T:
    """Run ``fn(seconds_left)`` until it returns, retrying :class:`Retryable` failures.

    Args:
        policy: attempts and time bound.
        what: the operation, for logs and errors (e.g. ``"downloading blob 1a2b..."``).
        fn: one attempt; its argument is the time left in seconds (use it as its timeout).
        progress: a counter that grows when the operation makes progress (bytes received);
            growth restarts the clock (not the attempts).

    Raises:
        TransportError: attempts or time ran out; the message names the side that failed.
    """
    fake_sleep = policy.sleep
    t0, slept, counted, n = time.monotonic(), 0.0, 0, 0
    last = progress() if progress is not None else 0

    def spent() -> float:
        return time.monotonic() - t0 + slept

    while True:
        n += 1
        try:
            return fn(max(policy.stall_timeout_s - spent(), 0.05))
        except Retryable as exc:
            now = progress() if progress is not None else 0
            if now != last:
                t0, slept, last = time.monotonic(), 0.0, now
            counted += 0 if exc.busy else 1
            backoff = min(10.0, policy.backoff_s * 2 ** min(counted, 16))
            # A Retry-After never makes us ask sooner than our own backoff: busy answers use up
            # no attempt, so a tiny one would have us ask again and again until the stall bound.
            after = exc.retry_after
            if after is None:
                # Our own backoff leaves the next try half the time left: a try that made
                # progress just now must not be given up because the draw ran past the bound.
                left = policy.stall_timeout_s - spent()
                wait = min(random.uniform(0, backoff), max(left, 0.0) / 2)
            else:
                wait = max(after, backoff)
            if counted >= policy.attempts:
                raise TransportError(_message(what, n, exc, policy, spent(), None)) from None
            if spent() + wait >= policy.stall_timeout_s:
                raise TransportError(_message(what, n, exc, policy, spent(), wait)) from None
            log.info("retrying %s (attempt %d) in %.1f s: %s", what, n, wait, exc.reason)
            if fake_sleep is not None:
                fake_sleep(wait)
                slept += wait
            else:
                time.sleep(wait)
