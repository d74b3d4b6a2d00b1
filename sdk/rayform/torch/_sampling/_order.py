"""The order of an epoch across ranks, as a pure function of (seed, epoch, history, rank, position).

An epoch is read from *streams*: numbered sequences whose slot ``j`` stands for one dataset
index, computed in O(1) (:class:`RangeStream`, :class:`ArrayStream`; a mixture brings its own).
The first world size of the epoch, ``W0``, fixes the streams: for a plain dataset, stream
``r`` is rank ``r``'s shard read in a seeded shuffled order, so a rank keeps its episodes.

Progress is a *history* ``[(W0, c0), (W1, c1), ...]``: every rank of world ``Wi`` read ``ci``
keys of its part. A segment with world ``W`` cuts what is left (the streams' unread slots, in
stream order) into ``W`` consecutive parts whose sizes differ by at most one, the larger ones
first; each rank reads its part in order, and a rank whose part is one short reads one *pad*
(a distinct slot repeated from the start of the epoch's streams) so that every rank yields the same
number of keys. Hence:

* every slot of the epoch is read exactly once over all segments, plus at most ``W - 1`` pads
  at the end of the last segment (``W`` its world size);
* cutting the leftovers of a world-``W`` segment again at world ``W`` gives every rank exactly
  the rest of its own part, so a same-size resume continues the uninterrupted order and
  ``[(W, a), (W, b)]`` equals ``[(W, a + b)]``;
* locating position ``p`` of a part costs a binary search over its pieces, never a replay.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from rayform.torch._sampling._perm import Permutation, derive_key
from rayform.torch._sampling._shard import assign_episodes, rank_indices

__all__ = [
    "DDP_EVEN",
    "ArrayStream",
    "Part",
    "Piece",
    "RangeStream",
    "IndexStream",
    "WindowStream",
    "episode_streams",
    "plan",
]


#: How shards are cut: consecutive ranges (exact), or whole episodes padded or dropped.
DDP_EVEN = ("split", "pad", "drop")


class IndexStream(Protocol):
    """Slots ``0 .. length - 1``, each standing for one dataset index."""

    length: int

    def keys(self, slots: np.ndarray) -> np.ndarray:
        """Dataset indices ``int64 (N,)`` of ``slots (N,)``."""
        ...


class RangeStream:
    """The indices ``start .. start + length - 1`` in the order of a :class:`Permutation`."""

    def __init__(self, start: int, length: int, perm: Permutation) -> None:
        self.start, self.length, self.perm = int(start), int(length), perm

    def keys(self, slots: np.ndarray) -> np.ndarray:
        return self.start + self.perm(slots)

    def slot_of(self, index: int) -> int | None:
        """The slot whose key is ``index``, or ``None`` if this stream does not read it."""
        if not self.start <= index < self.start + self.length:
            return None
        return int(self.perm.inverse(np.array([index - self.start]))[0])


class ArrayStream:
    """The entries of an index array (built on first use) in the order of a permutation."""

    def __init__(self, length: int, build: Callable[[], np.ndarray], perm: Permutation) -> None:
        self.length, self._build, self.perm = int(length), build, perm
        self._array: np.ndarray | None = None
        self._sorted: tuple[np.ndarray, np.ndarray] | None = None  # for slot_of, built on first use

    def keys(self, slots: np.ndarray) -> np.ndarray:
        """The index entries at ``slots`` (``int64``, any shape) of the permuted order."""
        keys: np.ndarray = self._built()[self.perm(slots)]
        return keys

    def slot_of(self, index: int) -> int | None:
        """The slot whose key is ``index``, or ``None`` if this stream does not read it."""
        if self._sorted is None:
            array = self._built()
            order = np.argsort(array, kind="stable")
            self._sorted = (array[order], order)
        values, at = self._sorted
        j = int(np.searchsorted(values, index))
        if j >= len(values) or values[j] != index or at[j] >= self.length:
            return None
        return int(self.perm.inverse(np.array([at[j]]))[0])

    def _built(self) -> np.ndarray:
        if self._array is None:
            self._array = np.asarray(self._build(), dtype=np.int64)
        return self._array


class WindowStream:
    """A stream read a window of episodes at a time (episode locality for a bounded cache).

    The stream's episodes (runs of its slots that belong to one episode: its *units*) are put
    in a seeded shuffled order and cut into windows of ``window`` consecutive units; slot ``j``
    falls in window ``w`` and is shuffled only among that window's samples. So the epoch
    still visits every slot once in a random order, but at any time it reads from about
    ``window`` episodes (two around a window's edge), whose blobs a cache can hold.

    Args:
        inner: the stream's slots in stream order (its permutation the identity).
        bounds: builds ``int64 (U + 1,)``: the unit boundaries over ``[0, length)``.
        window: units per window (>= 1).
        key: from :func:`derive_key`; window ``w`` is shuffled by a key derived from it and ``w``.
    """

    def __init__(
        self,
        inner: RangeStream | ArrayStream,
        bounds: Callable[[], np.ndarray],
        window: int,
        key: int,
    ) -> None:
        self.length, self._inner, self._bounds, self.window, self._key = (
            inner.length,
            inner,
            bounds,
            int(window),
            key,
        )
        # (unit boundaries, units in visiting order, slot where each of them starts, window
        # starts), built on first use: O(units) integers, never one per sample.
        self._layout: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None = None
        self._rank_of: np.ndarray | None = None  # inverse of the visiting order, for slot_of

    def keys(self, slots: np.ndarray) -> np.ndarray:
        bounds, order, starts, wstart = self._lay()
        slots = np.asarray(slots, dtype=np.int64)
        w = np.searchsorted(wstart, slots, side="right") - 1
        q = np.empty(len(slots), dtype=np.int64)
        for k in np.unique(w).tolist():
            mask = w == k
            q[mask] = wstart[k] + self._window_perm(k)(slots[mask] - wstart[k])
        t = np.searchsorted(starts, q, side="right") - 1
        return self._inner.keys(bounds[order[t]] + q - starts[t])

    def slot_of(self, index: int) -> int | None:
        """The slot whose key is ``index``, or ``None`` if this stream does not read it."""
        pos = self._inner.slot_of(index)
        if pos is None:
            return None
        bounds, order, starts, wstart = self._lay()
        if self._rank_of is None:
            self._rank_of = np.empty(len(order), dtype=np.int64)
            self._rank_of[order] = np.arange(len(order), dtype=np.int64)
        unit = int(np.searchsorted(bounds, pos, side="right")) - 1
        t = int(self._rank_of[unit])
        q = int(starts[t]) + pos - int(bounds[unit])
        k = t // self.window
        return int(wstart[k]) + int(self._window_perm(k).inverse(np.array([q - int(wstart[k])]))[0])

    def _window_perm(self, k: int) -> Permutation:
        _, _, _, wstart = self._lay()
        return Permutation(int(wstart[k + 1] - wstart[k]), derive_key(self._key, "window", k))

    def _lay(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        if self._layout is None:
            bounds = np.asarray(self._bounds(), dtype=np.int64)
            sizes = np.diff(bounds)
            n_units = len(sizes)
            order = Permutation(n_units, self._key)(np.arange(n_units, dtype=np.int64))
            starts = np.zeros(n_units + 1, dtype=np.int64)
            np.cumsum(sizes[order], out=starts[1:])
            wstart = np.append(starts[: n_units : self.window], starts[n_units])
            self._layout = (bounds, order, starts, wstart)
        return self._layout


def episode_streams(
    offsets: np.ndarray,
    world: int,
    ddp_even: str,
    seed: int,
    epoch: int,
    shuffle: bool,
    window: int | None = None,
) -> list[IndexStream]:
    """The streams of a plain dataset whose first world size is ``world``.

    ``"split"`` gives rank ``r`` the ``r``-th of ``world`` consecutive ranges of the dataset's
    index space (episodes in dataset order; sizes differ by at most one, so at most
    ``world - 1`` episodes are cut between two neighbouring ranks). ``"pad"`` and ``"drop"``
    give whole episodes (``rayform.torch._sampling._shard``). Each stream is read in the order of a
    permutation keyed by ``(seed, epoch, world, rank)``, or with ``window`` (and ``shuffle``)
    a :class:`WindowStream` of that many episodes keyed alike.
    """
    offsets = np.asarray(offsets, dtype=np.int64)
    n = int(offsets[-1])
    windowed = shuffle and window is not None

    def perm(r: int, m: int) -> Permutation:
        return Permutation(
            m, derive_key("episode", seed, epoch, world, r), shuffle and not windowed
        )

    def windows(
        inner: RangeStream | ArrayStream, r: int, bounds: Callable[[], np.ndarray]
    ) -> IndexStream:
        if not windowed:
            return inner
        return WindowStream(
            inner, bounds, int(window or 1), derive_key("window", seed, epoch, world, r)
        )

    if ddp_even == "split" or world == 1:
        q, rem = divmod(n, world)
        out: list[IndexStream] = []
        for r in range(world):
            m, start = q + (r < rem), r * q + min(r, rem)

            def range_bounds(start: int = start, m: int = m) -> np.ndarray:
                return np.unique(np.clip(offsets, start, start + m)) - start

            out.append(windows(RangeStream(start, m, perm(r, m)), r, range_bounds))
        return out
    counts = np.diff(offsets)
    loads = np.bincount(assign_episodes(counts, world), weights=counts, minlength=world)
    m = int(loads.max() if ddp_even == "pad" else loads.min())

    def build(r: int) -> Callable[[], np.ndarray]:
        return lambda: rank_indices(offsets, r, world, ddp_even)

    def array_bounds(stream: ArrayStream) -> Callable[[], np.ndarray]:
        def bounds() -> np.ndarray:  # runs of one episode in the rank's index array
            array = stream._built()[: stream.length]
            episode = np.searchsorted(offsets, array, side="right") - 1
            cuts = np.flatnonzero(episode[1:] != episode[:-1]) + 1
            return np.concatenate([[0], cuts, [len(array)]]).astype(np.int64)

        return bounds

    streams = [ArrayStream(m, build(r), perm(r, m)) for r in range(world)]
    return [windows(s, r, array_bounds(s)) for r, s in enumerate(streams)]


@dataclass(frozen=True)
class Piece:
    """Slots ``lo .. hi - 1`` of stream ``stream``."""

    stream: int
    lo: int
    hi: int


@dataclass(frozen=True)
class Part:
    """What one rank reads in one segment: its pieces in order, then its pads.

    Attributes:
        pieces: the slots this rank reads, in order.
        pads: ``(stream, slot)`` repeated after them (at most one).
        length: keys every rank of the segment yields (pieces plus pads).
    """

    pieces: tuple[Piece, ...]
    pads: tuple[tuple[int, int], ...]
    length: int

    def locate(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(stream (N,), slot (N,))`` of positions ``0 <= p < length`` of this part."""
        positions = np.asarray(positions, dtype=np.int64)
        sizes = np.array([p.hi - p.lo for p in self.pieces], dtype=np.int64)
        ends = np.cumsum(sizes)
        own = int(ends[-1]) if len(ends) else 0
        stream = np.empty(len(positions), dtype=np.int64)
        slot = np.empty(len(positions), dtype=np.int64)
        real = positions < own
        if real.any():
            at = np.searchsorted(ends, positions[real], side="right")
            starts = ends - sizes
            stream[real] = np.array([p.stream for p in self.pieces], dtype=np.int64)[at]
            lo = np.array([p.lo for p in self.pieces], dtype=np.int64)[at]
            slot[real] = lo + positions[real] - starts[at]
        for j in np.flatnonzero(~real):
            stream[j], slot[j] = self.pads[int(positions[j]) - own]
        return stream, slot

    def keys(self, streams: Sequence[IndexStream], positions: np.ndarray) -> np.ndarray:
        """Dataset indices ``int64 (N,)`` this part reads at ``positions``, given its streams."""
        stream, slot = self.locate(positions)
        out = np.empty(len(stream), dtype=np.int64)
        for s in np.unique(stream).tolist():
            mask = stream == s
            out[mask] = streams[s].keys(slot[mask])
        return out

    def position_of(self, stream: int, slot: int) -> int | None:
        """The first position of this part that reads ``(stream, slot)``, or ``None``."""
        pos = 0
        for p in self.pieces:
            if p.stream == stream and p.lo <= slot < p.hi:
                return pos + slot - p.lo
            pos += p.hi - p.lo
        for j, pad in enumerate(self.pads):
            if pad == (stream, slot):
                return pos + j
        return None


def _take(pieces: Sequence[Piece], start: int, count: int) -> list[Piece]:
    """The slots at positions ``start .. start + count - 1`` of the concatenated ``pieces``."""
    out, pos = [], 0
    for p in pieces:
        size = p.hi - p.lo
        a, b = max(start - pos, 0), min(start + count - pos, size)
        if a < b:
            out.append(Piece(p.stream, p.lo + a, p.lo + b))
        pos += size
        if pos >= start + count:
            break
    return out


def split(pieces: Sequence[Piece], world: int, pad_from: Sequence[Piece]) -> list[Part]:
    """Cut ``pieces`` into ``world`` consecutive parts (see the module docstring).

    Pads repeat distinct slots from the start of ``pad_from`` (the epoch's first pieces), so
    they do not depend on how far the epoch got: a same-size resume pads alike.
    """
    total = sum(p.hi - p.lo for p in pieces)
    q, rem = divmod(total, world)
    length = q + (rem > 0)
    parts, pos = [], 0
    for r in range(world):
        size = q + (r < rem)
        pads: tuple[tuple[int, int], ...] = ()
        if size < length:
            head = _take(pad_from, (r - rem) % sum(p.hi - p.lo for p in pad_from), 1)[0]
            pads = ((head.stream, head.lo),)
        parts.append(Part(tuple(_take(pieces, pos, size)), pads, length))
        pos += size
    return parts


def plan(lengths: Sequence[int], history: Sequence[Sequence[int]]) -> list[Part]:
    """Parts of the last segment of ``history`` over streams of the given ``lengths``.

    Args:
        lengths: slots of each stream (one per rank of the first world size).
        history: ``(world, consumed)`` per segment; every rank of a segment consumed the
            same number of keys (pads included).

    Returns:
        One :class:`Part` per rank of the last segment's world.
    """
    first = [Piece(s, 0, int(m)) for s, m in enumerate(lengths) if m > 0]
    pieces = first
    parts: list[Part] = []
    for i, (world, consumed) in enumerate(history):
        parts = split(pieces, world, first)
        if i < len(history) - 1:
            pieces = [piece for part in parts for piece in _take(part.pieces, consumed, 1 << 62)]
    return parts
