"""Settings read from the environment, each parsed in one place.

``RAYFORM_OFFLINE``, ``RAYFORM_NO_LOCKS`` and every other on/off variable go through
:func:`env_flag`; the cache directory (``Client`` and the ``rayform cache`` commands alike)
through :func:`default_cache_dir`.
"""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs

from rayform.errors import InvalidArgumentError

__all__ = ["FALSE_VALUES", "TRUE_VALUES", "default_cache_dir", "env_flag"]

#: Values that turn an on/off variable on, compared after stripping spaces and lower-casing.
TRUE_VALUES = ("1", "true", "yes", "on")
#: Values that turn it off, as does leaving it unset. Anything else is an error: read as off,
#: ``RAYFORM_OFFLINE=2`` would silently go online.
FALSE_VALUES = ("", "0", "false", "no", "off")


def env_flag(name: str) -> bool:
    """Whether the on/off environment variable ``name`` is on.

    Raises:
        InvalidArgumentError: its value is in neither :data:`TRUE_VALUES` nor
            :data:`FALSE_VALUES`.
    """
    raw = os.environ.get(name, "")
    value = raw.strip().lower()
    if value in TRUE_VALUES:
        return True
    if value in FALSE_VALUES:
        return False
    raise InvalidArgumentError(
        f"{name}={raw!r} is not an on/off value: set it to 1, true, yes or on to turn it on, "
        f"or 0, false, no, off or empty (or unset it) to turn it off"
    )


def default_cache_dir() -> Path:
    """``RAYFORM_CACHE_DIR`` if set and not empty, else the platform's user cache directory
    (``~/.cache/rayform`` on Linux), not yet expanded or created."""
    return Path(os.environ.get("RAYFORM_CACHE_DIR") or platformdirs.user_cache_dir("rayform"))
