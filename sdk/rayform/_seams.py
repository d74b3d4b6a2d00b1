"""The seams of the data path, named: what each side of a module boundary needs from the other.

Slice ID → manifest → blobs → cache → decoder → sample → batch::

    EpisodeDataset ──BlobSource──▶ Slice ──BlobFetcher──▶ Client ──Fetch──▶ (pull)
    rayform.view ──ViewSource──▶ Slice
                                                             │
                                   Cache.fetch_blob ──DownloadSink──▶ Transport.download
                                                                      (ProgressCallback)
    dataset stats ──TableLoader──▶ SampleReader

Each is a :class:`typing.Protocol`: anything with these members fits, so tests and benchmarks
stand in for a server with a small fake (``tests/support/fakes.py``) instead of a subclass. The
runtime-checkable ones are checked with ``isinstance`` where a user hands us the object.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    import numpy as np

    from rayform.manifest import BlobRef, Segment, Segments, Stream

__all__ = [
    "BlobFetcher",
    "BlobSource",
    "DownloadSink",
    "Fetch",
    "ProgressCallback",
    "TableLoader",
    "ViewSource",
]

#: Called with the number of bytes just received (progress bars). Runs in the downloading
#: thread: it must be quick and thread-safe.
ProgressCallback = Callable[[int], None]


@runtime_checkable
class BlobFetcher(Protocol):
    """What a :class:`~rayform.Slice` needs from the client that resolved it.

    :class:`~rayform.Client` is the real one; ``tests/support/fakes.py`` has one that reads a server
    store directly.
    """

    def ensure_blob(self, slice_id: str, ref: BlobRef) -> Path:
        """Local path of the verified blob ``ref`` of ``slice_id``, fetched if missing."""
        ...

    @property
    def cache_dir(self) -> Path | None:
        """Directory for files derived from blobs (statistics), or ``None`` to keep none."""
        ...

    def pull(
        self,
        slice_id: str | BlobSource,
        streams: Sequence[str] | None = None,
        jobs: int = 8,
        progress: bool = False,
    ) -> object:
        """Make every blob of the named streams (all if ``None``) of ``slice_id`` (an ID, or a
        :class:`~rayform.Slice`, whose view pulls only its segments) local."""
        ...

    @property
    def cache_limit(self) -> int | None:
        """Bytes the cache's blobs may take (bytes), or ``None`` for no limit."""
        ...

    def would_fetch(self, ref: BlobRef) -> bool:
        """True if :meth:`ensure_blob` would download ``ref`` now (online, not cached)."""
        ...


@runtime_checkable
class BlobSource(Protocol):
    """What :class:`~rayform.torch.EpisodeDataset` needs from a slice (a :class:`~rayform.Slice`)."""

    @property
    def id(self) -> str:
        """The slice ID, e.g. ``"slc_7c1e04aa"``."""
        ...

    @property
    def segments(self) -> Segments:
        """Its segments (streams, blob references) in manifest order, a view's only."""
        ...

    @property
    def manifest_hash(self) -> str:
        """BLAKE3 hex of the manifest (pins the exact content)."""
        ...

    @property
    def selection(self) -> dict[str, Any] | None:
        """The ``select()`` arguments that made this view (``None`` for a whole slice)."""
        ...

    @property
    def parent(self) -> BlobSource | None:
        """The whole slice this view was selected from (``None`` for a whole slice)."""
        ...

    @property
    def cache_dir(self) -> Path | None:
        """Directory for files derived from its blobs (statistics), or ``None``."""
        ...

    def blob_path(self, ref: BlobRef) -> Path:
        """Local path of a verified blob of this slice, fetched into the cache if missing."""
        ...

    @property
    def cache_limit(self) -> int | None:
        """Bytes the cache's blobs may take (bytes), or ``None`` for no limit."""
        ...

    def would_fetch(self, ref: BlobRef) -> bool:
        """True if :meth:`blob_path` would download ``ref`` now (online, not cached)."""
        ...


class ViewSource(BlobSource, Protocol):
    """What the viewer (:mod:`rayform.view`) needs from a slice: a :class:`~rayform.Slice` or a
    ``select()`` view of one. The viewer depends on this, never on the slice model, so that
    ``Slice.show()`` can start it without a circle of imports."""

    @property
    def streams(self) -> list[str]:
        """Sorted names of every stream present in at least one segment."""
        ...

    def segment(self, segment_id: str) -> Segment:
        """The segment with this ID (:class:`~rayform.errors.NotFoundError` if none)."""
        ...

    @property
    def select(self) -> Callable[..., ViewSource]:
        """Makes a view of some of its segments (``Slice.select``, its arguments)."""
        ...

    def __len__(self) -> int:
        """Its number of segments."""
        ...


class DownloadSink(Protocol):
    """What a download writes into (:class:`~rayform.cache._partial.PartialBlob`): bytes
    ``offset..expected_size`` of one blob, in order."""

    @property
    def offset(self) -> int:
        """Bytes already held; a resumed download asks for ``Range: bytes=<offset>-``."""
        ...

    @property
    def expected_size(self) -> int:
        """The blob's size in bytes, as its manifest declares."""
        ...

    @property
    def remaining(self) -> int:
        """Bytes still missing."""
        ...

    def write(self, chunk: bytes) -> None:
        """Append ``chunk`` at :attr:`offset`."""
        ...

    def restart(self) -> None:
        """Forget every byte held (the server ignored the requested range)."""
        ...


class Fetch(Protocol):
    """Download one blob of a slice into the cache (``Client._fetch``, used by ``pull``)."""

    def __call__(
        self, slice_id: str, ref: BlobRef, on_bytes: ProgressCallback | None = None, /
    ) -> tuple[Path, int]:
        """Returns the cached path and the bytes this call downloaded (0 if already cached)."""
        ...


class TableLoader(Protocol):
    """Reads a table stream: ``(t_ns int64 (N,), values (N, D))`` (``SampleReader.table``)."""

    def __call__(self, stream: Stream, /) -> tuple[np.ndarray, np.ndarray]: ...
