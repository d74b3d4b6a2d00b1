"""Settings read from the environment, each parsed in one place.

``RAYFORM_OFFLINE``, ``RAYFORM_NO_LOCKS`` and every other on/off variable go through
:func:`env_flag`; the cache directory (``Client`` and the ``rayform cache`` commands alike)
through :func:`default_cache_dir`.
"""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs

__all__ = ["TRUE_VALUES", "default_cache_dir", "env_flag"]

#: Values that turn an on/off variable on, compared after stripping spaces and lower-casing.
#: Every other value (unset, empty, ``0``, ``false``, ``no``, ``off``) is off.
TRUE_VALUES = ("1", "true", "yes", "on")


def env_flag(name: str) -> bool:
    """Whether the on/off environment variable ``name`` is on (see :data:`TRUE_VALUES`)."""
    return os.environ.get(name, "").strip().lower() in TRUE_VALUES


def default_cache_dir() -> Path:
    """``RAYFORM_CACHE_DIR`` if set and not empty, else the platform's user cache directory
    (``~/.cache/rayform`` on Linux), not yet expanded or created."""
    return Path(os.environ.get("RAYFORM_CACHE_DIR") or platformdirs.user_cache_dir("rayform"))
