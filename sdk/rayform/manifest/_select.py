"""``Slice.select``: which manifest positions a selection keeps, computed on columns.

Every test is a vectorised operation on the segment columns (no Python object per segment).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from rayform.errors import InvalidArgumentError
from rayform.manifest._arrow import arrow_strings
from rayform.manifest._arrow import load as pyarrow
from rayform.manifest._columnar import not_found
from rayform.manifest._segments import Segments

__all__ = ["select_rows"]


class _LazyColumns(dict):  # type: ignore[type-arg]
    """Segment columns for a ``where`` predicate; ``id``/``site`` built only if read."""

    def __init__(
        self, base: dict[str, np.ndarray], strings: dict[str, Callable[[], np.ndarray]]
    ) -> None:
        super().__init__(base)
        self._strings = strings

    def __missing__(self, key: str) -> np.ndarray:
        if key not in self._strings:
            raise KeyError(
                f"where= asked for column {key!r}; the segment columns are "
                f"{', '.join(sorted([*self.keys(), *self._strings]))}"
            )
        value = self[key] = self._strings[key]()
        return value


def _columns(
    segs: Segments,
) -> tuple[np.ndarray, dict[str, np.ndarray], dict[str, Callable[[], np.ndarray]]]:
    """``(manifest positions, numeric columns, string column makers)`` of some segments."""
    num = {k: segs.column(k) for k in ("version", "start_ns", "end_ns")}
    num["duration_ns"] = num["end_ns"] - num["start_ns"]
    strings = {
        "id": lambda: np.array(segs.ids().to_pylist(), dtype=object),
        "site": lambda: np.array(segs.sites().to_pylist(), dtype=object),
    }
    return segs.positions(), num, strings


def _int_or_none(name: str, value: int | None) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise InvalidArgumentError(
            f"{name}={value!r}: use an integer time in ns (Unix epoch) or None"
        )
    return int(value)


def _names(name: str, value: Sequence[str] | None) -> list[str] | None:
    if value is None:
        return None
    if isinstance(value, str) or not all(isinstance(v, str) for v in value):
        raise InvalidArgumentError(f"{name}={value!r}: pass a list of strings, e.g. [{value!r}]")
    return list(value)


def select_rows(
    segs: Segments,
    slice_id: str,
    *,
    segments: Sequence[str] | None,
    sites: Sequence[str] | None,
    start_ns: int | None,
    end_ns: int | None,
    where: Callable[[dict[str, np.ndarray]], np.ndarray] | None,
    filtered: tuple[dict[str, Any], np.ndarray] | None = None,
) -> tuple[np.ndarray, dict[str, Any]]:
    """Manifest positions ``(K,) int64`` kept by a selection, and the selection as JSON-able
    arguments (``where`` is recorded by its name, which a tracker can only display).

    ``filtered`` is a filter already evaluated on ``segs`` (``rayform.curation``): what to
    record of it (its text and the labels it read) and its ``(S,)`` bool mask."""
    seg_ids, site_list = _names("segments", segments), _names("sites", sites)
    t0, t1 = _int_or_none("start_ns", start_ns), _int_or_none("end_ns", end_ns)
    if where is not None and not callable(where):
        raise InvalidArgumentError(
            f"where={where!r}: pass a callable taking the column dict, or None"
        )
    pos, num, strings = _columns(segs)
    keep = np.ones(len(pos), dtype=bool)
    selection: dict[str, Any] = {}
    if seg_ids is not None:
        found = segs.find(seg_ids)
        if (found < 0).any():
            raise not_found(slice_id, seg_ids[int(np.flatnonzero(found < 0)[0])])
        mask = np.zeros(len(pos), dtype=bool)
        mask[found] = True
        keep &= mask
        selection["segments"] = list(seg_ids)
    if site_list is not None:
        mask = pyarrow().compute.is_in(segs.sites(), value_set=arrow_strings(site_list))
        keep &= np.array(mask.to_pylist(), dtype=bool)
        selection["sites"] = list(site_list)
    if t0 is not None:
        keep &= num["end_ns"] >= t0
        selection["start_ns"] = t0
    if t1 is not None:
        keep &= num["start_ns"] < t1
        selection["end_ns"] = t1
    if where is not None:
        mask = np.asarray(where(_LazyColumns(num, strings)))
        if mask.shape != keep.shape or mask.dtype != bool:
            raise InvalidArgumentError(
                f"where= returned {mask.dtype} {mask.shape}: it must return a bool mask of shape "
                f"({len(keep)},), one entry per segment"
            )
        keep &= mask
        selection["where"] = getattr(where, "__qualname__", repr(where))
    if filtered is not None:
        record, mask = filtered
        keep &= mask
        selection.update(record)
    if not keep.any():
        raise InvalidArgumentError(
            f"the selection {selection} keeps no segment of slice {slice_id}: widen it"
        )
    return pos[keep], selection
