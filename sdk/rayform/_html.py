"""Small HTML and text pieces for the notebook reprs (``_repr_html_``) of the public objects.

Every value passes through :func:`html.escape`: segment IDs, sites and stream names come from
a server, and a notebook renders what a repr returns. Nothing here imports another Rayform
module, so any module can use it (sizes: :func:`rayform.units.human_bytes`).
"""

from __future__ import annotations

import html
from collections.abc import Iterable, Sequence
from datetime import datetime, timezone
from typing import Any

__all__ = ["esc", "header", "kv_table", "table", "utc", "wrap"]

#: The style of every table we render: compact, left-aligned, readable in light and dark themes.
_TABLE = 'style="border-collapse:collapse;font-size:90%;text-align:left"'
_CELL = 'style="padding:1px 8px;text-align:left"'


def esc(value: str | int | float | None) -> str:
    """``str(value)``, escaped for HTML text and attributes."""
    return html.escape(str(value), quote=True)


def utc(ns: int) -> str:
    """A Unix time in nanoseconds as a UTC date to the millisecond, e.g.
    ``"2026-01-05 09:30:00.000 UTC"``."""
    when = datetime.fromtimestamp(ns // 1_000_000_000, tz=timezone.utc)
    millis = (ns % 1_000_000_000) // 1_000_000
    return f"{when:%Y-%m-%d %H:%M:%S}.{millis:03d} UTC"


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """An HTML ``<table>`` of escaped cells."""
    head = "".join(f"<th {_CELL}>{esc(h)}</th>" for h in headers)
    body = "".join(
        "<tr>" + "".join(f"<td {_CELL}>{esc(v)}</td>" for v in row) + "</tr>" for row in rows
    )
    return f"<table {_TABLE}><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def kv_table(pairs: Iterable[tuple[str, Any]]) -> str:
    """A two-column table of ``name: value`` rows (names in bold)."""
    body = "".join(f"<tr><th {_CELL}>{esc(k)}</th><td {_CELL}>{esc(v)}</td></tr>" for k, v in pairs)
    return f"<table {_TABLE}><tbody>{body}</tbody></table>"


def header(title: str, *facts: str) -> str:
    """A bold title followed by facts separated by middle dots (all escaped)."""
    rest = "".join(f" &middot; {esc(f)}" for f in facts)
    return f"<div><b>{esc(title)}</b>{rest}</div>"


def wrap(*parts: str) -> str:
    """The already-rendered ``parts`` in one ``<div>``."""
    return "<div>" + "".join(parts) + "</div>"
