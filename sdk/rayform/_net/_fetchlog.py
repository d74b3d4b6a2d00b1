"""What fetching cost: per-process counters, rate-limited progress lines and summaries.

Every blob fetched on demand (a sample needed it and waited: *stall time*) or ahead of need
(read-ahead threads) is counted here, with cache hits and evictions. Progress goes to the
``rayform.fetch`` logger at INFO, at most one line every ``interval_s`` seconds; callers log a
summary per epoch with :meth:`FetchLog.summary`.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, fields

from rayform._process import PerProcess
from rayform.units import human_bytes

__all__ = ["FetchCounts", "FetchLog", "ahead", "fetch_log", "mark_ahead"]

log = logging.getLogger("rayform.fetch")

_AHEAD = threading.local()


@dataclass
class FetchCounts:
    """Counters of one process (since it started, or since the last :meth:`FetchLog.take`).

    Attributes:
        fetched_blobs: blobs downloaded (either way).
        fetched_bytes: their bytes.
        ahead_bytes: bytes downloaded by read-ahead, before a sample needed them.
        hits: blob lookups answered by the cache.
        evicted_blobs: blobs this process evicted to keep the cache under its limit.
        evicted_bytes: their bytes.
        stall_s: seconds samples waited on downloads (fetches on demand).
    """

    fetched_blobs: int = 0
    fetched_bytes: int = 0
    ahead_bytes: int = 0
    hits: int = 0
    evicted_blobs: int = 0
    evicted_bytes: int = 0
    stall_s: float = 0.0


class _Counters:
    """One process's counters (since the last take, and since it started)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.counts = FetchCounts()
        self.total = FetchCounts()
        self.last_log = time.monotonic()
        self.logged_bytes = 0


class FetchLog:
    """Thread-safe counters plus rate-limited progress logging; per process (a forked or
    spawned worker counts its own fetches from zero)."""

    def __init__(self, interval_s: float = 5.0) -> None:
        self.interval_s = interval_s
        self._counters: PerProcess[_Counters] = PerProcess(_Counters)

    def _add(self, **kw: float) -> None:
        c = self._counters.get()
        with c.lock:
            for counts in (c.counts, c.total):
                for k, v in kw.items():
                    setattr(counts, k, getattr(counts, k) + v)
            now = time.monotonic()
            if kw.get("fetched_bytes") and now - c.last_log >= self.interval_s:
                rate = (c.total.fetched_bytes - c.logged_bytes) / (now - c.last_log)
                log.info(
                    "fetched %d blobs (%s, %s/s) so far, %s of it ahead of need, %.1f s stalled",
                    c.total.fetched_blobs,
                    human_bytes(c.total.fetched_bytes),
                    human_bytes(rate),
                    human_bytes(c.total.ahead_bytes),
                    c.total.stall_s,
                )
                c.last_log, c.logged_bytes = now, c.total.fetched_bytes

    def fetched(self, nbytes: int, seconds: float) -> None:
        """A blob of ``nbytes`` was downloaded in ``seconds`` (stall time unless read-ahead)."""
        if ahead():
            self._add(fetched_blobs=1, fetched_bytes=nbytes, ahead_bytes=nbytes)
        else:
            self._add(fetched_blobs=1, fetched_bytes=nbytes, stall_s=seconds)

    def waited(self, seconds: float) -> None:
        """A sample waited ``seconds`` for a blob someone else was downloading."""
        if not ahead():
            self._add(stall_s=seconds)

    def hit(self) -> None:
        self._add(hits=1)

    def evicted(self, blobs: int, nbytes: int) -> None:
        self._add(evicted_blobs=blobs, evicted_bytes=nbytes)

    def take(self) -> FetchCounts:
        """The counters since the last call, and start again from zero."""
        c = self._counters.get()
        with c.lock:
            out, c.counts = c.counts, FetchCounts()
        return out

    def total(self) -> FetchCounts:
        """The counters since this process started."""
        c = self._counters.get()
        with c.lock:
            return FetchCounts(**{f.name: getattr(c.total, f.name) for f in fields(FetchCounts)})

    @staticmethod
    def summary(c: FetchCounts) -> str:
        """One line: bytes fetched, cache hits, evictions, stall time."""
        return (
            f"fetched {c.fetched_blobs} blobs ({human_bytes(c.fetched_bytes)}, "
            f"{human_bytes(c.ahead_bytes)} of it by read-ahead), {c.hits} cache hits, "
            f"{c.evicted_blobs} evictions ({human_bytes(c.evicted_bytes)}), "
            f"{c.stall_s:.1f} s stalled on downloads"
        )


def ahead() -> bool:
    """True in a read-ahead thread (its fetches are not stall time)."""
    return bool(getattr(_AHEAD, "on", False))


def mark_ahead() -> None:
    """Mark the calling thread as a read-ahead thread."""
    _AHEAD.on = True


_LOG = FetchLog()


def fetch_log() -> FetchLog:
    """This process's fetch counters."""
    return _LOG
