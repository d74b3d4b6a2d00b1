"""``Slice``: an immutable, resolved selection of segments, bound to the client that resolved it."""

from __future__ import annotations

import html
from collections.abc import Sequence
from pathlib import Path

from rayform._seams import BlobFetcher
from rayform._units import human_bytes
from rayform.errors import NotFoundError
from rayform.manifest import BlobRef, Manifest, Segment

__all__ = ["Slice"]



class Slice:
    """A slice resolved to its manifest.

    Attributes:
        id: the slice ID, e.g. ``"slc_7c1e04aa"``.
        manifest_hash: BLAKE3 of the manifest this slice points at (pins the exact content).
        manifest: the parsed :class:`~rayform.manifest.Manifest`.
        client: the :class:`~rayform.Client` used to fetch its blobs (any
            :class:`~rayform._seams.BlobFetcher`).
    """

    def __init__(self, slice_id: str, manifest_hash: str, manifest: Manifest, client: BlobFetcher) -> None:
        self.id = slice_id
        self.manifest_hash = manifest_hash
        self.manifest = manifest
        self.client = client
        self._by_id: dict[str, Segment] | None = None

    # -- contents --------------------------------------------------------------------------
    @property
    def segments(self) -> tuple[Segment, ...]:
        """Every segment (episode) in manifest order."""
        return self.manifest.segments

    @property
    def streams(self) -> list[str]:
        """Sorted names of every stream present in at least one segment."""
        return self.manifest.stream_names()

    @property
    def nbytes(self) -> int:
        """Total stored size of every blob, in bytes."""
        return sum(b.size for b in self.manifest.blobs().values())

    @property
    def duration_s(self) -> float:
        """Sum of segment durations in seconds."""
        return sum(s.duration_s for s in self.segments)

    def segment(self, segment_id: str) -> Segment:
        """The segment with this ID; :class:`NotFoundError` if the slice has none."""
        if self._by_id is None:
            self._by_id = {s.id: s for s in self.segments}
        try:
            return self._by_id[segment_id]
        except KeyError:
            raise NotFoundError(
                f"slice {self.id} has no segment {segment_id!r}; list them with "
                f"`rayform slices show {self.id}`"
            ) from None

    def stream_nbytes(self, streams: Sequence[str] | None = None) -> int:
        """Bytes needed to hold the named streams (all if ``None``)."""
        return sum(b.size for b in self.manifest.blobs(list(streams) if streams else None).values())

    # -- data ------------------------------------------------------------------------------
    @property
    def cache_dir(self) -> Path | None:
        """The cache directory its blobs are fetched into (files derived from them, such as
        dataset statistics, are kept there too), or ``None`` if there is none."""
        return self.client.cache_dir

    def blob_path(self, ref: BlobRef) -> Path:
        """Local path of a verified blob of this slice, fetching it into the cache if needed.

        Raises:
            OfflineError: offline mode and the blob is not cached.
        """
        return self.client.ensure_blob(self.id, ref)

    def pull(self, streams: Sequence[str] | None = None, *, jobs: int = 8, progress: bool = False) -> None:
        """Prefetch every blob of the named streams (all if ``None``) into the cache."""
        self.client.pull(self.id, streams=streams, jobs=jobs, progress=progress)

    # -- display ---------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.segments)

    def __repr__(self) -> str:
        return (
            f"<Slice {self.id} manifest={self.manifest_hash[:12]} segments={len(self.segments)} "
            f"streams={self.streams} size={human_bytes(self.nbytes)} "
            f"duration={self.duration_s:.1f}s>"
        )

    def _repr_html_(self) -> str:
        rows = []
        for name in self.streams:
            example = next(s.streams[name] for s in self.segments if name in s.streams)
            rows.append(
                "<tr>" + "".join(
                    f"<td>{html.escape(str(v))}</td>"
                    for v in (name, example.kind, example.rate_hz, tuple(example.shape),
                              example.dtype, example.units or "", example.frame or "")
                ) + "</tr>"
            )
        sites = sorted({s.site for s in self.segments})
        return (
            f"<div><b>Slice {html.escape(self.id)}</b> &middot; {len(self.segments)} segments "
            f"&middot; {self.duration_s:.1f} s &middot; {human_bytes(self.nbytes)} &middot; "
            f"sites: {html.escape(', '.join(sites))}<br><code>manifest {self.manifest_hash}</code>"
            "<table><tr><th>stream</th><th>kind</th><th>rate (Hz)</th><th>shape</th>"
            "<th>dtype</th><th>units</th><th>frame</th></tr>" + "".join(rows) + "</table></div>"
        )
