"""The ``select=`` parameter of a dataset URI: a ``Slice.select`` view as canonical text.

::

    end_ns:1700000000000000000;sites:lab-a,lab-zurich;start_ns:1690000000000000000

Keys in alphabetical order (``end_ns``, ``filter``, ``labels``, ``segments``, ``sites``,
``start_ns``), each at most once, ``;`` between them; lists sorted, without repeats, ``,``
between items, each item percent-encoded (RFC 3986, unreserved characters kept). A chain of
views (``slice_.select(...).select(...)``) is one selection: every filter narrows, so the chain
is their intersection (sites and IDs intersected, the latest start and the earliest end, the
filters joined with ``and``). ``filter`` is a filter's canonical text
(``select(where="success and quality >= 0.7")``, ``rayform.curation``), percent-encoded whole;
``labels`` the hash of the label set it read, so the URI pins the labels' version too. A
``where=`` predicate given as a Python function is code, not text: such a view has no
expression and the dataset URI lists its episodes in ``segments=`` instead.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import quote, unquote

from rayform._ids import HASH_RE, SEGMENT_ID_RE
from rayform.curation import check_filters, parse_filter
from rayform.errors import InvalidArgumentError

__all__ = ["parse_selection", "select_arguments", "selection_expression"]

_KEYS = ("end_ns", "filter", "labels", "segments", "sites", "start_ns")
_SAFE_TEXT = re.compile(r"[A-Za-z0-9._~%,:;/-]*")


def selection_expression(selection: dict[str, Any] | None) -> str | None:
    """Canonical text of a ``Slice.selection`` (chains flattened), or ``None`` if it holds a
    ``where`` predicate (or there is no selection)."""
    if selection is None:
        return None
    sets: dict[str, set[str]] = {}
    start: int | None = None
    end: int | None = None
    filters: list[str] = []
    pinned: set[str] = set()
    level: dict[str, Any] | None = selection
    while level is not None:
        if "where" in level:
            return None
        if level.get("filter") is not None:
            filters.append(str(level["filter"]))
        if level.get("labels") is not None:
            pinned.add(str(level["labels"]))
        for key in ("segments", "sites"):
            if key in level:
                sets[key] = set(level[key]) & sets[key] if key in sets else set(level[key])
        if "start_ns" in level:
            start = int(level["start_ns"]) if start is None else max(start, int(level["start_ns"]))
        if "end_ns" in level:
            end = int(level["end_ns"]) if end is None else min(end, int(level["end_ns"]))
        level = level.get("within")
    values: dict[str, str] = {
        k: ",".join(quote(v, safe="") for v in sorted(s)) for k, s in sets.items()
    }
    if len(pinned) > 1:
        raise InvalidArgumentError(
            "a chain of views filters on two versions of the labels: filter on one "
            "(select(..., labels=slice_.labels) at each step)"
        )
    if filters:
        values["filter"] = quote(check_filters(filters[::-1]), safe="")
    if pinned:
        values["labels"] = pinned.pop()
    if start is not None:
        values["start_ns"] = str(start)
    if end is not None:
        values["end_ns"] = str(end)
    if not values:
        return None
    return ";".join(f"{k}:{values[k]}" for k in _KEYS if k in values)


def parse_selection(text: str) -> dict[str, Any]:
    """The parts of a ``select=`` expression, by key (``labels``: the label-set hash a
    ``filter`` read).

    Raises:
        InvalidArgumentError: malformed text (the message says which part).
    """
    if not text or not _SAFE_TEXT.fullmatch(text):
        raise InvalidArgumentError(
            f"dataset URI: select={text!r} is not a selection expression such as "
            "'sites:lab-a;start_ns:1690000000000000000'; copy the whole URI from dataset.uri"
        )
    out: dict[str, Any] = {}
    for item in text.split(";"):
        key, colon, value = item.partition(":")
        if not colon or key not in _KEYS:
            raise InvalidArgumentError(
                f"dataset URI: select= item {item!r}: use KEY:VALUE with KEY one of {', '.join(_KEYS)}"
            )
        if key in out:
            raise InvalidArgumentError(
                f"dataset URI: select= names {key!r} twice: give each key once"
            )
        if key in ("start_ns", "end_ns"):
            if not re.fullmatch(r"-?[0-9]+", value):
                raise InvalidArgumentError(
                    f"dataset URI: select= {key}:{value!r} is not an integer (ns)"
                )
            out[key] = int(value)
        elif key == "filter":
            out[key] = parse_filter(unquote(value)).text
        elif key == "labels":
            if not HASH_RE.fullmatch(value):
                raise InvalidArgumentError(
                    f"dataset URI: select= labels:{value!r} is not a label-set hash (64 hex digits)"
                )
            out[key] = value
        else:
            items = [unquote(v) for v in value.split(",")] if value else []
            if not items:
                raise InvalidArgumentError(f"dataset URI: select= {key}: lists nothing")
            if key == "segments":
                bad = [s for s in items if not SEGMENT_ID_RE.fullmatch(s)]
                if bad:
                    raise InvalidArgumentError(
                        f"dataset URI: malformed segment ID {bad[0]!r}, e.g. seg_0a1b2c3d"
                    )
            out[key] = items
    return out


def select_arguments(text: str) -> dict[str, Any]:
    """``Slice.select`` keyword arguments from a ``select=`` expression: those of
    :func:`parse_selection`, a ``filter`` passed as ``where`` (text)."""
    out = parse_selection(text)
    if "filter" in out:
        out["where"] = out.pop("filter")
    return out
