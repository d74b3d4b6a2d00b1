"""Helpers shared by the ingesters: stream specs, names, segment IDs, progress, rates."""

from __future__ import annotations

import re
import sys
from collections.abc import Iterable
from typing import TextIO

import numpy as np

from rayform._hashing import hash_bytes
from rayform._ids import STREAM_NAME_RE
from rayform.errors import InvalidArgumentError

__all__ = [
    "Progress",
    "nominal_rate_hz",
    "parse_stream_specs",
    "sanitize_stream_name",
    "segment_id_for",
]


def parse_stream_specs(specs: Iterable[str] | None, what: str) -> dict[str, str]:
    """Parse ``--stream NAME=SOURCE`` options into ``{name: source}`` (in the order given).

    Args:
        specs: the raw option values, e.g. ``["cam0/rgb=observation.images.top"]``.
        what: what SOURCE is, for error messages (``"FEATURE"`` or ``"TOPIC[:FIELD]"``).

    Raises:
        InvalidArgumentError: a spec has no ``=``, a bad stream name, or a name given twice.
    """
    out: dict[str, str] = {}
    for spec in specs or ():
        name, sep, source = spec.partition("=")
        name, source = name.strip(), source.strip()
        if not sep or not name or not source:
            raise InvalidArgumentError(
                f"--stream {spec!r}: expected NAME={what}, e.g. --stream cam0/rgb=..."
            )
        if not STREAM_NAME_RE.match(name) or ".." in name:
            raise InvalidArgumentError(
                f"--stream {spec!r}: {name!r} is not a valid stream name; use lowercase words "
                "separated by '/', e.g. 'cam0/rgb' or 'joints/position'."
            )
        if name in out:
            raise InvalidArgumentError(f"--stream: stream name {name!r} is given twice")
        out[name] = source
    return out


def sanitize_stream_name(parts: Iterable[str]) -> str:
    """Join words into a valid stream name: lowercase, other characters become ``_``.

    At most 5 ``/``-separated components are kept (the last five).
    """
    words = []
    for part in parts:
        word = re.sub(r"[^a-z0-9_.-]", "_", part.lower()).strip(".")
        word = word.replace("..", "_")
        if word:
            words.append(word if word[0] not in "-." else "_" + word)
    return "/".join(words[-5:]) or "stream"


def segment_id_for(*key: str) -> str:
    """A deterministic segment ID: ``seg_`` + the first 16 hex of BLAKE3 of the key parts."""
    return "seg_" + hash_bytes("\0".join(key).encode())[:16]


def nominal_rate_hz(t_ns: np.ndarray, fallback_hz: float = 30.0) -> float:
    """Nominal rate in Hz from timestamps (ns): 1e9 / median interval, rounded to 0.001 Hz."""
    if t_ns.size < 2:
        return float(fallback_hz)
    dt = float(np.median(np.diff(t_ns)))
    return round(1e9 / dt, 3) if dt > 0 else float(fallback_hz)


class Progress:
    """Line-oriented progress output (one line per step), quiet when ``stream`` is None."""

    def __init__(self, stream: TextIO | None = sys.stderr, prefix: str = "ingest") -> None:
        self.stream = stream
        self.prefix = prefix

    def __call__(self, message: str) -> None:
        if self.stream is not None:
            print(f"[{self.prefix}] {message}", file=self.stream, flush=True)
