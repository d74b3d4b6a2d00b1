r"""Byte format of a text stream's blob (``kind: text``): timed records, one JSON line each.

Each line is one record as canonical JSON (sorted keys, no whitespace, UTF-8, no escapes of
non-ASCII), ending in ``\n``, in time order::

    {"camera":null,"content":"pick up the cube","dt_ns":0,"role":"user","style":"task","tool_calls":null}

``dt_ns`` is the record's time in ns **after the stream's first record** (the manifest's
``t0_ns``), so the first record has ``dt_ns`` 0. Relative times make the blob of a task that
holds for a whole episode the same bytes in every episode with that task: a slice of a million
episodes and a hundred tasks stores (and fetches) a hundred text blobs. ``role``, ``style`` and
``camera`` are strings or ``null``; ``tool_calls`` is a list (of JSON values) or ``null``:
LeRobot's language rows carry the same fields.

A blob is untrusted input: :func:`decode_text` refuses anything but exactly this format (bad
UTF-8, a line that is not a record, a missing or extra key, a wrong type, times that go back)
with an :class:`~rayform.errors.IntegrityError`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from rayform.errors import IntegrityError, InvalidArgumentError

__all__ = ["TEXT_FIELDS", "decode_text", "encode_text"]

#: The fields of a record besides its time, with their defaults.
TEXT_FIELDS: dict[str, Any] = {
    "content": "",
    "role": None,
    "style": None,
    "camera": None,
    "tool_calls": None,
}
_KEYS = frozenset({"dt_ns", *TEXT_FIELDS})


def _line(dt_ns: int, record: Mapping[str, Any]) -> bytes:
    out = {"dt_ns": dt_ns}
    for key, default in TEXT_FIELDS.items():
        out[key] = record.get(key, default)
    return json.dumps(out, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def encode_text(t_ns: np.ndarray | Sequence[int], records: Sequence[Mapping[str, Any]]) -> bytes:
    """Serialise timed text records.

    Args:
        t_ns: record times, ns, ``int64 (N,)``, non-decreasing (two events may share a time).
        records: ``N`` mappings with ``content`` (``str``, or ``None`` for a record that is only
            a tool call, as LeRobot's ``say`` rows are) and optionally ``role``, ``style``,
            ``camera`` (``str`` or ``None``) and ``tool_calls`` (a list or ``None``); other keys
            are refused.

    Raises:
        InvalidArgumentError: no records, a length mismatch, times that go back, or a field of
            the wrong type.
    """
    times = np.asarray(t_ns, dtype=np.int64)
    if times.ndim != 1 or times.size == 0 or times.size != len(records):
        raise InvalidArgumentError(
            f"text records: need N >= 1 times and N records, got {times.shape} times and "
            f"{len(records)} records"
        )
    if times.size > 1 and not bool(np.all(np.diff(times) >= 0)):
        raise InvalidArgumentError("text records: times (t_ns) must not decrease")
    lines = []
    for i, (t, record) in enumerate(zip(times.tolist(), records, strict=True)):
        extra = set(record) - set(TEXT_FIELDS)
        if extra:
            raise InvalidArgumentError(
                f"text record {i}: unknown keys {sorted(extra)} (allowed: {list(TEXT_FIELDS)})"
            )
        problem = _problem({"dt_ns": t - int(times[0]), **TEXT_FIELDS, **record})
        if problem:
            raise InvalidArgumentError(f"text record {i}: {problem}")
        lines.append(_line(t - int(times[0]), record) + b"\n")
    return b"".join(lines)


def _problem(d: dict[str, Any]) -> str | None:
    """What is wrong with one parsed record, or ``None``."""
    if set(d) != _KEYS:
        return f"keys must be {sorted(_KEYS)}, got {sorted(d)[:10]}"
    dt = d["dt_ns"]
    if isinstance(dt, bool) or not isinstance(dt, int) or not 0 <= dt < 2**63:
        return f"dt_ns must be an integer >= 0, got {str(dt)[:40]!r}"
    if d["content"] is not None and not isinstance(d["content"], str):
        return f"content must be a string or null, got {type(d['content']).__name__}"
    for key in ("role", "style", "camera"):
        if d[key] is not None and not isinstance(d[key], str):
            return f"{key} must be a string or null, got {type(d[key]).__name__}"
    if d["tool_calls"] is not None and not isinstance(d["tool_calls"], list):
        return f"tool_calls must be a list or null, got {type(d['tool_calls']).__name__}"
    return None


def decode_text(
    data: bytes, t0_ns: int = 0, what: str = "text blob"
) -> tuple[np.ndarray, list[dict[str, Any]]]:
    """Inverse of :func:`encode_text`.

    Args:
        data: the blob's bytes.
        t0_ns: the stream's ``t0_ns`` (its first record's time), ns, added to every ``dt_ns``.
        what: names the blob in errors.

    Returns:
        ``(t_ns int64 (N,), records)``: absolute times (ns) and one dict per record with
        ``content``, ``role``, ``style``, ``camera`` and ``tool_calls``.

    Raises:
        IntegrityError: the bytes are not a text blob.
    """
    if not data.endswith(b"\n"):
        raise IntegrityError(f"{what}: a text blob is JSON lines, each ending in a newline")
    times: list[int] = []
    records: list[dict[str, Any]] = []
    for i, line in enumerate(data[:-1].split(b"\n")):
        try:
            d = json.loads(line.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as exc:
            raise IntegrityError(f"{what}: line {i + 1} is not a JSON record: {exc}") from None
        problem = _problem(d) if isinstance(d, dict) else "not a JSON object"
        if problem is None and times and d["dt_ns"] < times[-1]:
            problem = "dt_ns goes back"
        if problem is None and not times and d["dt_ns"] != 0:
            problem = "the first record's dt_ns must be 0"
        if problem:
            raise IntegrityError(f"{what}: line {i + 1}: {problem}")
        times.append(d.pop("dt_ns"))
        records.append(d)
    t_ns = np.asarray(times, dtype=np.int64) + np.int64(t0_ns)
    return t_ns, records
