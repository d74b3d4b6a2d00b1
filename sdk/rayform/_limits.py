"""Reading the client's limits from arguments or the environment, checked up front.

* ``stall_timeout`` / ``RAYFORM_STALL_TIMEOUT``: seconds a network operation may go without
  progress before it fails (default 120).
* ``RAYFORM_MIN_RATE``: bytes per second a download must average over one stall bound for
  its bytes to count as progress, e.g. ``"1KiB"`` or ``"10kB/s"`` (default 1 KiB/s; ``0``: any
  byte counts, as before the rule; see :mod:`rayform._net._pace`).
* ``cache_limit`` / ``RAYFORM_CACHE_LIMIT``: bytes the cache's blobs may take, e.g. ``"10GB"``,
  ``"500MiB"`` or an ``int`` (default: no limit).
"""

from __future__ import annotations

import math
import os
import re

from rayform.errors import InvalidArgumentError

__all__ = [
    "DEFAULT_MIN_RATE",
    "DEFAULT_STALL_TIMEOUT_S",
    "parse_bytes",
    "resolve_cache_limit",
    "resolve_min_rate",
    "resolve_stall_timeout",
]

#: Default bound, in seconds, on a network operation that makes no progress.
DEFAULT_STALL_TIMEOUT_S = 120.0
#: Default minimum rate of a download, in bytes per second: below one TCP segment (~1.4 kB)
#: per second, the least a live connection sends on any path with a round trip under a second
#: (docs/reliability.md, "The minimum rate").
DEFAULT_MIN_RATE = 1024

_UNITS = {
    "": 1,
    "b": 1,
    "k": 10**3,
    "kb": 10**3,
    "m": 10**6,
    "mb": 10**6,
    "g": 10**9,
    "gb": 10**9,
    "t": 10**12,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}


def parse_bytes(text: str, what: str = "size") -> int:
    """``"10GB"`` -> ``10_000_000_000``; ``"1.5GiB"``, ``"500M"`` and ``"123"`` work too.

    Raises:
        InvalidArgumentError: not a number with an optional unit.
    """
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]*)?)\s*([a-zA-Z]*)\s*", text)
    if not m or m.group(2).lower() not in _UNITS:
        raise InvalidArgumentError(
            f"cannot read {what} {text!r}: use a number of bytes with an optional unit, "
            "e.g. 10GB, 500MiB"
        )
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def resolve_stall_timeout(value: float | None) -> float:
    """The stall timeout in seconds: ``value``, else ``RAYFORM_STALL_TIMEOUT``, else 120."""
    source = "stall_timeout"
    if value is None:
        env = os.environ.get("RAYFORM_STALL_TIMEOUT", "").strip()
        if not env:
            return DEFAULT_STALL_TIMEOUT_S
        source = "RAYFORM_STALL_TIMEOUT"
        try:
            value = float(env)
        except ValueError:
            value = math.nan
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not value > 0
        or math.isinf(value)
    ):
        raise InvalidArgumentError(
            f"{source}={value!r}: use a positive number of seconds, e.g. 120 (the time a "
            "network operation may go without progress before it fails)"
        )
    return float(value)


def resolve_min_rate() -> int:
    """The minimum download rate in bytes per second: ``RAYFORM_MIN_RATE``, else 1 KiB/s.

    Raises:
        InvalidArgumentError: not a size (an optional ``/s`` may follow the unit).
    """
    env = os.environ.get("RAYFORM_MIN_RATE", "").strip()
    if not env:
        return DEFAULT_MIN_RATE
    text = env[:-2] if env.lower().endswith("/s") else env
    try:
        return parse_bytes(text, "RAYFORM_MIN_RATE")
    except InvalidArgumentError:
        raise InvalidArgumentError(
            f"RAYFORM_MIN_RATE={env!r}: use bytes per second with an optional unit, e.g. "
            "1KiB or 10kB/s (the least a download must average over one stall bound; "
            "0 turns the rule off)"
        ) from None


def resolve_cache_limit(value: int | str | None) -> int | None:
    """The cache limit in bytes: ``value``, else ``RAYFORM_CACHE_LIMIT``, else ``None``."""
    source = "cache_limit"
    if value is None:
        env = os.environ.get("RAYFORM_CACHE_LIMIT", "").strip()
        if not env:
            return None
        source, value = "RAYFORM_CACHE_LIMIT", env
    if isinstance(value, str):
        return _positive(source, parse_bytes(value, source))
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgumentError(
            f"{source}={value!r}: use a number of bytes (int) or a size such as '10GB'"
        )
    return _positive(source, value)


def _positive(source: str, n: int) -> int:
    if n <= 0:
        raise InvalidArgumentError(
            f"{source}={n}: the cache limit must be more than 0 bytes, "
            "e.g. '50GB'; leave it unset for no limit"
        )
    return n
