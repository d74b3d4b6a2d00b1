"""The manifest format (``format_version`` 3): the segment table as Apache Arrow IPC pages.

A manifest is a small canonical-JSON *root* (named by the BLAKE3 of its bytes) that lists
*pages*: Arrow IPC files of up to ``page_rows`` segments each, every page named by the BLAKE3
of its bytes. One row is one segment; its ``streams`` column is a list of structs, one per
stream (sorted by name), whose flattened child is the stream table, with a ``renditions`` list
per stream row (``_rendcols``). See ``docs/manifest.md``.

This is the only format read and written: a root of an older version (1, one JSON document;
2, pages without ``renditions``) is refused with the command that rewrites it
(:data:`MIGRATE_HINT`; the rewrite itself is ``_legacy``).

Pages are opened by memory map: opening a slice of 1,000,000 segments reads the root, maps the
pages and builds no Python object per segment; :class:`~rayform.manifest._segments.Segments` materialises a
:class:`~rayform.manifest._model.Segment` only when one is asked for. ``pyarrow`` is imported here
lazily, so ``import rayform`` stays cheap.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from rayform._hashing import hash_bytes
from rayform._untrusted import loads, shown
from rayform.errors import ManifestError, NotFoundError
from rayform.manifest._arrow import arrow_ints
from rayform.manifest._arrow import load as pyarrow
from rayform.manifest._checkmarks import CheckMarks, Identity, file_identity
from rayform.manifest._columns import PageColumns
from rayform.manifest._model import (
    FORMAT,
    FORMAT_VERSION,
    STREAM_KINDS,
    BlobRef,
    Manifest,
    canonical_json,
    parse_manifest_json,
)
from rayform.manifest._pagecheck import check_page, check_root, check_stream_names
from rayform.manifest._pagemap import PageMaps
from rayform.manifest._schema import page_schema, segments_to_table
from rayform.manifest._segments import Segments

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = [
    "MIGRATE_HINT",
    "OLDER_VERSIONS",
    "PAGE_FORMAT",
    "PAGE_ROWS",
    "ColumnarManifest",
    "build_root",
    "check_version",
    "segments_of",
    "load",
    "manifest_hash",
    "open_pages",
    "page_refs",
    "parse_root",
    "segments_to_table",
    "table_to_pages",
]

#: Versions written before the one format (1: one JSON document; 2: pages without
#: ``renditions``): refused with :data:`MIGRATE_HINT`, rewritten by ``_legacy``.
OLDER_VERSIONS = (1, 2)
#: How to rewrite older manifests, as the refusal of one says it.
MIGRATE_HINT = (
    "rewrite it into the current format: on the server, `rayform-server migrate ROOT`; "
    "for a client cache, `rayform cache migrate`"
)
PAGE_FORMAT = "arrow-ipc-file"
#: Segments per page: ~4 MB pages for five streams, so 1,000,000 segments is 62 pages.
PAGE_ROWS = 16384


# -- writing ---------------------------------------------------------------------------------
def table_to_pages(table: pa.Table, page_rows: int = PAGE_ROWS) -> list[bytes]:
    """Split the segment table into pages of ``page_rows`` rows, each an Arrow IPC file.

    Pages are cut at fixed row positions, so two slices that share a run of segments at the
    same positions (e.g. a slice and the same slice with segments appended) share those pages.
    """
    pa = pyarrow()
    plain, schema = page_schema(plain=True), page_schema()
    table = table.cast(plain)
    pages = []
    for start in range(0, max(table.num_rows, 1), page_rows):
        # Re-encoded per page, so a page's dictionaries (hence its bytes) depend only on its
        # own rows, never on the table it was cut from.
        # `take` (not a slice) makes every buffer, nested ones too, start at the page's row.
        rows = arrow_ints(np.arange(start, min(start + page_rows, table.num_rows)))
        page = table.take(rows).combine_chunks().cast(schema)
        sink = pa.BufferOutputStream()
        with pa.ipc.new_file(sink, schema) as writer:
            # One record batch per page, also for a slice of no segment (whose table has no
            # chunk): the reader checks that every column is one chunk.
            if page.num_rows:
                writer.write_table(page)
            else:
                writer.write_batch(_empty_batch(schema))
        pages.append(sink.getvalue().to_pybytes())
    return pages


def _empty_batch(schema: pa.Schema) -> pa.RecordBatch:
    pa = pyarrow()
    return pa.RecordBatch.from_pylist([], schema=schema)


def build_root(
    table: pa.Table,
    pages: Sequence[bytes],
    description: str,
    page_rows: int = PAGE_ROWS,
    *,
    lineage: dict[str, Any] | None = None,
) -> bytes:
    """The canonical bytes of the root document for ``table`` stored as ``pages``; with
    ``lineage`` (a published selection's parent, ``rayform.curation``), that key too (readers
    that do not know it ignore it)."""
    cols = PageColumns([table])
    doc = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "description": description,
        "page_format": PAGE_FORMAT,
        "page_rows": page_rows,
        "pages": [
            {
                "hash": hash_bytes(p),
                "size": len(p),
                "segments": min(page_rows, table.num_rows - i * page_rows),
            }
            for i, p in enumerate(pages)
        ],
        "summary": cols.summary(),
    }
    if lineage is not None:
        doc["lineage"] = lineage
    return canonical_json(doc)


class ColumnarManifest:
    """A parsed manifest: the root document and its mapped pages.

    Offers what the in-memory :class:`~rayform.manifest._model.Manifest` offers
    (``segments``, ``blobs``, ``stream_names``), plus ``hash``, ``to_bytes`` and ``summary``
    (from the root, no page read). ``format_version`` is :data:`FORMAT_VERSION`.
    """

    format_version = FORMAT_VERSION

    def __init__(
        self,
        root: bytes,
        doc: dict[str, Any],
        pages: list[pa.Table],
        page_paths: list[str],
        maps: PageMaps | None = None,
        marks: CheckMarks | None = None,
    ) -> None:
        self._root = root
        self._marks = marks
        self.doc = doc
        self.description = str(doc.get("description", ""))
        self.summary: dict[str, Any] = doc["summary"]
        self._page_paths = page_paths
        self.segments = Segments(PageColumns(pages, page_paths, maps, summary=self.summary))

    def __reduce__(self) -> tuple[Any, ...]:
        # Pickled (spawned DataLoader workers) as paths: the receiver maps the same pages.
        return (_reopen, (self._root, self._page_paths, self._marks))

    def __repr__(self) -> str:
        return f"<ColumnarManifest {self.hash[:12]} segments={len(self.segments)}>"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ColumnarManifest) and other._root == self._root

    def __hash__(self) -> int:
        return hash(self._root)

    def to_bytes(self) -> bytes:
        """The root's canonical bytes (what the manifest hash names)."""
        return self._root

    @property
    def hash(self) -> str:
        return hash_bytes(self._root)

    def blobs(self, streams: list[str] | None = None) -> dict[str, BlobRef]:
        return self.segments.blobs(streams)

    def rendition_blobs(self, streams: list[str] | None = None) -> dict[str, BlobRef]:
        """The distinct rendition blobs of the named streams (all if ``None``), by hash
        (``blobs`` lists the originals only)."""
        return self.segments.rendition_blobs(streams)

    def to_v1(self) -> Manifest:
        """The same segments as an in-memory :class:`Manifest` (builds every segment: small
        slices only)."""
        return Manifest(segments=tuple(self.segments), description=self.description)

    def stream_names(self) -> list[str]:
        return sorted(self.summary["streams"])


def segments_of(manifest: Manifest | ColumnarManifest) -> Segments:
    """The :class:`Segments` of a manifest, mapped or in memory (an in-memory manifest's
    segments become the same columns as a page, so every reader has one model to read)."""
    if isinstance(manifest, ColumnarManifest):
        return manifest.segments
    return Segments(manifest.segments)


def manifest_hash(manifest: Manifest | ColumnarManifest) -> str:
    """The name of a manifest: a mapped one's own, or the hash an in-memory one gets when its
    segments are written (the root of :func:`segments_to_table`'s pages; builds every page)."""
    if isinstance(manifest, ColumnarManifest):
        return manifest.hash
    table = segments_to_table(manifest.segments)
    return hash_bytes(build_root(table, table_to_pages(table), manifest.description))


def _reopen(
    root: bytes, page_paths: list[str], marks: CheckMarks | None = None
) -> ColumnarManifest:
    return open_pages(root, parse_root(root), page_paths, marks)


def parse_root(data: bytes, doc: Any = None) -> dict[str, Any]:
    """Parse and check a root document (the bytes' hash is checked by the caller).

    Raises:
        ManifestError: not a root of this format (an older version names the command that
            rewrites it; a newer one asks to upgrade), or a field breaks the schema.
    """
    try:
        doc = loads(data) if doc is None else doc
    except ValueError as exc:
        raise ManifestError(f"manifest root is not valid JSON: {exc}") from None
    check_version(doc)
    if isinstance(doc, dict) and doc.get("page_format") != PAGE_FORMAT:
        raise ManifestError(
            f"unknown page_format {shown(repr(doc.get('page_format')), 40)} (expected {PAGE_FORMAT!r})"
        )
    check_root(doc)  # types and ranges of every field, page references and summary
    return dict(doc)


def open_pages(
    root: bytes,
    doc: dict[str, Any],
    page_paths: Sequence[str | Path],
    marks: CheckMarks | None = None,
) -> ColumnarManifest:
    """Map verified pages (in root order) and check them against the root and the schema.

    Args:
        root: the root's bytes.
        doc: the root, parsed and checked (:func:`parse_root`).
        page_paths: each page's verified local path, in root order.
        marks: where this user's marks of checked manifests live: a page whose file is the
            one that passed before is not checked again, nor is the whole manifest when every
            page is (:mod:`rayform.manifest._checkmarks`); ``None`` checks everything.

    Raises:
        ManifestError: a page is not an Arrow IPC file of the page schema, or disagrees with
            the root (row counts), or lists a segment twice or a malformed ID.
    """
    pa = pyarrow()
    schema = page_schema()
    digest = hash_bytes(root)
    marked = marks.load(digest) if marks is not None else {}
    passed: dict[str, Identity] = {}
    tables = []
    maps = PageMaps()
    for i, (ref, path) in enumerate(zip(doc["pages"], page_paths, strict=True)):
        try:
            table = maps.table(path)
        except (pa.ArrowException, OSError) as exc:
            raise ManifestError(
                f"manifest page {ref['hash'][:12]}... is not an Arrow IPC file: {shown(exc)}"
            ) from exc
        if not table.schema.equals(schema) or table.num_rows != int(ref["segments"]):
            raise ManifestError(
                f"manifest page {ref['hash'][:12]}... does not match the page schema or its "
                f"row count {ref['segments']}"
            )
        identity = file_identity(maps.stat(i))
        if marked.get(ref["hash"]) != identity:
            try:
                check_page(table, maps.span(i))
            except ManifestError as exc:
                raise ManifestError(
                    f"manifest page {ref['hash'][:12]}...: "
                    f"{str(exc).removeprefix('manifest page: ')}"
                ) from None
            maps.release(i)  # the checks read most of the page: unmap before the next one
        passed[ref["hash"]] = identity
        tables.append(table)
    if not tables:
        raise ManifestError("a manifest lists no page: it needs at least one segment")
    if passed != marked:
        check_stream_names(tables, doc)
        _check_pages(tables, doc)
        # The checks' scratch memory (hash tables over every ID) would otherwise stay in
        # Arrow's allocator, in this process and in every DataLoader worker forked from it.
        pa.default_memory_pool().release_unused()
        maps.release()  # the checks read every ID: unmap them
        if marks is not None:
            marks.save(digest, passed)
    return ColumnarManifest(root, doc, tables, [str(p) for p in page_paths], maps, marks)


def _check_pages(tables: list[pa.Table], doc: dict[str, Any]) -> None:
    pa = pyarrow()
    pc = pa.compute
    n = sum(t.num_rows for t in tables)
    if n != int(doc["summary"]["segments"]):
        raise ManifestError(
            f"manifest pages hold {n} segments, the root says {doc['summary']['segments']}"
        )
    ids = pa.chunked_array([c for t in tables for c in t.column("id").chunks], pa.string())
    if ids.null_count or pc.all(
        pc.match_substring_regex(ids, r"^seg_[0-9a-f]{8,64}$")
    ).as_py() not in (True, None):
        raise ManifestError(
            "manifest lists a malformed segment ID (expected seg_ and 8 to 64 hex digits)"
        )
    if pc.count_distinct(ids).as_py() != n:
        raise ManifestError("manifest lists a segment twice")
    for t in tables:  # null counts and dictionaries only: a few values per page
        if any(t.column(c).null_count for c in t.column_names):
            raise ManifestError(
                "a manifest page holds a null: pages spell absent values explicitly"
            )
        for chunk in t.column("streams").chunks:
            values = chunk.values
            if any(values.field(i).null_count for i in range(values.type.num_fields)):
                raise ManifestError("a manifest page holds a null stream field")
            kinds = values.field("kind")
            if kinds.null_count or not set(kinds.dictionary.to_pylist()) <= set(STREAM_KINDS):
                raise ManifestError(
                    f"manifest lists a stream of unknown kind (expected one of {STREAM_KINDS})"
                )


def check_version(doc: object) -> None:
    """Check that ``doc`` (parsed JSON) claims to be a manifest root of this format.

    Raises:
        ManifestError: another format; an older version (naming :data:`MIGRATE_HINT`); a
            newer one (asking to upgrade the SDK).
    """
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ManifestError(f'not a Rayform manifest (expected "format": "{FORMAT}")')
    version = doc.get("format_version")
    if version == FORMAT_VERSION:
        return
    if version in OLDER_VERSIONS:
        raise ManifestError(
            f"manifest format_version {version} is an older format that this SDK no longer "
            f"reads (it reads version {FORMAT_VERSION}): {MIGRATE_HINT}"
        )
    raise ManifestError(
        f"manifest format_version {shown(repr(version), 40)} is not supported by this SDK (it "
        f"reads version {FORMAT_VERSION}). Upgrade rayform: pip install -U rayform."
    )


def load(
    data: bytes,
    expected_hash: str | None,
    read_pages: Callable[[list[dict[str, Any]]], Sequence[str | Path]],
    marks: CheckMarks | None = None,
) -> ColumnarManifest:
    """Parse and open manifest bytes: check the root, fetch and check its pages.

    Args:
        data: the root's bytes.
        expected_hash: BLAKE3 the bytes must have (``None``: unchecked).
        read_pages: given the root's page references (``{"hash", "size", "segments"}``),
            returns each page's verified local path, in order.
        marks: this user's marks of checked manifests (see :func:`open_pages`).

    Raises:
        ManifestError: bad hash, bad JSON, another version (an older one names the command
            that rewrites it), a schema break.
    """
    checked = parse_root(data, parse_manifest_json(data, expected_hash))
    return open_pages(data, checked, list(read_pages(checked["pages"])), marks)


def page_refs(data: bytes) -> list[dict[str, Any]]:
    """The page references of manifest bytes; ``[]`` for bytes that are not a root of this
    format (an older version's included)."""
    try:
        doc = loads(data)
    except ValueError:
        return []
    if isinstance(doc, dict) and doc.get("format_version") == FORMAT_VERSION:
        return list(parse_root(data, doc)["pages"])
    return []


def not_found(slice_id: str, segment_id: str) -> NotFoundError:
    return NotFoundError(
        f"slice {slice_id} has no segment {shown(repr(segment_id), 80)}; list them with "
        f"`rayform slices show {slice_id} --segments`"
    )
