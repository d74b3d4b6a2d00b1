"""The pull's progress bar: a notebook widget where Jupyter can draw one, text elsewhere, and
sizes and rates in the binary units of every other line Rayform prints.

tqdm formats sizes with decimal prefixes and the rate without ``unit_divisor`` (``22.0M``,
``MB/s`` for MiB), so the bar formats its own fields with :func:`~rayform.units.human_bytes`.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from typing import Any, TextIO

from rayform.units import human_bytes

__all__ = ["BAR_FORMAT", "bar_size_options", "byte_bar"]

#: The bar's layout: tqdm's default, with sizes and rate in binary units.
BAR_FORMAT = "{desc}: {percentage:3.0f}%|{bar}| {done}/{size} [{elapsed}<{remaining}, {speed}]"


def _base() -> Any:
    # tqdm loads on first use (`import rayform` stays fast). tqdm.auto picks the widget only in
    # a Jupyter kernel; without ipywidgets it would warn and fall back, so ask it only if present.
    if importlib.util.find_spec("ipywidgets") is not None:
        from tqdm.auto import tqdm
    else:
        from tqdm.std import tqdm
    return tqdm


def bar_size_options(stream: TextIO) -> dict[str, Any]:
    """The size options of a tqdm bar on ``stream``: follow the terminal's width, except on a
    terminal that reports no size (a pseudo-terminal nobody sized, as some container and CI
    runners give), where tqdm would draw the bar 0 columns wide and hide it below a screen of no
    rows."""
    try:
        if not stream.isatty():
            return {"dynamic_ncols": True}
        columns, lines = os.get_terminal_size(stream.fileno())
    except (AttributeError, OSError, ValueError):
        return {"dynamic_ncols": True}
    size: dict[str, Any] = {"dynamic_ncols": True} if columns > 0 else {"ncols": 80}
    if lines <= 0:
        size["nrows"] = 24
    return size


def byte_bar(total: int, desc: str) -> Any:
    """A progress bar over ``total`` bytes (``update(n)`` as bytes arrive; ``close()`` at the end).

    Args:
        total: bytes expected.
        desc: the label before the bar, e.g. ``"pull slc_7c1e04aa"``.
    """
    base = _base()

    class ByteBar(base):  # type: ignore[misc, valid-type]
        @property
        def format_dict(self) -> dict[str, Any]:
            d = dict(super().format_dict)
            n, elapsed = d.get("n") or 0, d.get("elapsed") or 0.0
            rate = d.get("rate") or (n / elapsed if elapsed else 0.0)
            d.update(
                done=human_bytes(n),
                size=human_bytes(d.get("total") or 0),
                speed=f"{human_bytes(rate)}/s",
            )
            return d

    return ByteBar(
        total=total,
        unit="B",
        desc=desc,
        file=sys.stderr,
        mininterval=0.2,
        bar_format=BAR_FORMAT,
        **bar_size_options(sys.stderr),
    )
