"""The shuffle window: how many episodes :class:`EpisodeSampler` reads at a time.

A full shuffle over a cache smaller than the data evicts, with every batch, what the next batch
needs, so each batch fetches again most of what it reads. Shuffling within windows of ``W``
episodes (every sample still read once per epoch, in a seeded random order) keeps the cache
holding what is being read, each blob fetched once per epoch (docs/benchmarks.md, "Streaming
from a cold cache").

``window="auto"`` (the default) picks ``W`` from the dataset and the configured limit only, so it
is the same on every rank and in every run, whatever happens to be cached:

* no ``cache_limit``, or the blobs of the streams read all fit under it: a full shuffle;
* otherwise the largest ``W`` whose episodes' blobs take at most **half the limit per local
  rank** (``LOCAL_WORLD_SIZE`` ranks share a node's cache, as under ``torchrun``), at least 1:
  read-ahead holds the next window's episodes in the other half (:func:`ahead_bytes`), so the
  next window arrives while this one is read.
"""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass

from rayform._checks import is_int
from rayform.errors import InvalidArgumentError
from rayform.torch._sampling._contract import CacheFootprint, SamplerDataset
from rayform.units import human_bytes

__all__ = ["AUTO", "WindowChoice", "ahead_bytes", "choose_window"]

log = logging.getLogger("rayform.sampler")

AUTO = "auto"
#: Share of the cache limit the window's episodes may take, per local rank (see module doc).
WINDOW_SHARE = 0.5

_SAID: set[str] = set()
_SAID_LOCK = threading.Lock()


@dataclass(frozen=True)
class WindowChoice:
    """A resolved window: ``window`` episodes (``None``: full shuffle), and why."""

    window: int | None
    auto: bool
    reason: str


def local_ranks() -> int:
    """Processes sharing this node's cache: ``LOCAL_WORLD_SIZE`` (set by torchrun), else 1."""
    try:
        return max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    except ValueError:
        return 1


def ahead_bytes(cache_limit: int) -> int:
    """Bytes of coming episodes read-ahead may hold under ``cache_limit`` (bytes), per local
    rank: the half of the limit that the window leaves."""
    return int(cache_limit * (1 - WINDOW_SHARE) / local_ranks())


def choose_window(dataset: SamplerDataset, window: int | str | None, shuffle: bool) -> WindowChoice:
    """Resolve the sampler's ``window`` argument for ``dataset``.

    Args:
        dataset: the dataset being ordered: its ``cache_footprint()`` tells what an epoch
            needs; a dataset that does not accept a window (a ``MixtureDataset``, whose sources
            are not read episode by episode) gets a full shuffle under ``"auto"``.
        window: ``"auto"``, ``None`` (full shuffle) or a number of episodes >= 1.
        shuffle: the sampler's ``shuffle``; a window needs it.

    Raises:
        InvalidArgumentError: ``window`` is not one of those, or a number with ``shuffle=False``.
    """
    footprint = dataset.cache_footprint()
    if isinstance(window, str) and window == AUTO:
        return _auto(footprint, shuffle, has_footprint=dataset.accepts_window)
    if window is None:
        if shuffle and footprint is not None and footprint.total_bytes > footprint.cache_limit:
            _say_once(
                logging.WARNING,
                (
                    f"EpisodeSampler(window=None) shuffles all {footprint.episodes} episodes "
                    f"({human_bytes(footprint.total_bytes)}) through a cache limited to "
                    f"{human_bytes(footprint.cache_limit)}: each batch evicts what the next needs, "
                    "which measured about 20x slower than a warm cache. Use window='auto' (the "
                    "default) or window=W episodes"
                ),
            )
        return WindowChoice(None, False, "window=None: full shuffle, as asked")
    if not is_int(window) or int(window) < 1:
        raise InvalidArgumentError(
            f"window={window!r}: use 'auto' (the default), a number of episodes >= 1 (e.g. 64), "
            "or None to shuffle the whole shard"
        )
    if not shuffle:
        raise InvalidArgumentError(
            f"window={window!r} shuffles within windows of episodes, but shuffle=False reads the "
            "shard in dataset order (already one episode at a time): drop window or set shuffle=True"
        )
    return WindowChoice(int(window), False, f"window={int(window)} episodes, as asked")


def _auto(footprint: CacheFootprint | None, shuffle: bool, *, has_footprint: bool) -> WindowChoice:
    if not shuffle:
        return WindowChoice(None, True, "shuffle=False: dataset order, no window")
    if not has_footprint:
        return WindowChoice(None, True, "this dataset is not read by episode windows: full shuffle")
    if footprint is None:
        return WindowChoice(None, True, "no cache limit: full shuffle")
    if footprint.total_bytes <= footprint.cache_limit:
        return WindowChoice(
            None,
            True,
            (
                f"the {human_bytes(footprint.total_bytes)} read fit the cache limit "
                f"{human_bytes(footprint.cache_limit)}: full shuffle"
            ),
        )
    ranks = local_ranks()
    per_rank = footprint.cache_limit * WINDOW_SHARE / ranks
    w = max(1, min(footprint.episodes, int(per_rank // max(1.0, footprint.episode_bytes))))
    reason = (
        f"window of {w} episodes: the {human_bytes(footprint.total_bytes)} read do not fit the "
        f"cache limit {human_bytes(footprint.cache_limit)}, so episodes are shuffled {w} at a "
        f"time ({human_bytes(footprint.episode_bytes)} each on average; a window takes at most "
        f"half the limit per local rank, {ranks} here). Every sample is still read once per "
        "epoch; pass window=None for a full shuffle"
    )
    _say_once(logging.INFO, f"EpisodeSampler: {reason}")
    return WindowChoice(w, True, reason)


def _say_once(level: int, message: str) -> None:
    with _SAID_LOCK:
        if message in _SAID:
            return
        _SAID.add(message)
    log.log(level, message)
