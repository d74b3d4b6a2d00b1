"""Streaming a cold cache: read-ahead of the blobs the coming samples need, and cache checks.

(The read-ahead itself is below; this part checks, up front, that the dataset can work under
the client's cache limit at all.)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rayform._evict import Pins, check_fits

__all__ = ["check_cache_fits", "reader_pins", "segment_blobs"]


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
