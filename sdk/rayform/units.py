"""Formatting quantities for people, public so that every tool prints them one way.

Sizes are in binary units everywhere (``KiB``, ``MiB``, ``GiB``: powers of 1024): the SDK's
reprs, the pull's progress bar and summary, the ``rayform`` CLI and the server stub's output.
"""

from __future__ import annotations

__all__ = ["human_bytes"]


def human_bytes(n: float) -> str:
    """``1536`` -> ``"1.5 KiB"`` (binary units)."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"
