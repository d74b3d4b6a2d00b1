"""What crosses the wire or sits on disk: the format contract between SDK, server and caches.

Everything here is shared by the SDK (``rayform``), the server stub (``rayform_server``), the
tests and the benchmarks, so that every side accepts exactly the same strings and bytes. The
HTTP API is described in ``docs/protocol.md``, the manifest in ``docs/manifest.md`` and the
on-disk layout in ``docs/layout.md``; this module is their code.

**Identifiers** (:func:`check_slice_id`, :func:`check_segment_id`, :func:`check_hash`,
:func:`check_stream_name` and the regular expressions they use):

* slice ID: ``slc_`` + 8 to 64 lowercase hex digits, e.g. ``slc_7c1e04aa``;
* segment ID: ``seg_`` + 8 to 64 lowercase hex digits;
* content hash: a BLAKE3 digest as 64 lowercase hex digits;
* stream name: 1 to 5 lowercase words separated by ``/``, e.g. ``cam0/rgb``, never ``..``.

**Content hashes** (:func:`hash_bytes`, :func:`hash_file`, :func:`new_hasher`): every blob and
every manifest is named by the BLAKE3 hex digest of its bytes, and stored at
``DIR/ab/<digest>`` (:func:`sharded_path`) in the client cache and the server's data root.

**Blob formats** (:func:`encode_timestamps`, :func:`decode_timestamps`, :func:`encode_table`,
:func:`decode_table`): videos are H.264 in MP4, stored as is. The other blobs are ``.npy``
arrays (versioned, self-describing, byte-for-byte deterministic, so the same input always has
the same hash):

* timestamps blob (per video stream): ``int64 (N,)``, the capture time of every frame in ns,
  strictly increasing; frame ``i`` of the video is the ``i``-th decoded frame;
* table blob (time-series stream): ``t_ns`` (``int64 (N,)``, strictly increasing) then
  ``values`` (``(N, D)``, the stream's dtype), two ``.npy`` arrays back to back.

**Manifest** (:data:`MANIFEST_FORMAT`, :data:`MANIFEST_FORMAT_VERSION`, :data:`PAGE_FORMAT`,
:data:`PAGE_ROWS`, :func:`canonical_json`): a small canonical-JSON root (UTF-8, sorted keys,
no whitespace; the manifest's name is its BLAKE3) that lists pages of the segment table, each
an Arrow IPC file of up to ``PAGE_ROWS`` segments named by its own BLAKE3, with a
``renditions`` list (smaller copies of a camera video; empty where none) per stream row.
:func:`segments_to_table`, :func:`table_to_pages` and :func:`build_root` write it;
:func:`load_manifest` reads it (checking every page against its hash) into a memory-mapped
:class:`ColumnarManifest`; :func:`page_refs` lists a root's pages. The records it holds are
:class:`rayform.Segment`, :class:`rayform.Stream` and :class:`rayform.BlobRef`. Only this
format (``MANIFEST_FORMAT_VERSION``) is read: an older root is refused with the command that
rewrites it. Details: ``docs/manifest.md``.

Example::

    >>> from rayform.format import check_slice_id, hash_bytes
    >>> check_slice_id("slc_7c1e04aa")
    'slc_7c1e04aa'
    >>> hash_bytes(b"")[:12]
    'af1349b9f5f9'
"""

from __future__ import annotations

from rayform._blobfmt import decode_table, decode_timestamps, encode_table, encode_timestamps
from rayform._hashing import hash_bytes, hash_file, new_hasher
from rayform._ids import (
    HASH_RE,
    SEGMENT_ID_RE,
    SLICE_ID_RE,
    STREAM_NAME_RE,
    check_hash,
    check_segment_id,
    check_slice_id,
    check_stream_name,
    sharded_path,
)
from rayform._textfmt import decode_text, encode_text
from rayform.manifest import FORMAT as MANIFEST_FORMAT
from rayform.manifest import FORMAT_VERSION as MANIFEST_FORMAT_VERSION
from rayform.manifest import (
    PAGE_FORMAT,
    PAGE_ROWS,
    ColumnarManifest,
    build_root,
    canonical_json,
    load_manifest,
    page_refs,
    segments_to_table,
    table_to_pages,
)

__all__ = [
    "HASH_RE",
    "MANIFEST_FORMAT",
    "MANIFEST_FORMAT_VERSION",
    "PAGE_FORMAT",
    "PAGE_ROWS",
    "SEGMENT_ID_RE",
    "SLICE_ID_RE",
    "STREAM_NAME_RE",
    "ColumnarManifest",
    "build_root",
    "canonical_json",
    "check_hash",
    "check_segment_id",
    "check_slice_id",
    "check_stream_name",
    "decode_table",
    "decode_text",
    "decode_timestamps",
    "encode_table",
    "encode_text",
    "encode_timestamps",
    "hash_bytes",
    "hash_file",
    "load_manifest",
    "new_hasher",
    "page_refs",
    "segments_to_table",
    "sharded_path",
    "table_to_pages",
]
