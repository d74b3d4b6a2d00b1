"""A selection of a slice published as a new slice: a new manifest, no new blob.

The server rebuilds the selection itself, from the parent's stored manifest and (for a filter
on labels) the label-set version the client pinned, with the same function the SDK's views use
(:func:`rayform.curation.view_rows`), so what it publishes is what the client saw; the count
the client sends is checked against it. The new manifest lists the selected segments (their
page rows, taken as they are: every blob hash and size the parent's), records its lineage in
the root, and is named by its hash; the default slice ID derives from that hash, so the same
selection publishes the same slice, once.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import httpx

from rayform.curation import Labels, child_slice_id, view_rows
from rayform.errors import (
    AccessDeniedError,
    ConflictError,
    IntegrityError,
    InvalidArgumentError,
    NotFoundError,
)
from rayform.format import SLICE_ID_RE, check_hash, hash_bytes
from rayform.manifest import BlobRef, build_root, segments_of, table_to_pages
from rayform.uri import select_arguments, selection_expression
from rayform_server.auth import Grant
from rayform_server.labelstore import LabelStore, audit
from rayform_server.store import Store

__all__ = ["publish"]

_KEYS = {"parent", "manifest", "select", "segments", "description", "id"}


def publish(
    store: Store, labels: LabelStore, grant: Grant, body: Mapping[str, Any]
) -> dict[str, Any]:
    """Publish ``body`` (``{"parent", "manifest", "select", "segments", "description", "id"?}``).

    Returns:
        ``{"id", "manifest", "created"}`` (``created`` false: that slice named this manifest
        already).

    Raises:
        InvalidArgumentError: a malformed body or selection.
        NotFoundError: the parent is unknown, out of the token's read scope, or never named
            that manifest.
        AccessDeniedError: the token may not write the new slice ID.
        ConflictError: the selection keeps another number of episodes than the client's view,
            or ``id`` names a slice with another manifest.
    """
    if (
        not isinstance(body, Mapping)
        or set(body) - _KEYS
        or not {"parent", "manifest", "select"} <= set(body)
    ):
        raise InvalidArgumentError(
            'publishing takes {"parent": slc_..., "manifest": hash, "select": expression, '
            '"segments": count, "description": text, "id"?: slc_...}'
        )
    parent, manifest_hash, text = body["parent"], body["manifest"], body["select"]
    description = body.get("description", "")
    if not isinstance(parent, str) or not SLICE_ID_RE.fullmatch(parent):
        raise InvalidArgumentError(
            f"parent {str(parent)[:80]!r} is not a slice ID such as slc_7c1e04aa"
        )
    if not isinstance(text, str) or not isinstance(description, str) or len(description) > 1000:
        raise InvalidArgumentError(
            "select is a selection expression, description a string of at most 1000 characters"
        )
    check_hash(manifest_hash)
    if not grant.allows(parent) or not store.has_named(parent, manifest_hash):
        raise NotFoundError(
            f"no slice {parent} naming manifest {manifest_hash[:12]}... (or this token may not read it)"
        )
    kwargs = select_arguments(text)
    pinned = kwargs.pop("labels", None)
    manifest = store.load_manifest(manifest_hash)
    segs = segments_of(manifest)
    label_set = None
    if pinned is not None:
        label_set = Labels(labels.load(parent, manifest_hash, pinned), pinned, segs)
    rows, selection = view_rows(
        segs,
        parent,
        labels=label_set,
        read_blob=lambda ref: _blob_bytes(store, ref),
        **kwargs,
    )
    expected = body.get("segments")
    if expected is not None and expected != len(rows):
        raise ConflictError(
            f"the selection keeps {len(rows)} episodes of {parent} here, and {expected} in the "
            "client's view: the client and the server read different data; resolve the slice again"
        )
    canonical = selection_expression(selection)
    assert canonical is not None  # parsed from an expression, so it is one
    lineage = {
        "parent": parent,
        "parent_manifest": manifest_hash,
        "select": canonical,
        "labels": pinned,
    }
    table = segs.take(rows).page_table()
    pages = table_to_pages(table)
    root = build_root(
        table, pages, f"{len(rows)} episodes of {parent}: {canonical}"[:1000], lineage=lineage
    )
    digest = hash_bytes(root)
    slice_id = body.get("id") or child_slice_id(digest)
    if not isinstance(slice_id, str) or not SLICE_ID_RE.fullmatch(slice_id):
        raise InvalidArgumentError(
            f"id {str(slice_id)[:80]!r} is not a slice ID such as slc_7c1e04aa"
        )
    if not grant.may_write(slice_id):
        raise AccessDeniedError(
            f"this token may not create slice {slice_id}: it needs a write scope that covers it "
            "(a write token, docs/curation.md); with a scoped token pass an ID inside its scope"
        )
    existing = store.get_slice(slice_id)
    if existing is not None and existing["manifest"] != digest:
        raise ConflictError(
            f"slice {slice_id} exists and names another manifest: choose another ID (or none)"
        )
    created = existing is None
    if created:
        store.put_pages_and_root(root, pages)
        store.set_slice(slice_id, digest, description)
        audit(
            store,
            {
                "action": "create",
                "by": grant.name,
                "slice": slice_id,
                "manifest": digest,
                "parent": parent,
                "parent_manifest": manifest_hash,
                "select": canonical,
                "labels": pinned,
                "segments": len(rows),
            },
        )
    return {"id": slice_id, "manifest": digest, "created": created}


def _blob_bytes(store: Store, ref: BlobRef) -> bytes:
    """A blob's bytes, checked against its hash: what a filter on ``task`` reads of the
    parent's text blobs (one small blob per distinct task), from disk or the object store."""
    path = store.blobs.local_path(ref.hash)
    if path is not None:
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise NotFoundError(f"blob {ref.hash[:12]}... is missing from this store") from exc
    else:
        url = store.blobs.presigned_url(ref.hash, 600)
        if url is None:
            raise InvalidArgumentError(
                f"blob {ref.hash[:12]}... is in {store.blobs.describe()}, which gives no URL"
            )
        try:
            resp = httpx.get(url, timeout=60.0)
            resp.raise_for_status()
        except httpx.HTTPError as exc:
            raise NotFoundError(f"blob {ref.hash[:12]}...: the object store: {exc}") from exc
        data = resp.content
    if len(data) != ref.size or hash_bytes(data) != ref.hash:
        raise IntegrityError(f"blob {ref.hash[:12]}... in this store does not match its hash")
    return data
