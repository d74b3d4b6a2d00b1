"""The blobs a dataset reads, and what a bounded cache must hold for them.

Shared by the reader (its pins), read-ahead (what to fetch) and the dataset (whether the cache
fits one episode at all).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from rayform._resolution import Target, stream_blobs
from rayform.cache import Pins, check_fits

if TYPE_CHECKING:
    from rayform._seams import BlobSource
    from rayform.manifest import BlobRef, Segment, Segments

__all__ = ["check_cache_fits", "reader_pins", "segment_blobs"]


def segment_blobs(
    segment: Segment, names: Sequence[str], targets: Mapping[str, Target] | None = None
) -> dict[str, BlobRef]:
    """``{hash: BlobRef}`` of the blobs one segment needs for the streams ``names``; a camera
    with a training resolution in ``targets`` needs only the rendition it reads."""
    out: dict[str, BlobRef] = {}
    targets = targets or {}
    for name in names:
        if name not in segment.streams:  # a text stream this episode lacks
            continue
        for ref in stream_blobs(segment.streams[name], targets.get(name)):
            out[ref.hash] = ref
    return out


def check_cache_fits(
    slice_: BlobSource,
    segments: Segments,
    names: Sequence[str],
    targets: Mapping[str, Target] | None = None,
) -> int | None:
    """Raise up front if the largest segment's blobs exceed the client's ``cache_limit``.

    A sample needs every blob of its segment's streams at once; below that, a bounded cache
    would evict what it is reading (or wait forever, in other libraries).

    Returns:
        The bytes of every segment's blobs for ``names`` (what an epoch reads), or ``None``
        when there is no limit (then nothing is summed: a fleet-scale slice costs no pass).
    """
    limit = slice_.cache_limit
    if limit is None or not segments:
        return None
    sizes = [
        (sum(r.size for r in segment_blobs(seg, names, targets).values()), seg.id)
        for seg in segments
    ]
    need, seg_id = max(sizes)
    check_fits(limit, need, f"segment {seg_id}'s blobs for streams {', '.join(names)}")
    return sum(size for size, _ in sizes)


def reader_pins(slice_: BlobSource, segments: Segments, names: Sequence[str]) -> Pins | None:
    """The pins of one reading process under a bounded cache (``None`` without a limit).

    They hold the blobs of about one segment (the most recently used): what a batch is reading.
    Older pins are dropped, so a process never holds more of a small cache than it needs.
    """
    if slice_.cache_limit is None or not segments:
        return None
    # Every segment has these streams, but maybe a text one: one blob each it lacks.
    first = segments[0]
    return Pins(len(segment_blobs(first, names)) + sum(n not in first.streams for n in names))
