"""A blob of the local store as an HTTP answer: Starlette's ``FileResponse`` behind our checks.

Starlette serves the bytes: the whole blob, one range (``206`` with ``Content-Range``) or
several (``206 multipart/byteranges``, overlapping ones merged), ``HEAD``, and the file read
in chunks without blocking the event loop. What it would decide differently is decided here
first, by RFC 9110, and the ``Range`` it reads is the one checked here, rewritten:

* ``If-Range`` is compared with the blob's strong ETag (its content hash); when it differs,
  the ``Range`` is dropped, unread, and the whole blob comes back (RFC 9110 13.2.2);
* bad ``Range`` syntax is a ``400`` and a range that selects no byte a ``416``, each with
  our JSON error (Starlette answers plain text);
* positions of any length are read (``int()`` refuses thousands of digits, so Starlette
  would refuse such a range): a last position past the end means the end, a first one past
  the end selects nothing;
* of several ranges, those that select no byte are left out; only when none is left is it a
  ``416`` (Starlette answers ``416`` when any one is past the end).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from starlette.responses import FileResponse
from starlette.types import Receive, Scope, Send

from rayform_server._apierror import ApiError

__all__ = ["BlobFile", "check_ranges"]

_SPEC_RE = re.compile(r"([0-9]*)-([0-9]*)")
#: Byte positions of a ``Range`` past this are taken as this (no blob is an exabyte).
_FAR = 10**18


def _position(digits: str) -> int:
    """A byte position of a ``Range`` header: past :data:`_FAR` it is :data:`_FAR` (past the
    end of any blob; ``int()`` of thousands of digits raises, and no answer needs them)."""
    digits = digits.lstrip("0") or "0"
    return _FAR if len(digits) > len(str(_FAR)) else min(int(digits), _FAR)


def check_ranges(header: str, size: int) -> str:
    """The ``Range`` header ``header`` for a blob of ``size`` bytes, as the ranges it selects.

    Args:
        header: the request's ``Range`` value, e.g. ``"bytes=100-"``.
        size: the blob's size in bytes.

    Returns:
        ``bytes=a-b[,c-d...]``: inclusive positions inside the blob, the ranges that select no
        byte left out.

    Raises:
        ApiError: ``400`` for bad syntax (a unit other than ``bytes``, a range that is not
            ``a-b``, ``a-`` or ``-n``, or ``b < a``); ``416`` when no range selects a byte.
    """
    value = header.strip().replace(" ", "")
    unit, eq, specs = value.partition("=")
    parts = [spec for spec in specs.split(",") if spec]  # empty elements: ignored (RFC 9110 5.6.1)
    matches = [_SPEC_RE.fullmatch(spec) for spec in parts]
    if (
        not eq
        or unit.lower() != "bytes"
        or not parts
        or any(
            m is None
            or (m[1] == "" and m[2] == "")
            or (m[1] and m[2] and _position(m[2]) < _position(m[1]))
            for m in matches
        )
    ):
        raise ApiError(
            400,
            "invalid_argument",
            f"bad Range header {header[:80]!r}: use 'bytes=a-b', 'bytes=a-' or 'bytes=-n'",
        )
    selected: list[str] = []
    for m in matches:
        assert m is not None
        if m[1] == "":  # the last n bytes
            n = _position(m[2])
            if n > 0 and size > 0:
                selected.append(f"{max(0, size - n)}-{size - 1}")
            continue
        first = _position(m[1])
        if first < size:
            last = size - 1 if m[2] == "" else min(_position(m[2]), size - 1)
            selected.append(f"{first}-{last}")
    if not selected:
        shown = value if len(value) <= 80 else f"{value[:60]}... ({len(value)} characters)"
        raise ApiError(
            416,
            "range_not_satisfiable",
            f"range {shown} selects no byte of the {size}-byte blob",
            {"Content-Range": f"bytes */{size}"},
        )
    return "bytes=" + ",".join(selected)


class BlobFile(FileResponse):
    """A blob file served by Starlette, reading the ``Range`` the handler checked.

    Args:
        path: the blob's file.
        stat_result: its ``os.stat`` (taken by the handler, which answers ``404`` without it).
        headers: the answer's headers (``ETag``, ``Cache-Control``): Starlette adds
            ``Content-Length``, ``Accept-Ranges`` and ``Last-Modified``.
        ranges: the checked ranges (:func:`check_ranges`), or None for the whole blob.
    """

    chunk_size = 256 * 1024

    def __init__(
        self,
        path: Path,
        stat_result: os.stat_result,
        headers: dict[str, str],
        ranges: str | None,
    ) -> None:
        super().__init__(
            path, headers=headers, media_type="application/octet-stream", stat_result=stat_result
        )
        self.ranges = ranges

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Serve the blob; Starlette sees the checked ``Range`` in place of the request's."""
        kept = [(k, v) for k, v in scope["headers"] if k not in (b"range", b"if-range")]
        if self.ranges is not None:
            kept.append((b"range", self.ranges.encode("latin-1")))
        await super().__call__({**scope, "headers": kept}, receive, send)
