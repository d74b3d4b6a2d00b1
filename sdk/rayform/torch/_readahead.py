"""Streaming a cold cache: read-ahead of the blobs that the coming batches need.

The order of an epoch is known in advance: with :class:`~rayform.torch.EpisodeSampler` it
depends only on (seed, epoch). When a batch reaches ``EpisodeDataset.__getitems__``, the
dataset calls :meth:`ReadAhead.saw` with its keys; we find the batch in the epoch's planned
order and schedule, in the background, the missing blobs of the batches *this process* will
read next (a DataLoader hands batches to its workers in turn: worker ``w`` of ``W`` gets
batches ``w, w + W, ...``), up to ``max_bytes`` in flight. Each rank's sampler covers its own
shard, so each rank prefetches only its shard.

Fetching threads are started lazily in the process that reads, never inherited through a
fork nor pickled into a worker, and they exit as soon as there is nothing left to fetch: no
thread outlives the work (nor, with ``num_workers=0``, the loader). A failed read-ahead is
only logged: the sample that needs the blob fetches it on demand and raises the real error.
Read-ahead changes when bytes arrive, never which samples come out.
"""

from __future__ import annotations

import collections
import logging
import os
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from rayform._evict import Pins, check_fits
from rayform._fetchlog import FetchLog, fetch_log, mark_ahead

__all__ = ["ReadAhead", "check_cache_fits", "reader_pins", "segment_blobs"]

log = logging.getLogger("rayform.fetch")

#: Default bytes read-ahead may have in flight per process.
DEFAULT_READAHEAD_BYTES = 256 << 20
_THREADS = 4
_MAX_BATCHES_AHEAD = 32


def segment_blobs(segment: Any, names: Sequence[str]) -> dict[str, Any]:
    """``{hash: BlobRef}`` of the blobs one segment needs for the streams ``names``."""
    out: dict[str, Any] = {}
    for name in names:
        for ref in segment.streams[name].blobs():
            out[ref.hash] = ref
    return out


def check_cache_fits(slice_: Any, segments: Sequence[Any], names: Sequence[str]) -> None:
    """Raise up front if the largest segment's blobs exceed the client's ``cache_limit``.

    A sample needs every blob of its segment's streams at once; below that, a bounded cache
    would evict what it is reading (or wait forever, in other libraries).
    """
    limit = getattr(getattr(slice_, "client", None), "cache_limit", None)
    if limit is None or not segments:
        return
    sizes = [(sum(r.size for r in segment_blobs(seg, names).values()), seg.id) for seg in segments]
    need, seg_id = max(sizes)
    check_fits(limit, need, f"segment {seg_id}'s blobs for streams {', '.join(names)}")


def reader_pins(slice_: Any, segments: Sequence[Any], names: Sequence[str]) -> Pins | None:
    """The pins of one reading process under a bounded cache (``None`` without a limit).

    They hold the blobs of about one segment (the most recently used): what a batch is reading.
    Older pins are dropped, so a process never holds more of a small cache than it needs.
    """
    if getattr(getattr(slice_, "client", None), "cache_limit", None) is None or not segments:
        return None
    return Pins(len(segment_blobs(segments[0], names)))  # every segment has these streams


class ReadAhead:
    """Background prefetch of the blobs of the batches a process will read next.

    Args:
        dataset: the :class:`~rayform.torch.EpisodeDataset`.
        max_bytes: bytes of blobs in flight at most (0 turns read-ahead off).
        threads: parallel downloads.
    """

    def __init__(self, dataset: Any, max_bytes: int = DEFAULT_READAHEAD_BYTES, threads: int = _THREADS) -> None:
        self.dataset = dataset
        self.max_bytes = max_bytes
        self.threads = threads
        self._reset()

    def __getstate__(self) -> dict[str, Any]:
        return {"dataset": self.dataset, "max_bytes": self.max_bytes, "threads": self.threads}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._reset()

    def _reset(self) -> None:
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._queue: collections.deque[Any] = collections.deque()
        self._scheduled: set[str] = set()
        self._present: set[str] = set()  # seen in the cache (not trusted under a cache limit)
        self._done_until: tuple[int, int] = (-1, -1)  # (epoch, batch start) fully handled
        self._in_flight = 0  # bytes queued or downloading
        self._workers: list[threading.Thread] = []
        self._plan: tuple[int, np.ndarray, np.ndarray] | None = None  # epoch, order, position
        self._pins: Pins | None = None
        self._epoch_seen: int | None = None
        self._closed = False

    # -- planning --------------------------------------------------------------------------
    def _order(self, epoch: int) -> tuple[np.ndarray, np.ndarray] | None:
        """The epoch's planned order of dataset indices and each index's position, or None."""
        if self._plan is not None and self._plan[0] == epoch:
            return self._plan[1], self._plan[2]
        from rayform.torch._sampler import EpisodeSampler

        if self.dataset.epoch != epoch:  # never set the epoch here: workers share it
            return None
        try:
            order = np.fromiter((k[0] if isinstance(k, tuple) else k for k in EpisodeSampler(self.dataset)),
                                dtype=np.int64, count=len(self.dataset))
        except Exception as exc:  # a sampler we cannot replay: no read-ahead, nothing else changes
            log.debug("read-ahead off: cannot plan epoch %d (%s)", epoch, exc)
            return None
        position = np.empty_like(order)
        position[order] = np.arange(len(order))
        self._plan = (epoch, order, position)
        return order, position

    def saw(self, keys: Sequence[Any]) -> None:
        """A batch with ``keys`` is being read: schedule what the next batches need."""
        if self.max_bytes <= 0 or not keys or not isinstance(keys[0], tuple):
            return  # only EpisodeSampler's (index, epoch) keys come with a known order
        if self._pid != os.getpid():
            self._reset()
        client = getattr(self.dataset.slice, "client", None)
        if getattr(client, "offline", True) or not hasattr(client, "cache"):
            return  # offline, or a slice without a Rayform client: nothing to fetch
        epoch = int(keys[0][1])
        self._epoch_done(epoch)
        planned = self._order(epoch)
        if planned is None:
            return
        order, position = planned
        n, bs = len(order), len(keys)
        first = int(position[int(keys[0][0])])
        if any(first + j >= n or order[first + j] != int(k[0]) for j, k in enumerate(keys)):
            return  # not our sampler's order (another sampler, or shuffle=False): no plan
        from torch.utils.data import get_worker_info

        info = get_worker_info()
        step = info.num_workers if info is not None else 1
        starts = [(first // bs + step * k) * bs for k in range(1, _MAX_BATCHES_AHEAD + 1)]
        done_epoch, done_start = self._done_until
        if done_epoch == epoch:  # batches already handled cost nothing again (warm caches)
            starts = [s for s in starts if s > done_start]
        self._schedule(order, starts, bs, epoch)

    def _schedule(self, order: np.ndarray, starts: list[int], bs: int, epoch: int) -> None:
        ds = self.dataset
        names = [*ds.obs, *([ds.action] if ds.action else [])]
        client = ds.slice.client
        budget = self.max_bytes
        limit = getattr(client, "cache_limit", None)
        if limit is not None:  # leave room for what the readers pin
            budget = min(budget, limit // 4)
        with self._lock:
            window = self._in_flight
        trust = limit is None  # under a limit a blob seen cached may be evicted before use
        for start in starts:
            if start >= len(order):
                break
            flat = order[start:start + bs]
            flat = ds._local[flat] if ds._local is not None else flat
            seg_pos, _ = ds._index.locate(flat)
            for s in dict.fromkeys(seg_pos.tolist()):
                for ref in segment_blobs(ds._index.segments[s], names).values():
                    if ref.hash in self._present:
                        continue
                    with self._lock:
                        if ref.hash in self._scheduled:
                            continue
                    if client.cache.has_blob(ref.hash):
                        if trust:
                            self._present.add(ref.hash)
                        continue
                    window += ref.size
                    if window > budget:
                        return  # this batch is not done: look at it again next time
                    self._enqueue(ref)
            self._done_until = (epoch, start)

    # -- fetching --------------------------------------------------------------------------
    def _enqueue(self, ref: Any) -> None:
        with self._lock:
            if self._closed:
                return
            self._scheduled.add(ref.hash)
            self._queue.append(ref)
            self._in_flight += ref.size
            self._workers = [t for t in self._workers if t.is_alive()]
            if len(self._workers) < min(self.threads, len(self._queue)):
                t = threading.Thread(target=self._work, name="rayform-readahead", daemon=True)
                self._workers.append(t)
                t.start()

    def _work(self) -> None:
        mark_ahead()
        slice_ = self.dataset.slice
        while True:
            with self._lock:
                if not self._queue or self._closed:
                    return  # nothing left: the thread ends (none outlives the work)
                ref = self._queue.popleft()
            try:
                path = slice_.blob_path(ref)
                if getattr(slice_.client, "cache_limit", None) is not None:  # scheduled to read: keep it
                    with self._lock:
                        if self._pins is None:
                            self._pins = Pins(max(8, 2 * self.threads))
                    self._pins.pin(path)
            except Exception as exc:  # the reader fetches it on demand and raises the real error
                log.debug("read-ahead of blob %s... failed: %s", ref.hash[:12], exc)
            finally:
                with self._lock:
                    self._in_flight -= ref.size
                    self._scheduled.discard(ref.hash)  # cached now (or failed): the cache says

    def _epoch_done(self, epoch: int) -> None:
        """Log the summary of the previous epoch when a new one starts."""
        if self._epoch_seen is not None and epoch != self._epoch_seen:
            log.info("epoch %d: %s", self._epoch_seen, FetchLog.summary(fetch_log().take()))
        elif self._epoch_seen is None:
            fetch_log().take()
        self._epoch_seen = epoch

    def join(self, timeout_s: float | None = None) -> bool:
        """Wait until every scheduled blob is fetched; True if no read-ahead thread is left."""
        for t in list(self._workers):
            t.join(timeout_s)
        return not any(t.is_alive() for t in self._workers)

    def close(self) -> None:
        """Stop scheduling; running downloads finish, queued ones are dropped."""
        with self._lock:
            self._closed = True
            self._queue.clear()
