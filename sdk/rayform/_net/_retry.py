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
  (a download that receives at least the minimum rate's bytes makes progress: its clock starts
  again, :mod:`rayform._net._pace`); the error says which rule ended it;
* a download that another one of the same store on this host has just found stalled gives up
  with it (:mod:`rayform._net._outage`).

The loop is tenacity's (``Retrying``), and so are the strategies where one fits: ``retry``
(only :class:`RetryableError`), ``wait`` (``wait_random_exponential`` capped at
:data:`BACKOFF_CAP_S`, or the ``Retry-After`` never below ``wait_exponential``'s upper end),
``stop`` (``stop_after_attempt`` combined with ``|`` with a stop that reads the time since the
last progress, plus the wait ahead, against the stall bound), ``before_sleep``
(``before_sleep_log``) and ``retry_error_callback`` (the error naming the side that failed).
What tenacity cannot say is a small strategy object of its own kind: busy answers are tries
but not attempts (tenacity's strategies are shown the state numbered by the attempts), the
two bounds on the wait, and the stall bound's clock.

The error that ends it names the side that failed, by host only (a presigned URL's signature
is a credential): the Rayform server (``RAYFORM_ENDPOINT``), the object store behind it (the
server said so in its ``503``), or the object store the server redirected the download to.
"""

from __future__ import annotations

import copy
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, NoReturn, Protocol, TypeVar

import tenacity
from tenacity.stop import stop_base
from tenacity.wait import wait_base

from rayform._net._pace import Pace
from rayform.errors import TransportError

__all__ = [
    "BACKOFF_CAP_S",
    "RetryableError",
    "RetryPolicy",
    "Side",
    "Watch",
    "check_first",
    "run_with_retries",
]

log = logging.getLogger("rayform.transport")

T = TypeVar("T")

#: The longest backoff between two tries, in seconds (before jitter).
BACKOFF_CAP_S = 10.0

#: ``server``: the Rayform server itself; ``store``: the object store behind it, as the
#: server reported; ``direct``: the object store the server redirected a download to.
Side = Literal["server", "store", "direct"]


class RetryableError(Exception):
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
        backoff_s: base of the jittered exponential backoff in seconds (capped at
            :data:`BACKOFF_CAP_S`).
        stall_timeout_s: seconds without progress after which the operation fails.
        sleep: the sleep function (tests pass a fake one; its seconds count as elapsed).
    """

    endpoint: str
    attempts: int
    backoff_s: float
    stall_timeout_s: float
    sleep: Callable[[float], None] | None = None


class Watch(Protocol):
    """What else may end an operation early (:class:`~rayform._net._outage.Outages`)."""

    def check(self, pace: Pace, claim: bool = True) -> str | None:
        """Why the operation should give up now, or None (also asked before the first try,
        with ``claim=False``: the question is asked again by the try itself)."""

    def record(self, reason: str) -> None:
        """The operation gave up for the stall bound: tell the others."""


def _message(
    what: str,
    n: int,
    exc: RetryableError,
    policy: RetryPolicy,
    pace: Pace,
    wait_s: float | None,
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
            f"; gave up after {pace.silent_s():.0f} s {pace.why()} ({why}: "
            "Client(stall_timeout=...) or RAYFORM_STALL_TIMEOUT)"
        )
    return _sided(what, n, exc.reason + bound, exc, policy)


def _sided(what: str, n: int, detail: str, exc: RetryableError, policy: RetryPolicy) -> str:
    offline = "cached data stays usable with RAYFORM_OFFLINE=1."
    head = f"{what} failed after {n} attempt{'s' if n != 1 else ''}"
    if exc.side == "store":
        return (
            f"{head}: the object store behind the server at {policy.endpoint} did not answer "
            f"({detail}). The server itself is up: tell its operator that its "
            f"storage is down or stalled, then retry; {offline}"
        )
    if exc.side == "direct":
        return (
            f"{head}: the object store at {exc.host} (where the server at {policy.endpoint} "
            f"sent the download) did not answer: {detail}. The server itself is "
            f"up: tell its operator that its storage is down or unreachable from here, then "
            f"retry; {offline}"
        )
    return (
        f"{head}: {detail}. Check that the server {policy.endpoint} is reachable "
        f"(RAYFORM_ENDPOINT), then retry; {offline}"
    )


class _Tries:
    """The state of one operation's tries that tenacity does not keep.

    tenacity numbers every try; a "come back later" answer is a try but not an attempt, so
    the attempts used up are counted here (its ``after`` hook, which runs before the wait and
    the stop) and tenacity's own strategies are shown the state numbered by them
    (:meth:`by_attempts`).
    """

    def __init__(self, policy: RetryPolicy, what: str, pace: Pace, watch: Watch | None) -> None:
        self.policy = policy
        self.what = what
        self.pace = pace
        self.watch = watch
        self.counted = 0  # failures that use up an attempt
        #: Why the watch ended the operation, once it has.
        self.watch_reason: str | None = None
        #: The last failure that named a side behind the server (its object store): a later
        #: try's plain timeout, while the server waits on that store, blames the same side.
        self.behind: RetryableError | None = None

    @staticmethod
    def failure(rs: tenacity.RetryCallState) -> RetryableError:
        """The failure of the try that just ended."""
        exc = rs.outcome.exception() if rs.outcome is not None else None
        assert isinstance(exc, RetryableError)  # retry_if_exception_type(RetryableError)
        return exc

    def count(self, rs: tenacity.RetryCallState) -> None:
        """Count the failure unless the server was busy (tenacity's ``after`` hook)."""
        exc = self.failure(rs)
        if exc.side in ("store", "direct"):
            self.behind = exc
        self.counted += 0 if exc.busy else 1

    def by_attempts(self, rs: tenacity.RetryCallState) -> tenacity.RetryCallState:
        """A copy of ``rs`` whose ``attempt_number`` is the attempts used up."""
        numbered = copy.copy(rs)
        numbered.attempt_number = self.counted
        return numbered

    def sleep(self, seconds: float) -> None:
        """Sleep (tenacity's ``sleep``); a fake sleep (tests) counts as elapsed time."""
        if self.policy.sleep is None:
            time.sleep(seconds)
        else:
            self.policy.sleep(seconds)
            self.pace.slept += seconds

    def give_up(self, rs: tenacity.RetryCallState) -> NoReturn:
        """Raise the error that names the side and the rule (``retry_error_callback``).

        The stops are tried in order (watch, attempts, stall bound) and the first that holds
        ends the operation, so the rule is the first of them that holds now.
        """
        exc = self.failure(rs)
        n = rs.attempt_number
        if self.watch_reason is not None:
            # The last try's own failure first (what this fetch saw), then why no more tries.
            detail = f"{exc.reason}; then {self.watch_reason}"
            side = self.behind if exc.side == "server" and self.behind is not None else exc
            raise TransportError(_sided(self.what, n, detail, side, self.policy)) from None
        if self.counted >= self.policy.attempts:
            raise TransportError(
                _message(self.what, n, exc, self.policy, self.pace, None)
            ) from None
        if self.watch is not None:
            self.watch.record(
                f"{exc.reason}; nothing counted for {self.pace.silent_s():.0f} s "
                f"({self.pace.why()})"
            )
        wait_s = rs.upcoming_sleep
        raise TransportError(_message(self.what, n, exc, self.policy, self.pace, wait_s)) from None


class _Backoff(wait_base):
    """The wait before the next try: tenacity's full-jitter exponential backoff, or the
    server's ``Retry-After``.

    Kept as our own strategy because tenacity has no rule for either bound: a
    ``Retry-After`` never makes us ask sooner than the upper end of the backoff (busy answers
    use up no attempt, so a tiny one would have us ask again and again until the stall
    bound), and our own backoff leaves the next try half the time left (a try that made
    progress just now must not be given up because the draw ran past the bound).
    """

    def __init__(self, tries: _Tries) -> None:
        # The first failure's window is twice the base (the base is the window before any
        # failure, which a busy answer sees); tenacity numbers it 1, its exponent 0.
        first = 2.0 * tries.policy.backoff_s
        self.tries = tries
        self.jittered = tenacity.wait_random_exponential(multiplier=first, max=BACKOFF_CAP_S)
        self.upper = tenacity.wait_exponential(multiplier=first, max=BACKOFF_CAP_S)

    def __call__(self, retry_state: tenacity.RetryCallState) -> float:
        """Seconds to wait before the next try."""
        numbered = self.tries.by_attempts(retry_state)
        retry_after = self.tries.failure(retry_state).retry_after
        if retry_after is not None:
            return max(retry_after, self.upper(numbered))
        return min(self.jittered(numbered), max(self.tries.pace.left_s(), 0.0) / 2)


class _OnAttempts(stop_base):
    """A tenacity stop applied to the attempts used up rather than the tries made."""

    def __init__(self, tries: _Tries, stop: stop_base) -> None:
        self.tries = tries
        self.stop = stop

    def __call__(self, retry_state: tenacity.RetryCallState) -> bool:
        """Whether the attempts are used up."""
        return self.stop(self.tries.by_attempts(retry_state))


class _StallBound(stop_base):
    """Stop when the next try would start past the stall bound.

    Kept as our own strategy because tenacity's ``stop_before_delay`` measures from the first
    try, and the bound is on the time since the last progress (which the minimum rate
    decides, :class:`~rayform._net._pace.Pace`) plus the wait tenacity has just computed.
    """

    def __init__(self, tries: _Tries) -> None:
        self.tries = tries

    def __call__(self, retry_state: tenacity.RetryCallState) -> bool:
        """Whether the next try would start past the bound."""
        silent_s = self.tries.pace.silent_s()
        return silent_s + retry_state.upcoming_sleep >= self.tries.policy.stall_timeout_s


class _Watched(stop_base):
    """Stop when the watch says so (another download of the store just found it stalled)."""

    def __init__(self, tries: _Tries, watch: Watch) -> None:
        self.tries = tries
        self.watch = watch

    def __call__(self, retry_state: tenacity.RetryCallState) -> bool:
        """Whether the watch ends the operation (asked once per failure: it may claim)."""
        self.tries.watch_reason = self.watch.check(self.tries.pace)
        return self.tries.watch_reason is not None


def check_first(policy: RetryPolicy, what: str, pace: Pace, watch: Watch | None) -> None:
    """Raise the error that ends the operation before its first try, if ``watch`` says so
    (this process has just seen the store stall).

    Raises:
        TransportError: the operation is not to be tried now.
    """
    reason = watch.check(pace, claim=False) if watch is not None else None
    if reason is not None:
        message = _sided(what, 0, reason, RetryableError("not tried"), policy)
        raise TransportError(message.replace("after 0 attempts", "before its first attempt"))


def run_with_retries(
    policy: RetryPolicy,
    what: str,
    fn: Callable[[float], T],
    *,
    pace: Pace | None = None,
    watch: Watch | None = None,
) -> T:
    """Run ``fn(seconds_left)`` until it returns, retrying :class:`RetryableError` failures.

    Args:
        policy: attempts and time bound.
        what: the operation, for logs and errors (e.g. ``"downloading blob 1a2b..."``).
        fn: one attempt; its argument is the time left in seconds (use it as its timeout).
        pace: the operation's progress, fed by ``fn`` with the bytes it receives (progress
            restarts the clock, not the attempts); default: no progress short of success.
        watch: what else may end the operation early (another download's stall).

    Raises:
        TransportError: attempts or time ran out, or ``watch`` ended it; the message names
            the side that failed and, for time, the rule.
    """
    pace = pace if pace is not None else Pace(policy.stall_timeout_s)
    check_first(policy, what, pace, watch)
    tries = _Tries(policy, what, pace, watch)
    stop: stop_base = _OnAttempts(
        tries, tenacity.stop_after_attempt(policy.attempts)
    ) | _StallBound(tries)
    if watch is not None:
        stop = _Watched(tries, watch) | stop
    retrying = tenacity.Retrying(
        retry=tenacity.retry_if_exception_type(RetryableError),
        after=tries.count,
        wait=_Backoff(tries),
        stop=stop,
        before_sleep=tenacity.before_sleep_log(log, logging.INFO),
        sleep=tries.sleep,
        retry_error_callback=tries.give_up,
        name=what,
    )
    # tenacity's loop form: the log names the operation (``name``), not a lambda.
    for attempt in retrying:
        with attempt:
            result = fn(max(pace.left_s(), 0.05))
    return result
