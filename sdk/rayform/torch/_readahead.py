"""Streaming a cold cache: read-ahead of the blobs that the coming batches need.

The order of an epoch is known in advance: with :class:`~rayform.torch.EpisodeSampler` it is
a pure function of (seed, epoch, rank, position) (``_order.py``). When a batch reaches
``EpisodeDataset.__getitems__``, the dataset calls :meth:`ReadAhead.saw` with its keys; we
find the batch's position in this rank's part of the epoch (an O(1) inverse of the order, no
replay) and schedule, in the background, the missing blobs of the batches *this process* will
read next (a DataLoader hands batches to its workers in turn: worker ``w`` of ``W`` gets
batches ``w, w + W, ...``), up to ``max_bytes`` in flight. Each rank's part is its own shard
(``dataset.shard``), so each rank prefetches only its shard. A resumed epoch at the same world
size continues the same order, so its first batch is found like any other; after an elastic
resume (another world size) the keys are not where the plan puts them and read-ahead waits
for the next epoch (samples are the same either way). Each process keeps a window of the
planned order and where its next batch should start, so a batch costs O(batch size).

Fetching threads are started lazily in the process that reads, never inherited through a
fork nor pickled into a worker, and they exit as soon as there is nothing left to fetch: no
thread outlives the work (nor, with ``num_workers=0``, the loader). A failed read-ahead is
only logged: the sample that needs the blob fetches it on demand and raises the real error.
Read-ahead changes when bytes arrive, never which samples come out.
"""

from __future__ import annotations

import collections
import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from rayform._net import FetchLog, fetch_log, mark_ahead
from rayform._process import PerProcess
from rayform._resolution import Target
from rayform.cache import Pins
from rayform.torch._blobs import segment_blobs
from rayform.torch._index import GridIndex
from rayform.torch._sampling import IndexStream, Part, ahead_bytes, plan

if TYPE_CHECKING:
    from rayform._seams import BlobSource
    from rayform.manifest import BlobRef

__all__ = ["OrderStreams", "ReadAhead"]

log = logging.getLogger("rayform.fetch")

_THREADS = 4
_MAX_BATCHES_AHEAD = 32
#: Planned positions computed at once at least (small batches: one call's fixed cost shared).
_MIN_WINDOW = 4096


#: An order of EpisodeSampler: ``(shuffle, window)``.
Order = tuple[bool, int | None]
#: ``(world, epoch, shuffle, window) -> one IndexStream per rank``: how an epoch is laid out
#: (``EpisodeDataset.order_streams``).
OrderStreams = Callable[[int, int, bool, int | None], list[IndexStream]]


class _EpochPlan:
    """This rank's part of one epoch as a fresh sampler lays it out, with O(batch) lookups."""

    def __init__(
        self,
        order_streams: OrderStreams,
        shard: tuple[int, int],
        locate: Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]],
        epoch: int,
        order: Order,
    ) -> None:
        rank, world = shard
        self.epoch, self.order = epoch, order
        self.streams: list[IndexStream] = order_streams(world, epoch, *order)
        self.part: Part = plan([s.length for s in self.streams], [[world, 0]])[rank]
        self._locate = locate  # flat indices -> (episode, step): the grid's
        # Indices (and their episodes) of positions lo .. lo + len(vals) - 1, computed a window
        # at a time: one vectorised call serves the next batches, not one small call per batch.
        self._lo, self._vals, self._segs = (
            0,
            np.zeros(0, dtype=np.int64),
            np.zeros(0, dtype=np.int64),
        )

    def position(self, index: int) -> int | None:
        """Where this rank's part reads dataset ``index`` (its first read), or ``None``."""
        for s, stream in enumerate(self.streams):
            slot_of = getattr(stream, "slot_of", None)
            if slot_of is None:
                return None  # a stream without an inverse (a mixture's): no plan
            slot = slot_of(index)
            if slot is not None:
                return self.part.position_of(s, slot)
        return None

    def indices(self, start: int, stop: int, window: int = 0) -> np.ndarray:
        """Dataset indices at positions ``start .. stop - 1`` of the part, ``int64 (N,)``.

        ``window``: positions to compute (and keep) at once when ``start .. stop`` is not kept,
        half of them before ``start``: the batch being read lags the furthest one scheduled.
        """
        kept = self._keep(start, stop, window)  # first: it may replace the kept window
        return self._vals[kept]

    def episodes(self, start: int, stop: int, window: int = 0) -> np.ndarray:
        """Episode (segment) positions of those indices, ``int64 (N,)``."""
        kept = self._keep(start, stop, window)
        return self._segs[kept]

    def _keep(self, start: int, stop: int, window: int) -> slice:
        start, stop = max(start, 0), min(stop, self.part.length)
        if start >= stop:
            return slice(0, 0)
        if not (self._lo <= start and stop <= self._lo + len(self._vals)):
            lo = max(start - window // 2, 0)
            self._lo, self._vals = lo, self._compute(lo, max(stop, start + window // 2))
            self._segs = self._locate(self._vals)[0]
        return slice(start - self._lo, stop - self._lo)

    def _compute(self, start: int, stop: int) -> np.ndarray:
        return self.part.keys(
            self.streams, np.arange(start, min(stop, self.part.length), dtype=np.int64)
        )


class _State:
    """What one process's read-ahead holds: never crosses a fork or a pickle."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.queue: collections.deque[Any] = collections.deque()
        self.scheduled: set[str] = set()
        self.present: set[str] = set()  # seen in the cache (not trusted under a cache limit)
        self.present_segments: set[int] = set()  # episodes whose blobs are all in ``present``
        self.done_until: tuple[int, int] = (-1, -1)  # (epoch, batch start) fully handled
        self.in_flight = 0  # bytes queued or downloading
        self.workers: list[threading.Thread] = []
        self.plans: dict[Order, _EpochPlan | None] = {}  # of epoch ``plan_epoch``, by order
        self.plan_epoch = -1
        self.order: Order = (True, None)  # the order the last batch followed
        self.expect = -1  # where this process's next batch starts in the plan, if it follows it
        #: Blobs of the window being read and of the episodes ahead: pins held at least.
        self.keep_pins = 0
        self.epoch_seen: int | None = None
        self.closed = False


class ReadAhead:
    """Background prefetch of the blobs of the batches a process will read next.

    Args:
        source: the slice the blobs come from.
        index: the dataset's grid (which episode each index reads).
        names: the streams read (observations and action).
        targets: camera stream -> training resolution (which rendition it reads), or ``None``.
        shard: ``(rank, world_size)`` of this process.
        order_streams: how an epoch is laid out (:data:`OrderStreams`).
        max_bytes: bytes of blobs in flight at most (0 turns read-ahead off).
        pins: this process's reader pins (``None`` without a cache limit): under a limit, what
            is fetched ahead is pinned there, so the reader finds it pinned already.
        threads: parallel downloads.
    """

    def __init__(
        self,
        source: BlobSource,
        index: GridIndex,
        names: Sequence[str],
        targets: Mapping[str, Target] | None,
        shard: tuple[int, int],
        order_streams: OrderStreams,
        max_bytes: int,
        pins: Callable[[], Pins | None] | None = None,
        threads: int = _THREADS,
    ) -> None:
        self.source = source
        self.index = index
        self.names = list(names)
        self.targets = dict(targets or {})
        self.shard = shard
        self.order_streams = order_streams
        self.max_bytes = max_bytes
        self.pins = pins
        self.threads = threads
        # The orders a batch is looked for in, most likely first: EpisodeSampler's defaults,
        # and any other its constructor announced (a plain attribute: workers inherit it).
        self.orders: list[Order] = [(True, None), (False, None)]
        self._state: PerProcess[_State] = PerProcess(_State)

    def follow(self, shuffle: bool, window: int | None) -> None:
        """An :class:`~rayform.torch.EpisodeSampler` with this order reads the dataset."""
        order = (bool(shuffle), window)
        if order in self.orders:
            self.orders.remove(order)
        self.orders.insert(0, order)

    # -- planning --------------------------------------------------------------------------
    def _plan(self, st: _State, epoch: int, order: Order) -> _EpochPlan | None:
        """This rank's planned part of ``epoch``, or None if it cannot be planned."""
        if st.plan_epoch != epoch:
            st.plans, st.plan_epoch = {}, epoch
        if order not in st.plans:
            try:
                st.plans[order] = _EpochPlan(
                    self.order_streams, self.shard, self.index.locate, epoch, order
                )
            except (
                Exception
            ) as exc:  # an order we cannot replay: no read-ahead, nothing else changes
                log.debug("read-ahead off: cannot plan epoch %d (%s)", epoch, exc)
                st.plans[order] = None
        return st.plans[order]

    def _locate(
        self, st: _State, epoch: int, wanted: list[int], window: int
    ) -> tuple[_EpochPlan, int] | None:
        """The plan and position of the batch ``wanted``: where the last batch said it would
        be, else found by inverting the orders of :attr:`orders` (the last one followed
        first); None if no order reads it there."""
        bs = len(wanted)
        planned = self._plan(st, epoch, st.order)
        first = st.expect
        if (
            planned is not None
            and first >= 0
            and planned.indices(first, first + bs, window).tolist() == wanted
        ):
            return planned, first
        for order in [st.order, *(o for o in self.orders if o != st.order)]:
            planned = self._plan(st, epoch, order)
            found = planned.position(wanted[0]) if planned is not None else None
            if (
                planned is not None
                and found is not None
                and planned.indices(found, found + bs, window).tolist() == wanted
            ):
                st.order = order
                return planned, found
        return None

    def saw(self, keys: Sequence[Any]) -> None:
        """A batch with ``keys`` is being read: schedule what the next batches need.

        Costs O(batch): the batch is located by inverting the order, never by a replay.
        """
        if self.max_bytes <= 0 or not keys or not isinstance(keys[0], tuple):
            return  # only EpisodeSampler's (index, epoch) keys come with a known order
        st = self._state.get()
        epoch = int(keys[0][1])
        self._epoch_done(st, epoch)
        from torch.utils.data import get_worker_info

        info = get_worker_info()
        step = info.num_workers if info is not None else 1
        bs = len(keys)
        window = max(2 * step * bs * (_MAX_BATCHES_AHEAD + 1), _MIN_WINDOW)
        located = self._locate(st, epoch, [int(k[0]) for k in keys], window)
        if located is None:
            st.expect = -1
            return  # not the sampler's fresh order (a resume on another number of ranks)
        planned, first = located
        st.expect = first + step * bs
        starts = [first + step * bs * k for k in range(1, _MAX_BATCHES_AHEAD + 1)]
        done_epoch, done_start = st.done_until
        if done_epoch == epoch:  # batches already handled cost nothing again (warm caches)
            starts = [s for s in starts if s > done_start]
        current = planned.episodes(first, first + bs, window).tolist()
        self._schedule(st, planned, starts, bs, epoch, window, current)

    def _schedule(
        self,
        st: _State,
        planned: _EpochPlan,
        starts: list[int],
        bs: int,
        epoch: int,
        positions: int,
        current: Sequence[int] = (),
    ) -> None:
        names = self.names
        slice_ = self.source
        budget = self.max_bytes
        limit = slice_.cache_limit
        if limit is not None:  # the sampler's window has the other half of the limit
            budget = min(budget, ahead_bytes(limit))
        with st.lock:
            window = st.in_flight
        pins = self.pins() if limit is not None and self.pins is not None else None
        trust = limit is None  # under a limit a blob seen cached may be evicted before use
        # Under a limit, also bound how far ahead we look, by the bytes of the coming episodes
        # (cached or not): what was fetched ahead stays in the cache until read, and looking
        # further would evict the blobs being read now to make room for later ones. The
        # episodes of the batch being read do not count (the window's half of the limit holds
        # them), so the next window arrives while this one is read.
        horizon, seen, keep = 0, set(current), 0
        if limit is not None:  # pins for the window being read and the episodes ahead
            keep = sum(
                len(segment_blobs(self.index.segments[s], names, self.targets)) for s in seen
            )
        # The blobs to fetch are started together, once chosen: announced first, so the first
        # download asks the server for all their URLs in one request.
        chosen: dict[str, BlobRef] = {}
        try:
            for start in starts:
                seg_pos = planned.episodes(start, start + bs, positions)
                if not len(seg_pos):
                    break
                for s in dict.fromkeys(seg_pos.tolist()):
                    if s in st.present_segments:
                        continue
                    cached = 0
                    refs = segment_blobs(self.index.segments[s], names, self.targets)
                    if limit is not None and s not in seen:
                        seen.add(s)
                        size = sum(r.size for r in refs.values())
                        if horizon and horizon + size > budget:
                            return  # at least one episode ahead, however large
                        horizon += size
                        keep += len(refs)
                        st.keep_pins = max(st.keep_pins, keep)
                    for ref in refs.values():
                        if ref.hash in st.present:
                            cached += 1
                            continue
                        if pins is not None and pins.holds(ref.hash):
                            continue  # cached, and kept while pinned: no stat (but may go later)
                        with st.lock:
                            if ref.hash in st.scheduled or ref.hash in chosen:
                                continue
                        if not slice_.would_fetch(ref):  # cached (or offline: nothing to fetch)
                            if trust:
                                st.present.add(ref.hash)
                                cached += 1
                            elif pins is None or not pins.holds(ref.hash):
                                # another process fetched it: pin it here too, or an eviction
                                # could take it between two of this process's batches
                                self._enqueue(st, ref, nbytes=0)
                            continue
                        window += ref.size
                        if window > budget:
                            return  # this batch is not done: look at it again next time
                        chosen[ref.hash] = ref
                    if cached == len(refs):  # every blob of the episode is here: skip it now
                        st.present_segments.add(s)
                st.done_until = (epoch, start)
        finally:
            if chosen:
                expect = getattr(slice_, "expect_blobs", None)  # an optional hint of the seam
                if expect is not None:
                    expect(list(chosen.values()))
                for ref in chosen.values():
                    self._enqueue(st, ref)

    # -- fetching --------------------------------------------------------------------------
    def _enqueue(self, st: _State, ref: BlobRef, nbytes: int | None = None) -> None:
        """Fetch (or, already cached, only pin) ``ref`` in the background; ``nbytes``: what it
        adds to the bytes in flight (its size unless given)."""
        size = ref.size if nbytes is None else nbytes
        with st.lock:
            if st.closed:
                return
            st.scheduled.add(ref.hash)
            st.queue.append((ref, size))
            st.in_flight += size
            st.workers = [t for t in st.workers if t.is_alive()]
            if len(st.workers) < min(self.threads, len(st.queue)):
                t = threading.Thread(
                    target=self._work, args=(st,), name="rayform-readahead", daemon=True
                )
                st.workers.append(t)
                t.start()

    def _work(self, st: _State) -> None:
        mark_ahead()
        slice_ = self.source
        while True:
            with st.lock:
                if not st.queue or st.closed:
                    return  # nothing left: the thread ends (none outlives the work)
                ref, size = st.queue.popleft()
            try:
                path = slice_.blob_path(ref)
                pins = None
                if slice_.cache_limit is not None and self.pins is not None:
                    pins = self.pins()
                if pins is not None:  # scheduled to read: keep it
                    pins.keep_at_least(st.keep_pins)
                    pins.pin(path)
            except Exception as exc:  # the reader fetches it on demand and raises the real error
                log.debug("read-ahead of blob %s... failed: %s", ref.hash[:12], exc)
            finally:
                with st.lock:
                    st.in_flight -= size
                    st.scheduled.discard(ref.hash)  # cached now (or failed): the cache says

    def _epoch_done(self, st: _State, epoch: int) -> None:
        """Log the summary of the previous epoch when a new one starts."""
        if st.epoch_seen is not None and epoch != st.epoch_seen:
            log.info("epoch %d: %s", st.epoch_seen, FetchLog.summary(fetch_log().take()))
        elif st.epoch_seen is None:
            fetch_log().take()
        st.epoch_seen = epoch

    def join(self, timeout_s: float | None = None) -> bool:
        """Wait until every scheduled blob is fetched; True if no read-ahead thread is left."""
        st = self._state.peek()
        if st is None:
            return True
        for t in list(st.workers):
            t.join(timeout_s)
        return not any(t.is_alive() for t in st.workers)

    def close(self) -> None:
        """Stop scheduling; running downloads finish, queued ones are dropped."""
        st = self._state.get()
        with st.lock:
            st.closed = True
            st.queue.clear()
