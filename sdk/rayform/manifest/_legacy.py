"""Rewriting manifests of the older formats into the one format (the migrate commands).

Before the one format (``format_version`` 3) two others were written: version 1, one JSON
document listing every segment, and version 2, a root listing Arrow pages whose stream rows
have no ``renditions`` field. Nothing reads them any more (``load_manifest`` refuses them with
the command that rewrites them); this module is that rewrite, shared by ``rayform-server
migrate`` (a data root) and ``rayform cache migrate`` (a client cache). It reads an old
manifest into the segment table and writes that table as the one format: the same segments,
description, page size and lineage, so the same bytes a fresh commit of those segments gives.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from rayform._hashing import hash_bytes
from rayform._untrusted import loads, shown
from rayform.errors import ManifestError
from rayform.manifest._arrow import load as pyarrow
from rayform.manifest._columnar import (
    OLDER_VERSIONS,
    PAGE_FORMAT,
    PAGE_ROWS,
    build_root,
    table_to_pages,
)
from rayform.manifest._model import FORMAT, Manifest, parse_manifest_json
from rayform.manifest._pagecheck import check_root
from rayform.manifest._rendcols import rendition_type
from rayform.manifest._schema import page_schema, segments_to_table, stream_type

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["Upgraded", "old_version", "upgrade_manifest"]


@dataclass(frozen=True)
class Upgraded:
    """An older manifest rewritten into the one format.

    Attributes:
        old_version: the format version it was written in (1 or 2).
        root: the new root's canonical bytes (the new manifest hash is their BLAKE3).
        pages: the new pages' bytes, in root order (each named by its BLAKE3).
    """

    old_version: int
    root: bytes
    pages: list[bytes]

    @property
    def hash(self) -> str:
        """The new manifest's hash."""
        return hash_bytes(self.root)


def old_version(data: bytes) -> int | None:
    """The older format version (1 or 2) of manifest bytes, or ``None`` for anything else
    (the current format, another version, bytes that are not a manifest)."""
    try:
        doc = loads(data)
    except ValueError:
        return None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        return None
    version = doc.get("format_version")
    return int(version) if version in OLDER_VERSIONS else None


def upgrade_manifest(
    data: bytes,
    expected_hash: str | None,
    read_pages: Callable[[list[dict[str, Any]]], Sequence[str | Path]],
) -> Upgraded:
    """Rewrite a version 1 or 2 manifest into the one format.

    Args:
        data: the old manifest's bytes (a version 1 document or a version 2 root).
        expected_hash: BLAKE3 the bytes must have (``None``: unchecked).
        read_pages: for version 2, given the root's page references (``{"hash", "size",
            "segments"}``), returns each page's verified local path, in order.

    Returns:
        The new root and pages; nothing is written.

    Raises:
        ManifestError: bad hash or JSON, not a version 1 or 2 manifest, or it breaks that
            version's schema.
    """
    doc = parse_manifest_json(data, expected_hash)
    version = doc.get("format_version") if isinstance(doc, dict) else None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or version not in OLDER_VERSIONS:
        raise ManifestError(
            f"not a manifest of an older format version {OLDER_VERSIONS} "
            f"(format_version {shown(repr(version), 40)}): nothing to rewrite"
        )
    if version == 1:
        manifest = Manifest.from_json(doc)
        table = segments_to_table(manifest.segments)
        page_rows, description, lineage = PAGE_ROWS, manifest.description, None
    else:
        if doc.get("page_format") != PAGE_FORMAT:
            raise ManifestError(f"a version 2 root's page_format must be {PAGE_FORMAT!r}")
        check_root(doc)
        table = _v2_table(doc, read_pages(list(doc["pages"])))
        page_rows, description = int(doc["page_rows"]), str(doc.get("description", ""))
        lineage = doc.get("lineage")
    if table.num_rows == 0:
        raise ManifestError("the manifest lists no segment: there is nothing to rewrite")
    pages = table_to_pages(table, page_rows)
    root = build_root(table, pages, description, page_rows, lineage=lineage)
    return Upgraded(int(version), root, pages)


def _v2_table(doc: dict[str, Any], paths: Sequence[str | Path]) -> pa.Table:
    """The segment table of a version 2 manifest's pages, each stream row given an empty
    ``renditions`` list (version 2 could not list any)."""
    pa = pyarrow()
    tables = []
    for ref, path in zip(doc["pages"], paths, strict=True):
        try:
            with pa.memory_map(str(path)) as source:
                page = pa.ipc.open_file(source).read_all()
        except (pa.ArrowException, OSError) as exc:
            raise ManifestError(
                f"version 2 page {ref['hash'][:12]}... is not an Arrow IPC file: {shown(exc)}"
            ) from exc
        if page.num_rows != int(ref["segments"]):
            raise ManifestError(
                f"version 2 page {ref['hash'][:12]}... holds {page.num_rows} segments, "
                f"the root says {ref['segments']}"
            )
        tables.append(_with_renditions(page, ref["hash"]))
    return pa.concat_tables(tables)


def _with_renditions(page: pa.Table, digest: str) -> pa.Table:
    """A version 2 page as a table of the page schema (an empty ``renditions`` per row)."""
    pa = pyarrow()
    v2_fields = [f for f in stream_type() if f.name != "renditions"]
    expected = pa.schema(
        [
            f if f.name != "streams" else pa.field("streams", pa.list_(pa.struct(v2_fields)))
            for f in page_schema()
        ]
    )
    if not page.schema.equals(expected):
        raise ManifestError(f"version 2 page {digest[:12]}... does not match the version 2 schema")
    streams = page.column("streams").combine_chunks()
    values = streams.values
    empty = pa.ListArray.from_arrays(
        pa.array(np.zeros(len(values) + 1, np.int32)), pa.array([], rendition_type())
    )
    rows = pa.StructArray.from_arrays(
        [values.field(f.name) for f in v2_fields] + [empty], fields=list(stream_type())
    )
    lists = pa.ListArray.from_arrays(streams.offsets, rows)
    return page.set_column(page.schema.get_field_index("streams"), "streams", lists).cast(
        page_schema()
    )
