"""Validation of the identifiers that cross the wire: slice IDs, segment IDs, BLAKE3 hashes,
and the sharded path (``ab/<hash>``) under which a hash is stored.

Shared by the SDK and the server stub so both sides accept exactly the same strings.
"""

from __future__ import annotations

import re
from pathlib import Path

from rayform.errors import InvalidArgumentError

__all__ = [
    "HASH_RE",
    "SEGMENT_ID_RE",
    "SLICE_ID_RE",
    "STREAM_NAME_RE",
    "check_hash",
    "check_segment_id",
    "check_slice_id",
    "check_stream_name",
    "check_stream_names",
]

# Anchored with \Z, not $: "$" also matches before a trailing newline, so ``.match`` would
# accept "<64 hex>\n" (then a URL or a file name holds a newline). Callers use ``fullmatch``.
SLICE_ID_RE = re.compile(r"\Aslc_[0-9a-f]{8,64}\Z")
SEGMENT_ID_RE = re.compile(r"\Aseg_[0-9a-f]{8,64}\Z")
HASH_RE = re.compile(r"\A[0-9a-f]{64}\Z")
# e.g. "cam0/rgb", "joints/position_delta": lowercase path-like words, never "..".
STREAM_NAME_RE = re.compile(r"\A[a-z0-9_][a-z0-9_.-]*(/[a-z0-9_][a-z0-9_.-]*){0,4}\Z")


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def check_slice_id(value: object, *, new: bool = False) -> str:
    """Return ``value`` if it is a slice ID (``slc_`` + 8-64 lowercase hex), else raise.

    Args:
        value: the candidate ID.
        new: the caller is naming a slice it is about to create (ingest, demo), so the hint
            says how to choose an ID rather than where to find an existing one.
    """
    if not isinstance(value, str) or not SLICE_ID_RE.fullmatch(value):
        if new:
            hint = (
                "Choose a new one, e.g. 'slc_' plus 8 random hex digits: "
                "python -c \"import secrets; print('slc_' + secrets.token_hex(4))\""
            )
        else:
            hint = "`rayform slices ls` lists the slice IDs your token may read."
        raise InvalidArgumentError(
            f"malformed slice ID {_shown(value)}: a slice ID is 'slc_' followed by 8 to 64 "
            f"lowercase hex digits, e.g. 'slc_7c1e04aa'. {hint}"
        )
    return value


def check_segment_id(value: object) -> str:
    """Return ``value`` if it is a segment ID (``seg_`` + 8-64 lowercase hex), else raise."""
    if not isinstance(value, str) or not SEGMENT_ID_RE.fullmatch(value):
        raise InvalidArgumentError(
            f"malformed segment ID {_shown(value)}: a segment ID is 'seg_' followed by 8 to 64 "
            "lowercase hex digits, e.g. 'seg_0a1b2c3d'."
        )
    return value


def check_hash(value: object) -> str:
    """Return ``value`` if it is a BLAKE3 hex digest (64 lowercase hex), else raise."""
    if not isinstance(value, str) or not HASH_RE.fullmatch(value):
        raise InvalidArgumentError(
            f"malformed content hash {_shown(value)}: expected 64 lowercase hex digits "
            "(a BLAKE3 digest)."
        )
    return value


def sharded_path(directory: Path, digest: str) -> Path:
    """``directory/ab/<digest>``: where a content-addressed file lives, in the client cache
    and in the server's data root alike (docs/layout.md). Checks ``digest`` first."""
    check_hash(digest)
    return directory / digest[:2] / digest


def check_stream_name(value: object) -> str:
    """Return ``value`` if it is a stream name such as ``cam0/rgb``, else raise."""
    if not isinstance(value, str) or not STREAM_NAME_RE.fullmatch(value) or ".." in value:
        raise InvalidArgumentError(
            f"malformed stream name {_shown(value)}: use lowercase words separated by '/', "
            "e.g. 'cam0/rgb' or 'joints/position'."
        )
    return value


def check_stream_names(value: object, what: str = "streams") -> list[str]:
    """``value``, a list (or other iterable) of stream names, as a list, each checked.

    A string is refused: it would be read as its characters (``"cam0/rgb"`` as ``"c"``,
    ``"a"``...), and a comma-separated one is the command line's spelling.
    """
    if isinstance(value, str):
        example = [n.strip() for n in value.split(",") if n.strip()] or ["cam0/rgb"]
        raise InvalidArgumentError(
            f"{what}={_shown(value)} is one string: pass a list of stream names, e.g. "
            f"{what}={_shown(example)}"
        )
    try:
        names = list(value)  # type: ignore[call-overload]
    except TypeError:
        raise InvalidArgumentError(
            f"{what}={_shown(value)}: pass a list of stream names, e.g. {what}=['cam0/rgb']"
        ) from None
    return [check_stream_name(name) for name in names]
