"""Lineage of a published slice: the parent it was selected from, the selection and the label
set it was filtered on, recorded in the new manifest's root (``"lineage"``)."""

from __future__ import annotations

from typing import Any

from rayform._ids import HASH_RE, SLICE_ID_RE
from rayform._untrusted import shown
from rayform.errors import ManifestError

__all__ = ["child_slice_id", "lineage_of"]


def child_slice_id(manifest_hash: str) -> str:
    """The ID of the slice published as manifest ``manifest_hash``: the same selection of the
    same parent gives the same manifest, hence the same ID."""
    return f"slc_{manifest_hash[:16]}"


def lineage_of(doc: object) -> dict[str, Any] | None:
    """The checked ``lineage`` of a manifest root (untrusted), or ``None`` if it has none.

    Raises:
        ManifestError: a lineage that breaks the format (the message names the field).
    """
    if not isinstance(doc, dict) or "lineage" not in doc:
        return None
    lineage = doc["lineage"]
    ok = (
        isinstance(lineage, dict)
        and set(lineage) == {"parent", "parent_manifest", "select", "labels"}
        and isinstance(lineage["parent"], str)
        and SLICE_ID_RE.fullmatch(lineage["parent"]) is not None
        and isinstance(lineage["parent_manifest"], str)
        and HASH_RE.fullmatch(lineage["parent_manifest"]) is not None
        and isinstance(lineage["select"], str)
        and len(lineage["select"]) <= 65536
        and (
            lineage["labels"] is None
            or (
                isinstance(lineage["labels"], str)
                and HASH_RE.fullmatch(lineage["labels"]) is not None
            )
        )
    )
    if not ok:
        raise ManifestError(
            f"manifest root: lineage {shown(repr(lineage), 120)} is not "
            '{"parent": slc_..., "parent_manifest": hash, "select": text, "labels": hash or null}'
        )
    return dict(lineage)
