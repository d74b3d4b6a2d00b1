"""Formatting quantities for people, public so that every tool prints them one way.

Sizes are in binary units everywhere (``KiB``, ``MiB``, ``GiB``: powers of 1024): the SDK's
reprs, the pull's progress bar and summary, the ``rayform`` CLI and the server stub's output.
"""

from __future__ import annotations

from rayform._units import human_bytes

__all__ = ["human_bytes"]
