"""What :class:`~rayform.torch.EpisodeSampler` asks of the dataset it orders.

:class:`SamplerDataset` is the whole contract: :class:`~rayform.torch.EpisodeDataset` and
:class:`~rayform.torch.MixtureDataset` implement it, and so can a user's own dataset. The sampler
reads nothing else of the dataset; the dataset's read-ahead learns the order from the sampler
through :meth:`SamplerDataset.follow_order`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from rayform.torch._sampling._order import IndexStream

__all__ = ["CacheFootprint", "SamplerDataset"]


@dataclass(frozen=True)
class CacheFootprint:
    """What one epoch of a dataset asks of a bounded cache.

    Attributes:
        total_bytes: bytes of the blobs of the streams read, over all the dataset's episodes.
        episodes: number of episodes.
        cache_limit: the client's cache limit in bytes.
    """

    total_bytes: int
    episodes: int
    cache_limit: int

    @property
    def episode_bytes(self) -> float:
        """Mean bytes per episode."""
        return self.total_bytes / max(1, self.episodes)


@runtime_checkable
class SamplerDataset(Protocol):
    """A map-style dataset that :class:`~rayform.torch.EpisodeSampler` can order.

    Its indices ``0 .. len - 1`` are grouped in episodes; the dataset says how its index space
    splits over ranks and episodes (:meth:`order_streams`), and the sampler turns that into
    keys, epoch after epoch, sharded and resumable.
    """

    @property
    def seed(self) -> int:
        """Seed of every order of this dataset."""
        ...

    @property
    def epoch(self) -> int:
        """The epoch the workers read (``set_epoch``)."""
        ...

    @property
    def shard(self) -> tuple[int, int]:
        """``(rank, world_size)`` this dataset was built for."""
        ...

    @property
    def shard_auto(self) -> bool:
        """Whether ``shard`` was found from ``torch.distributed`` (``shard="auto"``): the
        sampler then refuses to run one shard on many processes."""
        ...

    @property
    def accepts_window(self) -> bool:
        """Whether :meth:`order_streams` accepts a shuffle ``window`` (episodes)."""
        ...

    def order_streams(
        self, world: int, epoch: int, shuffle: bool, window: int | None = None
    ) -> list[IndexStream]:
        """One :class:`IndexStream` per rank of a first world size ``world``: the dataset
        indices of ``epoch`` in reading order (shuffled with ``shuffle``, ``window`` episodes
        at a time if given)."""
        ...

    def order_fingerprint(self) -> dict[str, Any]:
        """JSON-able facts that change the order (sizes, padding policy): a saved sampler
        state is refused for a dataset whose fingerprint differs."""
        ...

    def cache_footprint(self) -> CacheFootprint | None:
        """What one epoch asks of a bounded cache (bytes of the streams read, episodes, the
        cache limit in bytes), or ``None`` without a limit: the automatic shuffle window."""
        ...

    def follow_order(self, shuffle: bool, window: int | None) -> None:
        """Called by the sampler with its order, so that read-ahead fetches in that order."""
        ...
