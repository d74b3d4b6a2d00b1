"""The manifest: what a slice contains, as content hashes, and the one model of its segments.

The public face of the manifest package. Version 1 (one JSON document) is read and written by
:class:`Manifest`, :class:`Segment`, :class:`Stream`, :class:`BlobRef`; version 2 (a root listing
Arrow pages, for slices of millions of segments) by :class:`ColumnarManifest`. Whatever the
version, a slice's segments are one :class:`Segments` table (``Slice.segments``).

Modules: ``_model`` (the v1 document and the segment/stream records), ``_columnar`` (the v2
root and pages; version 3: with renditions, ``_rendcols``), ``_pagecheck`` (checks of untrusted
pages), ``_pagemap`` and ``_pagerows`` (reading mapped pages cheaply), ``_checkmarks`` (pages
already checked), ``_arrow`` (pyarrow, lazily, and its arrays as numpy), ``_columns`` (a
manifest's columns), ``_segments`` (the segment model, :class:`Segments`), ``_display`` (its
repr, HTML and exports), ``_blobchoice`` (the blobs a training resolution reads), ``_select``
(selections).
"""

from rayform.manifest._checkmarks import CheckMarks
from rayform.manifest._columnar import (
    FORMAT_VERSION_2,
    FORMAT_VERSION_3,
    PAGE_FORMAT,
    PAGE_ROWS,
    ColumnarManifest,
    build_root,
    page_refs,
    segments_of,
    segments_to_table,
    table_to_pages,
)
from rayform.manifest._columnar import load as load_manifest
from rayform.manifest._columnar import not_found as segment_not_found
from rayform.manifest._display import SegmentColumns
from rayform.manifest._model import (
    CARTESIAN_QUANTITIES,
    FORMAT,
    FORMAT_VERSION,
    FRAME_CONVENTIONS,
    MAX_MANIFEST_BYTES,
    TEXT_DTYPE,
    TEXT_TIMINGS,
    BlobRef,
    Manifest,
    Rendition,
    Segment,
    Stream,
    canonical_json,
    parse_manifest_json,
)
from rayform.manifest._segments import Segments, chosen_blobs, first_kinds, release_pages
from rayform.manifest._select import select_rows

__all__ = [
    "CARTESIAN_QUANTITIES",
    "FORMAT",
    "FORMAT_VERSION",
    "FORMAT_VERSION_2",
    "FORMAT_VERSION_3",
    "FRAME_CONVENTIONS",
    "MAX_MANIFEST_BYTES",
    "PAGE_FORMAT",
    "PAGE_ROWS",
    "BlobRef",
    "CheckMarks",
    "ColumnarManifest",
    "Manifest",
    "Rendition",
    "Segment",
    "SegmentColumns",
    "Segments",
    "Stream",
    "TEXT_DTYPE",
    "TEXT_TIMINGS",
    "build_root",
    "canonical_json",
    "chosen_blobs",
    "first_kinds",
    "load_manifest",
    "page_refs",
    "parse_manifest_json",
    "release_pages",
    "segment_not_found",
    "segments_of",
    "segments_to_table",
    "select_rows",
    "table_to_pages",
]
