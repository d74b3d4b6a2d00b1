"""The small JSON answers that lead to a manifest, checked where they enter the client.

``GET /v1/slices/{id}`` answers a *slice reference* (``{"id", "manifest", "manifest_size",
"description"}``) and ``GET /v1/slices`` a listing of them (``docs/protocol.md``). Anything else
(another JSON type, a field of the wrong type or range) is a
:class:`~rayform.errors.ProtocolError` naming the server and the field, never a ``KeyError`` or
``AttributeError`` out of the code that uses it.
"""

from __future__ import annotations

from typing import Any

from rayform._ids import HASH_RE, SLICE_ID_RE
from rayform._untrusted import JSON, shown
from rayform.errors import ProtocolError
from rayform.manifest import MAX_MANIFEST_BYTES

__all__ = ["LISTING_CAP", "REFERENCE_CAP", "check_listing", "check_reference"]

#: Bytes a slice reference may take (its description is the only free-form field).
REFERENCE_CAP = 64 * 2**10
#: Bytes a listing of slices may take (tens of thousands of slices).
LISTING_CAP = 16 * 2**20


def _bad(where: str, field: str, value: object, expected: str) -> ProtocolError:
    return ProtocolError(
        f"{where} answered a slice reference whose {field} is {shown(repr(value), 80)}, "
        f"expected {expected}; the server (or a proxy in front of it) is misbehaving: report "
        "it to its operator"
    )


def check_reference(doc: JSON, where: str) -> tuple[str, int, str]:
    """``(manifest hash, manifest size, description)`` of a slice reference.

    Args:
        doc: the parsed JSON answer.
        where: what was asked of which server, e.g. ``"resolving slice slc_... : the server
            at http://..."`` (starts the message).

    Raises:
        ProtocolError: ``doc`` is not a reference, or a field is malformed; the manifest size
            (which bounds the manifest's read) may not exceed
            :data:`~rayform.manifest.MAX_MANIFEST_BYTES`.
    """
    if not isinstance(doc, dict):
        raise _bad(where, "JSON type", type(doc).__name__, "an object")
    digest = doc.get("manifest")
    if not isinstance(digest, str) or not HASH_RE.fullmatch(digest):
        raise _bad(where, '"manifest"', digest, "64 lowercase hex digits")
    size = doc.get("manifest_size", MAX_MANIFEST_BYTES)  # older servers: the cap alone
    if isinstance(size, bool) or not isinstance(size, int) or not 0 < size <= MAX_MANIFEST_BYTES:
        raise _bad(where, '"manifest_size"', size, f"a byte count from 1 to {MAX_MANIFEST_BYTES}")
    description = doc.get("description", "")
    if not isinstance(description, str):
        raise _bad(where, '"description"', description, "a string")
    return digest, size, description


def check_listing(doc: JSON, server: str) -> list[dict[str, Any]]:
    """The ``[{"id", "manifest", "description"}, ...]`` of a listing of slices.

    Raises:
        ProtocolError: ``doc`` is not a listing or an entry is malformed.
    """
    where = f"listing slices: {server}"
    if not isinstance(doc, dict):
        raise _bad(where, "JSON type", type(doc).__name__, "an object")
    slices = doc.get("slices", [])
    if not isinstance(slices, list):
        raise _bad(where, '"slices"', type(slices).__name__, "a list")
    out = []
    for entry in slices:
        if not isinstance(entry, dict):
            raise _bad(where, "entry", entry, "an object")
        slice_id = entry.get("id")
        if not isinstance(slice_id, str) or not SLICE_ID_RE.fullmatch(slice_id):
            raise _bad(where, '"id"', slice_id, "a slice ID such as 'slc_7c1e04aa'")
        digest, _, description = check_reference(entry, f"{where} (slice {slice_id})")
        out.append({"id": slice_id, "manifest": digest, "description": description})
    return out
