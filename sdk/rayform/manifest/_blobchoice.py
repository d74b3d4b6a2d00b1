"""Which blobs reading some streams at a training resolution needs, from the columns.

One path for every manifest (an in-memory manifest's segments are columns too): per
stream row, the video's first (smallest) rendition that covers the target, else the original,
with its timestamps blob, and a table's blob, in the order a pass over the segments would meet
them, with no :class:`~rayform.manifest._model.Segment` built. ``rayform._resolution`` decides
what covers a target; this module applies it to millions of rows at once.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np

from rayform.manifest._columns import PageColumns
from rayform.manifest._model import BlobRef
from rayform.manifest._schema import HASH_BYTES

__all__ = ["choose_blobs", "first_kinds", "stream_rows"]


def stream_rows(
    c: PageColumns, positions: np.ndarray | None, streams: Sequence[str] | None
) -> np.ndarray:
    """``int64 (K,)``: the stream rows (indices into every stream row) of the named streams
    (all if ``None``) of these segments, in the order a pass over them meets them: segment
    by segment in this table's order (a segment listed twice counts at its first place),
    each segment's streams in row order, as :class:`Segment` lists them."""
    mask = c.stream_mask(streams)
    if positions is None:
        return np.flatnonzero(mask)
    # rank[p]: where segment position p first appears in this selection (-1: absent).
    rank = np.full(c.n, -1, dtype=np.int64)
    unique, first = np.unique(positions, return_index=True)
    rank[unique] = first
    seg_rank = rank[c.stream_seg]
    kept = np.flatnonzero(mask & (seg_rank >= 0))
    return kept[np.argsort(seg_rank[kept], kind="stable")]


def first_kinds(
    c: PageColumns, positions: np.ndarray | None, streams: Sequence[str] | None = None
) -> dict[str, str]:
    """``{name: kind}`` of the named streams (all if ``None``) in these segments: each
    name's ``kind`` in the first segment that has it (in this table's order), from the
    columns."""
    rows = stream_rows(c, positions, streams)
    codes, first = np.unique(c.name_code[rows], return_index=True)
    return {
        c.name_list[int(k)]: str(c.value_at("kind", int(rows[i])))
        for k, i in zip(codes, first, strict=True)
    }


def choose_blobs(
    c: PageColumns,
    positions: np.ndarray | None,
    streams: Sequence[str] | None,
    covers: Mapping[str, Callable[[int, int], bool]],
) -> dict[str, BlobRef]:
    """``{hash: BlobRef}`` of the named streams (all if ``None``) of these segments, with
    each video of a stream named in ``covers`` replaced by its first (smallest) rendition
    whose ``height`` x ``width`` (pixels) ``covers[name]`` accepts, where one does: from the
    columns, no :class:`Segment` built.

    Per stream row, exactly what a pass over the segments would collect: a video with a
    timestamps blob and a ``covers`` entry gives ``[chosen video, timestamps]``, any other
    row its own blobs (``[video, timestamps]`` or ``[table]``). The dict's order is that of
    each hash's first appearance in such a pass, and a hash listed twice keeps the size of
    its last appearance (what ``dict.update`` in that pass leaves).
    """
    rows = stream_rows(c, positions, streams)
    codes = c.name_code[rows]
    video = c.hashes("blob_hash")[rows]
    video_size = c.field("blob_size")[rows].astype(np.int64)
    ts = c.hashes("ts_hash")[rows]
    ts_size = c.field("ts_size")[rows].astype(np.int64)
    has_ts = ts.any(axis=1)
    targeted = np.array([name in covers for name in c.name_list], dtype=bool)
    choosing = np.flatnonzero(has_ts & targeted[codes])
    if len(choosing) and c.has_renditions:
        offsets, digests, sizes, heights, widths = c.renditions()
        chosen, item = _first_covering(
            offsets, heights, widths, rows[choosing], codes[choosing], c.name_list, covers
        )
        video[choosing[chosen]] = digests[item]
        video_size[choosing[chosen]] = sizes[item]
    # Each row's blobs in pass order: [video, timestamps], the latter only where present.
    keep = np.stack([np.ones(len(rows), dtype=bool), has_ts], axis=1).ravel()
    all_d = np.stack([video, ts], axis=1).reshape(-1, HASH_BYTES)[keep]
    all_s = np.stack([video_size, ts_size], axis=1).ravel()[keep]
    first, last = _first_last(all_d)
    order = np.argsort(first)
    out_d, out_s = all_d[first[order]], all_s[last[order]]
    text = out_d.tobytes().hex()  # one call, then slices: not one bytes.hex() per blob
    step = 2 * HASH_BYTES
    return {
        (h := text[i * step : (i + 1) * step]): BlobRef(h, size)
        for i, size in enumerate(out_s.tolist())
    }


def _first_covering(
    offsets: np.ndarray,
    heights: np.ndarray,
    widths: np.ndarray,
    rows: np.ndarray,
    codes: np.ndarray,
    names: Sequence[str],
    covers: Mapping[str, Callable[[int, int], bool]],
) -> tuple[np.ndarray, np.ndarray]:
    """For the stream ``rows`` (with name ``codes`` into ``names``), the first of each row's
    renditions (``offsets``/``heights``/``widths`` of :meth:`PageColumns.renditions`) that
    ``covers[name](height, width)`` accepts: ``(indices into rows that have one, the chosen
    rendition items)``. ``covers`` is called once per distinct (name, height, width), not per
    row: a manifest has a few rendition sizes and millions of rows."""
    counts = offsets[rows + 1] - offsets[rows]
    total = int(counts.sum())
    owner = np.repeat(np.arange(len(rows), dtype=np.int64), counts)
    # Item j of row k is offsets[rows[k]] + (j's place within the row).
    before = np.cumsum(counts) - counts
    item = np.repeat(offsets[rows] - before, counts) + np.arange(total, dtype=np.int64)
    item_code = np.repeat(codes, counts)
    ok = np.zeros(total, dtype=bool)
    for code in np.unique(item_code):
        at = np.flatnonzero(item_code == code)
        # Sides are below 2**31 (the page checks): one int64 key per (height, width).
        sizes, inverse = np.unique(
            (heights[item[at]] << 31) | widths[item[at]], return_inverse=True
        )
        test = covers[names[int(code)]]
        accepted = np.array([test(int(k >> 31), int(k & (2**31 - 1))) for k in sizes], bool)
        ok[at] = accepted[inverse.ravel()]
    hit = np.flatnonzero(ok)
    # Items are in row order and, within a row, smallest first: a row's first hit is its choice.
    chosen, first = np.unique(owner[hit], return_index=True)
    return chosen, item[hit[first]]


def _first_last(digests: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(first (U,), last (U,))`` int64: for each distinct row of ``digests`` ``(N, 32)``
    (in digest order), the index of its first and of its last occurrence."""
    if not len(digests):
        none = np.zeros(0, np.int64)
        return none, none
    keys = np.ascontiguousarray(digests).view(np.dtype((np.void, HASH_BYTES))).ravel()
    perm = np.argsort(keys, kind="stable")  # equal keys keep their order: first .. last
    ordered = keys[perm]
    starts = np.flatnonzero(np.concatenate([[True], ordered[1:] != ordered[:-1]]))
    ends = np.concatenate([starts[1:], [len(keys)]]) - 1
    return perm[starts].astype(np.int64), perm[ends].astype(np.int64)
