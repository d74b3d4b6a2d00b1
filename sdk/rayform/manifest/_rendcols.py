"""Renditions in manifest pages: the ``renditions`` field of every stream row.

Every stream row has a ``renditions`` field: a list (smallest first, at most
:data:`MAX_RENDITIONS`) of structs ``{blob_hash: binary(32), blob_size: int64, height: int64,
width: int64}``, empty for a table stream and for a camera without renditions.

This module holds the field's Arrow type, the writer's cells, the page checks and the reads
(a stream row's renditions; the distinct rendition blobs of some stream rows).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from rayform.errors import ManifestError
from rayform.manifest._arrow import load as pyarrow
from rayform.manifest._model import INT64_MAX, BlobRef, Rendition, Stream

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = [
    "MAX_RENDITIONS",
    "any_renditions",
    "cells",
    "check_renditions",
    "parse_cells",
    "rendition_blobs",
    "rendition_items",
    "rendition_type",
]

#: Renditions one stream may list.
MAX_RENDITIONS = 16
_HASH_BYTES = 32


def rendition_type() -> pa.DataType:
    """The Arrow type of one rendition."""
    pa = pyarrow()
    return pa.struct(
        [
            ("blob_hash", pa.binary(_HASH_BYTES)),
            ("blob_size", pa.int64()),
            ("height", pa.int64()),
            ("width", pa.int64()),
        ]
    )


def any_renditions(values: pa.StructArray) -> bool:
    """Whether any of the stream rows ``values`` (a StructArray) lists a rendition."""
    lists = values.field("renditions")
    if not len(lists):
        return False
    offs = np.frombuffer(
        lists.buffers()[1], dtype=np.int32, count=len(lists) + 1, offset=lists.offset * 4
    )
    return bool(offs[-1] > offs[0])


def cells(stream: Stream) -> list[dict[str, Any]]:
    """The ``renditions`` cell of ``stream`` for the writer (``[]`` without renditions)."""
    return [
        {
            "blob_hash": bytes.fromhex(r.blob.hash),
            "blob_size": r.blob.size,
            "height": r.height,
            "width": r.width,
        }
        for r in stream.renditions
    ]


def parse_cells(
    items: Sequence[Mapping[str, Any]], kind: str, shape: Sequence[int], where: str
) -> tuple[Rendition, ...]:
    """A stream row's renditions, checked against its stream (what the whole-page checks
    cannot see per row: a video stream only, smaller than it, smallest first, one per height).

    Raises:
        ManifestError: the row breaks one of those rules.
    """
    if not items:
        return ()
    out = tuple(
        Rendition(
            BlobRef(bytes(r["blob_hash"]).hex(), int(r["blob_size"])),
            int(r["height"]),
            int(r["width"]),
        )
        for r in items
    )
    if kind != "video" or len(shape) < 2:
        raise ManifestError(f"{where}: renditions are allowed on a video stream only")
    heights = [r.height for r in out]
    if heights != sorted(set(heights)) or any(
        r.height >= shape[0] or r.width > shape[1] for r in out
    ):
        raise ManifestError(
            f"{where}: renditions must be smaller than the original "
            f"{shape[1]}x{shape[0]} and listed smallest first, one per height"
        )
    return out


def check_renditions(
    values: pa.StructArray,
    fixed: Callable[[pa.Array, type], np.ndarray],
    offsets: Callable[[pa.Array, int, str], int],
    within: Callable[[np.ndarray, str, float, float], None],
) -> None:
    """Check the ``renditions`` field of a page's stream rows (``values``, a StructArray).

    ``fixed``, ``offsets`` and ``within`` are the page checks' own helpers (a fixed-width
    array's numpy view, list offsets in range, a value range), so the rules are theirs.

    Raises:
        ManifestError: too many renditions on a stream, a null, a size or side out of range,
            an odd side, or renditions on a table stream.
    """
    lists = values.field("renditions")
    items = lists.values
    longest = offsets(lists, len(items), "renditions")
    if longest > MAX_RENDITIONS:
        raise ManifestError(f"manifest page: a stream lists more than {MAX_RENDITIONS} renditions")
    if lists.null_count or any(items.field(i).null_count for i in range(items.type.num_fields)):
        raise ManifestError("a manifest page holds a null rendition field")
    within(fixed(items.field("blob_size"), np.int64), "rendition blob_size", 0, INT64_MAX)
    for side in ("height", "width"):
        sides = fixed(items.field(side), np.int64)
        within(sides, f"rendition {side}", 2, 2**31 - 1)
        if len(sides) and bool((sides % 2).any()):
            raise ManifestError(
                f"manifest page: a rendition's {side} is odd (H.264 4:2:0 sides are even)"
            )


def rendition_blobs(values: pa.StructArray, keep: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(digests (U, 32) uint8, sizes (U,) int64)`` of the renditions of the stream rows
    ``keep`` (bool, one per row of ``values``), not deduplicated."""
    lists = values.field("renditions")
    offs = np.frombuffer(
        lists.buffers()[1], dtype=np.int32, count=len(lists) + 1, offset=lists.offset * 4
    )
    counts = np.diff(offs)
    take = np.repeat(keep, counts)
    items = lists.values
    base = int(offs[0])
    hashes = items.field("blob_hash")
    raw = np.frombuffer(hashes.buffers()[1], dtype=np.uint8)
    start = (hashes.offset + base) * _HASH_BYTES
    n = int(offs[-1] - offs[0])
    digests = raw[start : start + n * _HASH_BYTES].reshape(n, _HASH_BYTES)
    sizes_arr = items.field("blob_size")
    sizes = np.frombuffer(
        sizes_arr.buffers()[1], dtype=np.int64, count=n, offset=(sizes_arr.offset + base) * 8
    )
    return digests[take], sizes[take]


def rendition_items(
    values: pa.StructArray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Every rendition of the stream rows ``values`` (a StructArray), flattened:
    ``(counts (N,) int64, digests (I, 32) uint8, sizes (I,) int64 bytes, heights (I,) int64,
    widths (I,) int64 pixels)``, row by row, each row's renditions in stored order (smallest
    first). Views of the page's buffers where Arrow's layout allows (no copy of a mapped page)."""
    lists = values.field("renditions")
    offs = np.frombuffer(
        lists.buffers()[1], dtype=np.int32, count=len(lists) + 1, offset=lists.offset * 4
    )
    items = lists.values
    base, n = int(offs[0]), int(offs[-1] - offs[0])

    def ints(name: str) -> np.ndarray:
        arr = items.field(name)
        return np.frombuffer(
            arr.buffers()[1], dtype=np.int64, count=n, offset=(arr.offset + base) * 8
        )

    hashes = items.field("blob_hash")
    raw = np.frombuffer(hashes.buffers()[1], dtype=np.uint8)
    start = (hashes.offset + base) * _HASH_BYTES
    digests = raw[start : start + n * _HASH_BYTES].reshape(n, _HASH_BYTES)
    return (
        np.diff(offs).astype(np.int64),
        digests,
        ints("blob_size"),
        ints("height"),
        ints("width"),
    )
