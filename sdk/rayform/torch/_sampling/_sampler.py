"""``EpisodeSampler``: the one place that decides sample order, DDP shards and resume.

Use it instead of ``DataLoader(shuffle=True)``, whose order comes from torch's global RNG::

    loader = DataLoader(dataset, sampler=EpisodeSampler(dataset), batch_size=64, num_workers=8)
    for epoch in range(start_epoch, n_epochs):
        dataset.set_epoch(epoch)      # the sampler reads the dataset's epoch when iterated
        for batch in loader: ...

The order is a pure function of ``(seed, epoch, history, rank, position)`` (``_order.py``,
``_perm.py``): nothing is drawn from a global RNG and no epoch is replayed to reach a position.
Under DDP each rank reads its own shard of the dataset's episodes (``dataset.shard``). The
sampler's state (``state_dict``) is a few integers: the epoch and, per world size the epoch ran
at, how many keys every rank consumed. Loading it resumes at the next key, on any number of
workers and, elastically, on any number of ranks.

It yields :class:`SampleKey` ``(index, epoch)``: the datasets accept them like plain ``int``
indices and use the carried epoch for per-sample randomness, so a persistent worker that kept
an old copy of the dataset still sees the right epoch.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, NamedTuple

import numpy as np
from torch.utils.data import Sampler

from rayform._checks import check_int, is_int
from rayform.errors import InvalidArgumentError
from rayform.torch._sampling._contract import SamplerDataset
from rayform.torch._sampling._order import IndexStream, Part, plan
from rayform.torch._sampling._window import AUTO, WindowChoice, choose_window

__all__ = ["EpisodeSampler", "SampleKey"]

STATE_FORMAT = "rayform.EpisodeSampler/1"
_CHUNK = 8192


class SampleKey(NamedTuple):
    """A dataset key from :class:`EpisodeSampler`: the dataset index and the epoch."""

    sample: int
    epoch: int


class _Cursor(NamedTuple):
    epoch: int
    history: list[list[int]]
    part: Part
    streams: list[IndexStream]


class EpisodeSampler(Sampler[SampleKey]):
    """This rank's keys of one epoch, in an order fixed by (seed, epoch), resumable.

    Args:
        dataset: an :class:`~rayform.torch.EpisodeDataset` or
            :class:`~rayform.torch.MixtureDataset` (its ``seed``, ``epoch`` and ``shard``).
        shuffle: shuffle within each rank's shard; ``False`` reads it in dataset order.
        window: ``"auto"`` (default): a full shuffle, unless the client has a ``cache_limit``
            that the blobs read do not fit; then the largest window whose episodes take at most
            half the limit per local rank (``rayform.torch._sampling._window``; logged once at INFO on
            the ``rayform.sampler`` logger, and in :meth:`describe`). ``None`` shuffles each
            rank's whole shard. A number of episodes shuffles the shard's episodes and reads
            them ``window`` at a time, the samples of each window shuffled together: every
            sample is still read once per epoch in a seeded random order, but at any time from
            about ``window`` episodes, so a cache smaller than the data holds what is being
            read instead of fetching each episode again for every sample. A number is only for
            an ``EpisodeDataset``; ``"auto"`` gives a ``MixtureDataset`` a full shuffle.

    ``len(sampler)`` is the number of keys the next (or current) iteration yields on this
    rank: the same on every rank, so DDP never waits for a rank that ran out.
    """

    def __init__(
        self, dataset: SamplerDataset, shuffle: bool = True, window: int | str | None = AUTO
    ) -> None:
        if not isinstance(dataset, SamplerDataset):
            raise InvalidArgumentError(
                f"EpisodeSampler needs a rayform.torch.EpisodeDataset or MixtureDataset (or a dataset "
                f"implementing rayform.torch.SamplerDataset), got {type(dataset).__name__}"
            )
        self.dataset = dataset
        self.shuffle = bool(shuffle)
        self._choice: WindowChoice = choose_window(dataset, window, self.shuffle)
        self._use_window(self._choice)
        self._pending: dict[str, Any] | None = None  # loaded, applies to the next iteration
        self._live: _Cursor | None = None  # the current (or last) iteration
        self._start = 0  # position in the part where the live iteration began
        self._yielded = 0  # keys the live iteration yielded

    def _use_window(self, choice: WindowChoice) -> None:
        self._choice = choice
        self.window = choice.window
        if self.window is not None and not self.dataset.accepts_window:
            raise InvalidArgumentError(
                f"EpisodeSampler(window={self.window}) needs a dataset that accepts a shuffle window; "
                f"a {type(self.dataset).__name__} does not (a MixtureDataset draws across its "
                "sources): use window=None"
            )
        self.dataset.follow_order(self.shuffle, self.window)  # read-ahead fetches in this order

    def describe(self) -> dict[str, Any]:
        """A JSON-able summary of the order, for experiment trackers: ``shuffle``, ``window``
        (episodes; ``None`` for a full shuffle), ``window_auto`` (chosen by ``"auto"``),
        ``window_reason`` (why), ``seed``."""
        return {
            "shuffle": self.shuffle,
            "window": self.window,
            "window_auto": self._choice.auto,
            "window_reason": self._choice.reason,
            "seed": int(self.dataset.seed),
        }

    # -- iteration -------------------------------------------------------------------------
    def __len__(self) -> int:
        if self._live is not None and self._yielded < self._live.part.length - self._start:
            return self._live.part.length - self._start
        cursor = self._next_cursor(consume=False, strict=False)
        return cursor.part.length - cursor.history[-1][1]

    def __iter__(self) -> Iterator[SampleKey]:
        # A generator: the cursor is taken at the first ``next()``, so iterators that a loader
        # creates and drops before ``load_state_dict`` (StatefulDataLoader does) change nothing.
        cursor = self._next_cursor(consume=True)
        self._live, self._start, self._yielded = cursor, cursor.history[-1][1], 0
        for pos in range(self._start, cursor.part.length, _CHUNK):
            indices = _keys(cursor, np.arange(pos, min(pos + _CHUNK, cursor.part.length)))
            for i in indices.tolist():
                self._yielded += 1
                yield SampleKey(i, cursor.epoch)

    def next_indices(self, k: int) -> np.ndarray:
        """The next ``k`` dataset indices this process will read, ``int64 (<= k,)``.

        For read-ahead: what the current iteration yields after the keys it has yielded so
        far (or, between iterations, what the next one starts with). Fewer than ``k`` at the
        end of the epoch. Costs O(k) whatever the position: nothing is replayed.
        """
        if self._live is not None and self._yielded < self._live.part.length - self._start:
            cursor, pos = self._live, self._start + self._yielded
        else:
            cursor = self._next_cursor(consume=False)
            pos = cursor.history[-1][1]
        return _keys(cursor, np.arange(pos, min(pos + int(k), cursor.part.length)))

    # -- state -----------------------------------------------------------------------------
    def state_dict(self, consumed: int | None = None) -> dict[str, Any]:
        """The position in the epoch: a small JSON-able dict, the same on every rank.

        Args:
            consumed: keys this rank consumed since the current iteration began (in a plain
                loop: ``batches * batch_size``). ``None`` counts the keys the sampler yielded,
                which is right for ``StatefulDataLoader`` (it asks when each batch's keys were
                drawn) and for ``num_workers=0``; with worker processes a plain ``DataLoader``
                draws keys ahead, so pass ``consumed``.

        Returns:
            ``{"format", "epoch", "history", "seed", "shuffle", "window", "dataset"}``; ``history`` is
            ``[[world_size, keys consumed per rank], ...]``, one entry per world size the epoch
            ran at. Save rank 0's after every rank consumed the same number of batches.
        """
        if self._live is None:
            cursor = self._next_cursor(consume=False)
            history = cursor.history
            if consumed not in (None, 0):
                raise InvalidArgumentError(
                    f"consumed={consumed!r} but this sampler has not been iterated: pass 0 or None"
                )
        else:
            done = self._yielded if consumed is None else check_int("consumed", consumed)
            if not 0 <= done <= self._yielded:
                raise InvalidArgumentError(
                    f"consumed={consumed!r}: this iteration yielded {self._yielded} keys; pass the "
                    "number consumed so far (batches * batch_size), between 0 and that"
                )
            history = [list(h) for h in self._live.history]
            history[-1][1] = self._start + done
            cursor = self._live
        return {
            "format": STATE_FORMAT,
            "epoch": cursor.epoch,
            "history": history,
            "seed": int(self.dataset.seed),
            "shuffle": self.shuffle,
            "window": self.window,
            "dataset": self.dataset.order_fingerprint(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume at the next key after ``state`` (from :meth:`state_dict`, any world size).

        The next iteration continues that epoch; ``dataset.set_epoch`` must select the same
        epoch before it (the checkpoint's epoch), or the iteration raises an error.
        """
        if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
            raise InvalidArgumentError(
                f"not an EpisodeSampler state (format {STATE_FORMAT!r} expected): pass what "
                "EpisodeSampler.state_dict() returned"
            )
        if self._choice.auto and state.get("window") != self.window:
            # A saved window wins over a recomputed one (the limit may have changed since), so
            # the epoch goes on in the order it began; states from before "auto" say None.
            saved = state.get("window")
            if saved is not None and (not is_int(saved) or saved < 1):
                raise InvalidArgumentError(f"malformed sampler state window: {saved!r}")
            self._use_window(WindowChoice(saved, True, "the window of the loaded sampler state"))
        mine = {
            "seed": int(self.dataset.seed),
            "shuffle": self.shuffle,
            "window": self.window,
            "dataset": self.dataset.order_fingerprint(),
        }
        for name, value in mine.items():
            if state.get(name) != value:
                raise InvalidArgumentError(
                    f"the sampler state was saved with {name}={state.get(name)!r} but this sampler "
                    f"has {name}={value!r}: resume with the same dataset, seed, shuffle and window"
                )
        history = state.get("history")
        if not isinstance(history, list):
            history = []
        ok = bool(history) and all(
            isinstance(h, (list, tuple))
            and len(h) == 2
            and all(isinstance(x, int) for x in h)
            and h[0] >= 1
            and h[1] >= 0
            for h in history
        )
        if not ok or not isinstance(state.get("epoch"), int):
            raise InvalidArgumentError(f"malformed sampler state history: {history!r}")
        self._pending = {"epoch": int(state["epoch"]), "history": [list(h) for h in history]}
        self._live = None

    @staticmethod
    def state_in(loader_state: dict[str, Any]) -> dict[str, Any]:
        """The sampler's state inside a ``StatefulDataLoader.state_dict()``.

        ``StatefulDataLoader`` refuses a state saved with another ``num_workers``; load this
        into a fresh ``EpisodeSampler`` (and a fresh loader) to resume on any worker count.
        Needs ``snapshot_every_n_steps=1`` (the default), so the snapshot is the last batch.
        """
        if isinstance(loader_state, dict) and loader_state.get("_steps_since_snapshot", 0):
            raise InvalidArgumentError(
                "this StatefulDataLoader state is older than its last batch "
                "(snapshot_every_n_steps > 1): save with snapshot_every_n_steps=1"
            )
        stack: list[Any] = [loader_state]
        while stack:
            item = stack.pop()
            if isinstance(item, dict):
                if item.get("format") == STATE_FORMAT:
                    return item
                stack.extend(item.values())
        raise InvalidArgumentError(
            "no EpisodeSampler state in this loader state: was the loader built with "
            "sampler=EpisodeSampler(dataset)?"
        )

    # -- internals -------------------------------------------------------------------------
    def _next_cursor(self, consume: bool, strict: bool = True) -> _Cursor:
        rank, world = _rank_world(self.dataset)
        epoch = int(self.dataset.epoch)
        pending = self._pending
        if pending is not None and pending["epoch"] != epoch and not strict:
            pending = None  # len() before set_epoch: the length of a fresh epoch, no error
        if pending is None:
            history = [[world, 0]]
        else:
            saved = pending["epoch"]
            if saved != epoch:
                raise InvalidArgumentError(
                    f"the loaded sampler state is in epoch {saved} but the dataset is at epoch "
                    f"{epoch}: call dataset.set_epoch({saved}) before iterating (resume the epoch "
                    "the checkpoint was taken in)"
                )
            history = [list(h) for h in pending["history"]]
            if history[-1][0] != world:  # a new world size reads what is left, re-cut
                history.append([world, 0])
            if consume:
                self._pending = None
        streams = self.dataset.order_streams(history[0][0], epoch, self.shuffle, self.window)
        part = plan([s.length for s in streams], history)[rank]
        return _Cursor(epoch, history, part, streams)


def _keys(cursor: _Cursor, positions: np.ndarray) -> np.ndarray:
    return cursor.part.keys(cursor.streams, positions)


def _rank_world(dataset: SamplerDataset) -> tuple[int, int]:
    rank, world = dataset.shard
    if world == 1 and dataset.shard_auto:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            raise InvalidArgumentError(
                f"the dataset was built before torch.distributed was initialised, so shard='auto' "
                f"found one process, but this is rank {dist.get_rank()} of "
                f"{dist.get_world_size()}: every rank would read the whole epoch. Build the "
                "dataset after init_process_group, or pass shard=None to mean it"
            )
    return int(rank), int(world)
