"""Which episodes a selection keeps when it filters (``Slice.select(where="...")``): the one
function the SDK's views and the server's publishing both call, so both keep the same rows."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from rayform.curation._filter import Columns, parse_filter
from rayform.curation._labels import Labels
from rayform.curation._textcols import ReadBlob
from rayform.errors import InvalidArgumentError
from rayform.manifest import Segments, select_rows

__all__ = ["view_rows"]


def view_rows(
    segs: Segments,
    slice_id: str,
    *,
    segments: Sequence[str] | None = None,
    sites: Sequence[str] | None = None,
    start_ns: int | None = None,
    end_ns: int | None = None,
    where: str | Callable[[dict[str, np.ndarray]], np.ndarray] | None = None,
    labels: Callable[[], Labels] | Labels | None = None,
    read_blob: ReadBlob | None = None,
) -> tuple[np.ndarray, dict[str, Any]]:
    """Manifest positions kept by a selection of ``segs`` and the selection as recorded.

    A ``where`` string is a filter (``rayform.curation._filter``); it is recorded as
    ``"filter"`` (its canonical text) with ``"labels"``, the hash of the label set it read
    (``None`` when it reads episode fields only). ``labels`` is that label set, or a function
    that reads it (called only if the filter names a label key); ``read_blob`` reads a blob's
    verified bytes, for a filter on ``task`` (its text stream's blobs, one per distinct task).
    """
    filtered = None
    if isinstance(where, str):
        flt = parse_filter(where)
        pinned: Labels | None = None
        if flt.names - set(Columns(segs, {}).kinds()):
            pinned = labels() if callable(labels) else labels
        if pinned is not None and pinned.version == 0:
            pinned = None  # nobody labelled yet: the filter's error lists what there is
        columns = (
            pinned.columns(segs, read_blob) if pinned is not None else Columns(segs, {}, read_blob)
        )
        filtered = (
            {"filter": flt.text, "labels": pinned.hash if pinned else None},
            flt.mask(columns),
        )
        where = None
    elif labels is not None and not callable(labels) and where is None:
        raise InvalidArgumentError("labels= is for a filter: pass where='success and ...' too")
    return select_rows(
        segs,
        slice_id,
        segments=segments,
        sites=sites,
        start_ns=start_ns,
        end_ns=end_ns,
        where=where,
        filtered=filtered,
    )
