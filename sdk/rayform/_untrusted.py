"""What a server sends is untrusted: parse it with bounds, and show it without side effects.

* :func:`shown` is the one way text that came from a server (an error message, a description,
  a site or stream name, a value that broke the schema) reaches a terminal, a log line or an
  exception message: control characters (ANSI escapes, terminal title sequences, carriage
  returns, Unicode direction overrides) are escaped, and the length is capped with a marker.
* :func:`loads` parses JSON metadata so that only :class:`ValueError` can come out of it: no
  ``RecursionError`` (deep nesting), no ``Infinity``/``NaN`` (``float`` overflow later), and
  integers above Python's digit limit are a ``ValueError`` already.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

__all__ = ["JSON", "SHOWN_CHARS", "loads", "shown"]

#: A parsed JSON value (what :func:`loads` returns, and what a JSON document is built from).
JSON = dict[str, "JSON"] | list["JSON"] | str | int | float | bool | None

#: Characters of server text shown by default (a message gets more, see callers).
SHOWN_CHARS = 200

# C0 and C1 controls, DEL, line/paragraph separators and bidirectional overrides: anything a
# terminal may act on instead of printing, or that reorders or splits what the user reads.
# Lone UTF-16 surrogates too: they are not text, and a strict UTF-8 stdout fails on them.
_OTHERS = "\x7f-\x9f\u2028\u2029\u200e\u200f\u202a-\u202e\u2066-\u2069\ud800-\udfff"
_UNSAFE_RE = re.compile(f"[\x00-\x1f{_OTHERS}]")
_UNSAFE_KEEP_LINES_RE = re.compile(f"[\x00-\x09\x0b-\x1f{_OTHERS}]")  # all but "\n"


def _escape(m: re.Match[str]) -> str:
    code = ord(m.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def shown(value: object, limit: int = SHOWN_CHARS, *, lines: bool = False) -> str:
    """``value`` as text that is safe to print: controls escaped, at most ``limit`` characters
    of it kept (then ``... [N more characters]``).

    Args:
        value: server text (or any value; it is converted with ``str``).
        limit: characters of ``value`` kept; escaping may lengthen what is kept up to 6 times.
        lines: keep newlines (a multi-line message of our own that embeds server text
            already escaped); by default a newline is escaped like any control.
    """
    try:
        text = value if isinstance(value, str) else str(value)
    except Exception:  # e.g. an int over the digit limit: never fail while reporting a failure
        text = f"<unprintable {type(value).__name__}>"
    marker = ""
    if len(text) > limit:
        text, marker = text[:limit], f"... [{len(text) - limit} more characters]"
    pattern = _UNSAFE_KEEP_LINES_RE if lines else _UNSAFE_RE
    return pattern.sub(_escape, text) + marker


def _constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number JSON allows")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"number {shown(text, 40)} is out of range")
    return value


def loads(data: bytes | str) -> Any:
    """Parse JSON from a server.

    Raises:
        ValueError: not UTF-8 JSON, nested too deeply, ``NaN``/``Infinity`` or a number out of
            range, an integer of too many digits, a string with a lone UTF-16 surrogate, more
            than one object or array per 32 bytes (above 64 KiB). The message holds no server
            text unescaped.
    """
    raw = data if isinstance(data, bytes) else data.encode("utf-8", "replace")
    if len(raw) > _DENSE_FROM:
        containers = raw.count(b"{") + raw.count(b"[")
        if containers > len(raw) // _BYTES_PER_CONTAINER:
            # An empty object costs Python ~100 bytes against 3 in the text: 60 MiB of "{}," took
            # 1.8 GiB to parse. Rayform's documents hold one object or array per ~90 bytes.
            raise ValueError(
                f"JSON of {len(raw)} bytes holds {containers} objects and arrays, more than one "
                f"per {_BYTES_PER_CONTAINER} bytes: no Rayform document is that dense, and "
                "parsing it would take gigabytes of memory"
            )
    try:
        doc = json.loads(data, parse_constant=_constant, parse_float=_finite)
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise ValueError(shown(exc)) from None
    # JSON's "\ud800" escapes decode to lone surrogates, which are not text: anything that
    # later encodes them (Arrow, a UTF-8 terminal) would fail far from here. Only documents
    # that hold such an escape are walked.
    if _SURROGATE_ESCAPE.search(raw):
        _check_text(doc)
    return doc


#: Documents larger than this (bytes) may hold at most one object or array per
#: ``_BYTES_PER_CONTAINER`` bytes (a brace inside a string counts too: it only errs strict).
_DENSE_FROM = 64 * 1024
_BYTES_PER_CONTAINER = 32

_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


def _check_text(doc: object) -> None:
    todo = [doc]
    while todo:
        value = todo.pop()
        if isinstance(value, dict):
            todo.extend(value.keys())
            todo.extend(value.values())
        elif isinstance(value, list):
            todo.extend(value)
        elif isinstance(value, str) and not value.isascii():
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                raise ValueError(
                    f"JSON text {shown(value, 40)} holds a lone UTF-16 surrogate (an unpaired "
                    "\\ud800-\\udfff escape), which is not text"
                ) from None
