"""The viewer's episode list: filter and page a slice's segments on columns.

The filters are the ones :meth:`rayform.Slice.select` understands (sites, a time range with the
same overlap rule, a text filter on episode fields and labels, ``rayform.curation``) plus an ID
prefix; each is one vectorised operation on Arrow or numpy columns, so a 1,000,000-segment
slice is filtered without a Python object per segment. Only the rows of the
requested page become :class:`~rayform.manifest.Segment` objects.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from rayform.curation import Columns, Labels, parse_filter
from rayform.manifest import BlobRef, Segment, Segments

__all__ = ["EpisodeFilter", "EpisodeIndex"]


@dataclass(frozen=True)
class EpisodeFilter:
    """What the list shows: every field narrows it (``None``/empty: no constraint).

    Attributes:
        sites: keep segments recorded at one of these sites.
        prefix: keep segments whose ID starts with this text.
        start_ns: keep segments that end at or after this time (ns, Unix epoch).
        end_ns: keep segments that start before this time (ns); with ``start_ns`` the segments
            overlapping ``[start_ns, end_ns)``, as ``Slice.select`` reads them.
        where: a filter's canonical text (``"success and quality >= 0.7"``), or ``""``.
    """

    sites: tuple[str, ...] = ()
    prefix: str = ""
    start_ns: int | None = None
    end_ns: int | None = None
    where: str = ""


class EpisodeIndex:
    """Columns of one slice's segments (ID, site, start, end) and cached filter results.

    Args:
        segments: the slice's segments.
        labels: reads the slice's latest labels (``None``: it has none), for text filters.
        read_blob: reads a blob's verified bytes, for a filter on ``task``.
    """

    _KEEP = 8  # filter results kept: paging through one filter must not refilter

    def __init__(
        self,
        segments: Segments,
        labels: Callable[[], Labels | None] | None = None,
        read_blob: Callable[[BlobRef], bytes] | None = None,
    ) -> None:
        self.segments = segments
        self._labels = labels
        self._read_blob = read_blob
        self.ids = segments.ids()
        self.sites = segments.sites()
        self.start_ns = segments.column("start_ns")
        self.end_ns = segments.column("end_ns")
        self._lock = threading.Lock()  # one Segment cache and one result cache per slice
        self._results: OrderedDict[tuple[EpisodeFilter, str | None], np.ndarray] = OrderedDict()
        self._site_list: list[str] | None = None

    def __len__(self) -> int:
        return len(self.start_ns)

    def site_list(self) -> list[str]:
        """Every site of the slice, sorted."""
        if self._site_list is None:
            self._site_list = sorted(str(s) for s in pc.unique(self.sites).to_pylist())
        return list(self._site_list)

    def time_range(self) -> tuple[int, int]:
        """``(first start_ns, last end_ns)`` over every segment."""
        if not len(self):
            return 0, 0
        return int(self.start_ns.min()), int(self.end_ns.max())

    def positions(self, f: EpisodeFilter) -> np.ndarray:
        """``int64 (K,)`` positions (in the slice's segment order) that the filter keeps.

        Raises:
            InvalidArgumentError: a text filter naming what is neither a field nor a label.
        """
        labels = None
        flt = parse_filter(f.where) if f.where else None
        if (
            flt is not None
            and self._labels is not None
            and flt.names - set(Columns(self.segments, {}).kinds())
        ):
            labels = self._labels()  # the latest: results are kept per label version
        key = (f, labels.hash if labels is not None else None)
        with self._lock:
            hit = self._results.get(key)
            if hit is not None:
                self._results.move_to_end(key)
                return hit
        keep = np.ones(len(self), dtype=bool)
        if flt is not None:
            with self._lock:  # the label columns are built once, under the index's lock
                cols = (
                    labels.columns(self.segments, self._read_blob)
                    if labels is not None and labels.version
                    else Columns(self.segments, {}, self._read_blob)
                )
                keep &= flt.mask(cols)
        if f.sites:
            keep &= _bools(
                pc.is_in(self.sites, value_set=pa.array(list(f.sites), type=pa.string()))
            )
        if f.prefix:
            keep &= _bools(pc.starts_with(self.ids, pattern=f.prefix))
        if f.start_ns is not None:
            keep &= self.end_ns >= f.start_ns
        if f.end_ns is not None:
            keep &= self.start_ns < f.end_ns
        found = np.flatnonzero(keep).astype(np.int64)
        with self._lock:
            self._results[key] = found
            if len(self._results) > self._KEEP:
                self._results.popitem(last=False)
        return found

    def page(self, f: EpisodeFilter, offset: int, limit: int) -> tuple[int, list[Segment]]:
        """``(matching count, the segments of positions [offset, offset + limit))``."""
        found = self.positions(f)
        with self._lock:
            rows = [self.segments[int(i)] for i in found[offset : offset + limit]]
        return len(found), rows

    def segment(self, position: int) -> Segment:
        """The segment at ``position`` (built under the index's lock)."""
        with self._lock:
            return self.segments[position]


def _bools(mask: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """An Arrow boolean (chunked) array as ``bool (N,)`` numpy, nulls as False."""
    mask = pc.fill_null(mask, False)
    chunks = mask.chunks if isinstance(mask, pa.ChunkedArray) else [mask]
    parts = [c.to_numpy(zero_copy_only=False) for c in chunks]
    return np.concatenate(parts).astype(bool) if parts else np.zeros(0, dtype=bool)
