"""The manifest: what a slice contains, as content hashes, and the one model of its segments.

The public face of the manifest package. One format is read and written (``format_version``
3): a canonical-JSON root listing Arrow pages, opened as a :class:`ColumnarManifest`; its
records are :class:`Segment`, :class:`Stream`, :class:`BlobRef` and :class:`Rendition`, and
:class:`Manifest` holds a list of them in memory. A slice's segments are one :class:`Segments`
table (``Slice.segments``). Older versions (1: one JSON document; 2: pages without renditions)
are refused with the command that rewrites them, which :func:`upgrade_manifest` implements.

Modules: ``_model`` (the segment/stream records), ``_columnar`` (the root and pages;
renditions: ``_rendcols``), ``_legacy`` (reading versions 1 and 2, for the rewrite only),
``_pagecheck`` (checks of untrusted
pages), ``_pagemap`` and ``_pagerows`` (reading mapped pages cheaply), ``_checkmarks`` (pages
already checked), ``_arrow`` (pyarrow, lazily, and its arrays as numpy), ``_columns`` (a
manifest's columns), ``_segments`` (the segment model, :class:`Segments`), ``_display`` (its
repr, HTML and exports), ``_blobchoice`` (the blobs a training resolution reads), ``_select``
(selections).
"""

from rayform.manifest._checkmarks import CheckMarks
from rayform.manifest._columnar import (
    MIGRATE_HINT,
    PAGE_FORMAT,
    PAGE_ROWS,
    ColumnarManifest,
    build_root,
    manifest_hash,
    page_refs,
    segments_of,
    segments_to_table,
    table_to_pages,
)
from rayform.manifest._columnar import load as load_manifest
from rayform.manifest._columnar import not_found as segment_not_found
from rayform.manifest._display import SegmentColumns
from rayform.manifest._legacy import Upgraded, old_version, upgrade_manifest
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
    "FRAME_CONVENTIONS",
    "MAX_MANIFEST_BYTES",
    "MIGRATE_HINT",
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
    "Upgraded",
    "build_root",
    "canonical_json",
    "chosen_blobs",
    "first_kinds",
    "load_manifest",
    "manifest_hash",
    "old_version",
    "page_refs",
    "parse_manifest_json",
    "release_pages",
    "segment_not_found",
    "segments_of",
    "segments_to_table",
    "select_rows",
    "table_to_pages",
    "upgrade_manifest",
]
