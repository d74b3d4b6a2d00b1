"""The Arrow schema of a manifest's pages (the segment table).

Its own module because both the page reader (``_pagerows``, ``_columns``) and the writer
(``_columnar``) need it, and neither may import the other.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from rayform.manifest._arrow import load as pyarrow
from rayform.manifest._model import Segment
from rayform.manifest._rendcols import cells, rendition_type

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = [
    "HASH_BYTES",
    "NO_HASH",
    "page_schema",
    "segments_to_table",
    "stream_type",
]

#: Bytes of a raw BLAKE3 digest in a page.
HASH_BYTES = 32
#: The ``ts_hash`` of a stream without a timestamps blob (a table).
NO_HASH = bytes(HASH_BYTES)


def stream_type(plain: bool = False) -> pa.DataType:
    """The Arrow type of one stream row (the stream table's schema); ``plain``: strings
    instead of dictionary-encoded strings."""
    pa = pyarrow()
    h = pa.binary(HASH_BYTES)
    # A few distinct values repeated per row: dictionary-encoded in pages.
    word = pa.string() if plain else pa.dictionary(pa.int32(), pa.string())
    return pa.struct(
        [
            ("name", word),
            ("kind", word),
            ("blob_hash", h),
            ("blob_size", pa.int64()),
            ("ts_hash", h),
            ("ts_size", pa.int64()),
            ("rate_hz", pa.float64()),
            ("shape", pa.list_(pa.int64())),
            ("dtype", word),
            ("count", pa.int64()),
            ("t0_ns", pa.int64()),
            ("t1_ns", pa.int64()),
            ("units", word),
            ("frame", word),
            ("quantity", word),
            ("codec", word),
            ("gop", pa.int64()),
            # Always present (an empty list where a stream has none): one schema for every
            # manifest, so a reader never asks which one it holds.
            ("renditions", pa.list_(rendition_type())),
        ]
    )


def page_schema(plain: bool = False) -> pa.Schema:
    """The Arrow schema of a page (the segment table)."""
    pa = pyarrow()
    return pa.schema(
        [
            ("id", pa.string()),
            ("version", pa.int64()),
            ("site", pa.string() if plain else pa.dictionary(pa.int32(), pa.string())),
            ("start_ns", pa.int64()),
            ("end_ns", pa.int64()),
            ("streams", pa.list_(stream_type(plain))),
        ]
    )


def segments_to_table(segments: Sequence[Segment]) -> pa.Table:
    """The segment table of ``segments``, of the page schema (one Python pass; the writer's
    side only)."""
    pa = pyarrow()
    rows = []
    for seg in segments:
        streams = []
        for name, s in sorted(seg.streams.items()):
            streams.append(
                {
                    "name": name,
                    "kind": s.kind,
                    "blob_hash": bytes.fromhex(s.blob.hash),
                    "blob_size": s.blob.size,
                    # No nulls anywhere: Arrow leaves the bytes under a null unspecified, and a
                    # page's bytes must depend only on its content. "Absent" is spelled
                    # as 32 zero bytes (no timestamps blob), 0 (gop) and "" (strings).
                    "ts_hash": bytes.fromhex(s.timestamps.hash) if s.timestamps else NO_HASH,
                    "ts_size": s.timestamps.size if s.timestamps else 0,
                    "rate_hz": float(s.rate_hz),
                    "shape": list(s.shape),
                    "dtype": s.dtype,
                    "count": s.count,
                    "t0_ns": s.t0_ns,
                    "t1_ns": s.t1_ns,
                    "units": s.units or "",
                    "frame": s.frame or "",
                    "quantity": s.quantity or "",
                    "codec": s.codec or "",
                    "gop": s.gop or 0,
                    "renditions": cells(s),
                }
            )
        rows.append(
            {
                "id": seg.id,
                "version": seg.version,
                "site": seg.site,
                "start_ns": seg.start_ns,
                "end_ns": seg.end_ns,
                "streams": streams,
            }
        )
    return pa.Table.from_pylist(rows, schema=page_schema())
