"""pyarrow, imported on first use, and the conversions between its arrays and numpy that the
manifest package needs.

``import rayform`` does not import pyarrow (its import is a noticeable share of a fresh
process's start): a process that opens no manifest never needs it, and code that opens one calls
:func:`load` first. The conversions read Arrow buffers directly, because pyarrow's own
``to_numpy`` and ``pa.array(ndarray)`` may import pandas, a much longer import still.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["arrow_ints", "arrow_strings", "bits", "ints_or", "load", "to_numpy"]


def load() -> Any:
    """The ``pyarrow`` module, with ``pyarrow.compute`` and ``pyarrow.ipc`` imported."""
    import pyarrow
    import pyarrow.compute
    import pyarrow.ipc  # noqa: F401

    return pyarrow


_FLOATS = {"halffloat": "float16", "float": "float32", "double": "float64"}


def arrow_ints(values: np.ndarray) -> Any:
    """An Arrow ``int64`` array over a numpy array's buffer (``pa.array(ndarray)`` would
    import pandas to check for a Series: ~1 s in a fresh process)."""
    data = np.ascontiguousarray(values, dtype=np.int64)
    pa = load()
    return pa.Array.from_buffers(pa.int64(), len(data), [None, pa.py_buffer(data)])


def arrow_strings(values: Sequence[str]) -> Any:
    """An Arrow ``string`` array of ``values``, built from buffers (see :func:`arrow_ints`)."""
    encoded = [v.encode() for v in values]
    offsets = np.zeros(len(encoded) + 1, dtype=np.int32)
    np.cumsum([len(b) for b in encoded], out=offsets[1:])
    pa = load()
    return pa.Array.from_buffers(
        pa.string(), len(encoded), [None, pa.py_buffer(offsets), pa.py_buffer(b"".join(encoded))]
    )


def to_numpy(arr: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """A numpy view of a fixed-width Arrow array (chunks concatenated; other types converted).

    Reads the data buffer directly: pyarrow's own ``to_numpy`` may import pandas (~1 s).
    """
    pa = load()
    if isinstance(arr, pa.ChunkedArray):
        parts = [to_numpy(c) for c in arr.chunks]
        return np.concatenate(parts) if len(parts) != 1 else parts[0]
    t = arr.type
    if arr.null_count == 0 and (pa.types.is_integer(t) or pa.types.is_floating(t)):
        dtype = np.dtype(_FLOATS.get(str(t), str(t)))  # (t.to_pandas_dtype imports pandas)
        return np.frombuffer(
            arr.buffers()[1], dtype=dtype, count=len(arr), offset=arr.offset * dtype.itemsize
        )
    if arr.null_count == 0 and pa.types.is_boolean(t):
        return bits(arr.buffers()[1], arr.offset, len(arr))
    return np.asarray(arr.to_numpy(zero_copy_only=False))


def bits(buf: pa.Buffer, offset: int, n: int) -> np.ndarray:
    """``bool (n,)`` from an Arrow bitmap (least significant bit first)."""
    raw = np.unpackbits(np.frombuffer(buf, dtype=np.uint8), bitorder="little")
    return raw[offset : offset + n].astype(bool)


def ints_or(arr: pa.Array, missing: int) -> np.ndarray:
    """An Arrow integer array as ``int64`` numpy, ``missing`` where null."""
    values = np.frombuffer(
        arr.buffers()[1],
        dtype=np.dtype(str(arr.type)),
        count=len(arr),
        offset=arr.offset * arr.type.bit_width // 8,
    ).astype(np.int64)
    if arr.null_count:
        values[~bits(arr.buffers()[0], arr.offset, len(arr))] = missing
    return values
