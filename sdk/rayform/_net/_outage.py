"""One stalled store ends the other fetches of it on this host within one stall bound.

A training job fetches from one store in many places at once: each DataLoader worker, and the
read-ahead threads in each. When the store stalls, each fetch waited out its own stall bound,
and a fetch waiting on another's lock started its own bound after it: a job with 8 workers
took 4 to 16 bounds to end (``tests/torch/test_stalled_store_training.py``). So a fetch that
gives up because the store sent nothing for a whole stall bound (the stall rule or the minimum
rate, :mod:`rayform._net._pace`) records it in ``<cache>/tmp/<server>.<host>.outage``, and

* every fetch of the same server on this host that was **already waiting** when the failure
  was recorded (for the blob, or for another process's download of it), and has received
  nothing for at least a quarter of the bound, gives up at once with the recorded reason: the
  store has just proven silent for a whole bound;
* a process that has **itself** had a fetch of the server give up so (or for the first rule)
  lets one fetch at a time ask the store again within one bound after, for at most a quarter
  of the bound, and ends the others before their first request: its read-ahead threads stop
  queueing fresh full-bound waits in front of the sample that needs a blob, and a DataLoader
  worker skips its queued batches and exits promptly (the job is ending anyway). A store that
  is back answers that one fetch at once, and the process is back to full bounds (a notebook
  that retries as soon as the store returns is not refused). After that bound it waits the
  whole bound again.

A fetch that starts after the record, in any other process, tries the store in full: a
transient fault does not poison later runs (nor a later job on the host). The record is per
host (the host name in the file name), because what one node cannot reach another may: a node
whose network failed does not end another node's downloads. Recording is best effort: a
read-only cache keeps the old behaviour (each fetch its own bound).
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from rayform._net._pace import Pace
from rayform._process import PerProcess
from rayform._untrusted import loads

if TYPE_CHECKING:
    from rayform.cache import Cache

__all__ = ["Outages"]

log = logging.getLogger("rayform.transport")

#: Seconds between two looks at the record file while a fetch waits (a stat).
_LOOK_S = 0.5


@dataclass
class _Record:
    at: float  # time.time() of the failure
    pid: int
    reason: str


class _Seen:
    """This process's view: the last record read, and its own last failure."""

    def __init__(self) -> None:
        self.key: tuple[int, int, int] | None = None
        self.record: _Record | None = None
        self.looked = 0.0
        self.mine: _Record | None = None
        self.failed_at: float | None = None
        #: The one download asking the store after this process's failure, and since when.
        self.probe: Pace | None = None
        self.probe_at: float | None = None


class Outages:
    """The stall failures of one server's store on this host (see the module's docstring).

    Args:
        cache: the cache whose ``tmp/`` holds the record.
        name: the record's file name (server and host), e.g. ``127.0.0.1_8765-1a2b3c4d.h.outage``.
        stall_s: the stall bound: the record ends other fetches silent for a quarter of it,
            and this process's new fetches for the whole of it.
    """

    def __init__(self, cache: Cache, name: str, stall_s: float) -> None:
        self.cache = cache
        self.relpath = f"tmp/{name}"
        self.stall_s = stall_s
        self.grace_s = stall_s / 4
        self._seen: PerProcess[_Seen] = PerProcess(_Seen)

    @property
    def path(self) -> Path:
        """The record file."""
        return self.cache.root / self.relpath

    def record(self, reason: str) -> None:
        """A fetch of this process gave up: the store sent nothing for a whole bound."""
        seen = self._seen.get()
        rec = _Record(time.time(), os.getpid(), reason[:2000])
        seen.mine, seen.failed_at = rec, rec.at
        doc = {"at": rec.at, "pid": rec.pid, "reason": rec.reason}
        try:
            self.cache.put_file(self.relpath, json.dumps(doc).encode())
        except Exception as exc:  # an optimisation only: each fetch keeps its own bound
            log.debug("could not record the store's failure in %s: %s", self.path, exc)

    def check(self, pace: Pace, claim: bool = True) -> str | None:
        """Why the fetch measured by ``pace`` should give up now, or None to go on.

        ``claim=False`` asks before a download's first try without taking the one place to
        ask the store that this process has after its own failure (the try takes it).
        """
        seen = self._seen.get()
        now = time.time()
        own = seen.failed_at
        if own is not None and now - own < self.stall_s and pace.idle_since() >= own:
            if pace.received > 0:  # the store answers again: full bounds from now on
                seen.failed_at = seen.probe_at = None
                return None
            if seen.probe is pace:
                if now - pace.idle_since() < self.grace_s:
                    return None
                seen.probe, seen.probe_at = None, now
                return (
                    f"received nothing for {now - pace.idle_since():.0f} s, and another "
                    f"download of this process from the same store gave up {now - own:.0f} s "
                    f"ago (within {self.stall_s:g} s of that, this process asks the store "
                    f"once per {self.grace_s:g} s and waits at most that long)"
                )
            if seen.probe_at is None or now - seen.probe_at >= self.grace_s:
                # One download at a time asks the store (for at most a quarter bound): one
                # that is back answers at once, and the others do not queue bound-long waits.
                if claim:
                    seen.probe, seen.probe_at = pace, now
                return None
            return (
                f"another download of this process from the same store gave up "
                f"{now - own:.0f} s ago, and another is asking it now: this process asks "
                f"the store once per {self.grace_s:g} s until {self.stall_s:g} s after that"
            )
        rec = max(
            (r for r in (self._read(seen), seen.mine) if r is not None),
            key=lambda r: r.at,
            default=None,
        )
        idle_s = now - pace.idle_since()
        if rec is None or rec.at <= pace.idle_since() or idle_s < self.grace_s:
            return None
        # This process gives up on the store too (not recorded in the file: that would stretch
        # the record over fetches that began after the failure).
        seen.failed_at = max(seen.failed_at or 0.0, now)
        return (
            f"received nothing for {idle_s:.0f} s, and another download from the same "
            f"store on this host (process {rec.pid}) gave up "
            f"{max(now - rec.at, 0):.0f} s ago: {rec.reason}"
        )

    def _read(self, seen: _Seen) -> _Record | None:
        mono = time.monotonic()
        if mono - seen.looked < _LOOK_S:
            return seen.record
        seen.looked = mono
        try:
            st = os.stat(self.path)
        except OSError:
            seen.key = seen.record = None
            return None
        key = (st.st_ino, st.st_size, st.st_mtime_ns)
        if key != seen.key:
            seen.key, seen.record = key, None
            try:
                doc = loads(self.path.read_bytes())
                seen.record = _Record(float(doc["at"]), int(doc["pid"]), str(doc["reason"]))
            except Exception:  # being replaced, or not ours to trust: no record
                seen.key = None
        return seen.record
