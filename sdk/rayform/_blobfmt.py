"""Byte formats of the non-video blobs.

* **Timestamps blob** (per video stream): one ``.npy`` array, ``int64``, shape ``(N,)``, the
  presentation time of every encoded frame in ns, strictly increasing. Frame ``i`` of the
  video is the ``i``-th decoded frame.
* **Table blob** (time-series stream): two ``.npy`` arrays back to back: ``t_ns`` (``int64``,
  ``(N,)``, strictly increasing) then ``values`` (``(N, D)``, the stream's dtype).

``.npy`` is used because it is versioned, self-describing and written byte-for-byte
deterministically, so the same input always gives the same content hash (``.npz`` embeds zip
timestamps and would not).
"""

from __future__ import annotations

import io

import numpy as np

from rayform.errors import IntegrityError

__all__ = ["decode_table", "decode_timestamps", "encode_table", "encode_timestamps"]


def _check_times(t_ns: np.ndarray, what: str) -> None:
    if t_ns.ndim != 1 or t_ns.dtype != np.int64:
        raise IntegrityError(
            f"{what}: timestamps must be int64 of shape (N,), got {t_ns.dtype} {t_ns.shape}"
        )
    if t_ns.size > 1 and not bool(np.all(np.diff(t_ns) > 0)):
        raise IntegrityError(f"{what}: timestamps are not strictly increasing")


def encode_timestamps(t_ns: np.ndarray) -> bytes:
    """Serialise per-frame timestamps (ns, ``int64 (N,)``) as one ``.npy``."""
    t_ns = np.ascontiguousarray(t_ns, dtype=np.int64)
    _check_times(t_ns, "timestamps")
    buf = io.BytesIO()
    np.save(buf, t_ns, allow_pickle=False)
    return buf.getvalue()


def decode_timestamps(data: bytes, what: str = "timestamps blob") -> np.ndarray:
    """Inverse of :func:`encode_timestamps`; raises :class:`IntegrityError` on bad bytes."""
    try:
        t_ns: np.ndarray = np.load(io.BytesIO(data), allow_pickle=False)
    except Exception as exc:
        raise IntegrityError(f"{what} is not a valid .npy array: {exc}") from exc
    _check_times(t_ns, what)
    return t_ns


def encode_table(t_ns: np.ndarray, values: np.ndarray) -> bytes:
    """Serialise a time series: ``t_ns int64 (N,)`` and ``values (N, D)``."""
    t_ns = np.ascontiguousarray(t_ns, dtype=np.int64)
    values = np.ascontiguousarray(values)
    _check_times(t_ns, "table")
    if values.ndim != 2 or values.shape[0] != t_ns.shape[0]:
        raise IntegrityError(
            f"table values must be (N, D) with N={t_ns.shape[0]}, got {values.shape}"
        )
    buf = io.BytesIO()
    np.save(buf, t_ns, allow_pickle=False)
    np.save(buf, values, allow_pickle=False)
    return buf.getvalue()


def decode_table(data: bytes, what: str = "table blob") -> tuple[np.ndarray, np.ndarray]:
    """Inverse of :func:`encode_table`: returns ``(t_ns (N,) int64, values (N, D))``."""
    try:
        f = io.BytesIO(data)
        t_ns = np.load(f, allow_pickle=False)
        values = np.load(f, allow_pickle=False)
    except Exception as exc:
        raise IntegrityError(f"{what} is not a valid table (two .npy arrays): {exc}") from exc
    _check_times(t_ns, what)
    if values.ndim != 2 or values.shape[0] != t_ns.shape[0]:
        raise IntegrityError(
            f"{what}: values shape {values.shape} does not match {t_ns.shape[0]} timestamps"
        )
    return t_ns, values
