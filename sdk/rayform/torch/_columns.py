"""A batch's sample values, one tensor per sample key.

:class:`~rayform.torch._reader.SampleReader` writes each segment's share of a batch into
these tensors (one numpy assignment per segment and key), and every sample holds a row of
each: building the samples costs one ``unbind`` per key and one dict per sample, not an
indexing call per sample and key. Where the batch is collated as read, the tensors are
regions of the worker's next shared-memory slot (:func:`~rayform.torch._collate.batch_tensor`),
which ``collate`` keeps in place. A key whose shape differs between the batch's segments (a
camera of two sizes, say) gets per-segment values instead.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from rayform.torch._collate import batch_rows, batch_tensor

__all__ = ["BatchColumns"]

_NUMPY = {
    torch.float32: np.float32,
    torch.int64: np.int64,
    torch.bool: np.bool_,
    torch.uint8: np.uint8,
}


class BatchColumns:
    """The values of a batch of ``size`` samples, by sample key, in the samples' key order."""

    def __init__(self, size: int) -> None:
        self.size = size
        #: Key -> the rows of its ``(size, ...)`` tensor (sample ``i`` holds row ``i``).
        self.rows: dict[str, Sequence[torch.Tensor]] = {}
        self._arrays: dict[str, np.ndarray] = {}  # numpy views of the tensors written by put
        self._dtypes: dict[str, torch.dtype] = {}
        self._lists: dict[str, list[Any]] = {}  # per-segment values, sample by sample
        self._keys: list[str] = []
        self._metas: list[dict[str, Any]] = [{}] * size

    def add(
        self,
        key: str,
        shape: tuple[int, ...] | None,
        dtype: torch.dtype,
        shared: bool = False,
        written: bool = True,
    ) -> None:
        """Declare ``key`` (next in the samples' key order) with one sample's ``shape``
        (``None``: per-segment values, of shapes that differ); ``shared``: in the batch's
        shared memory where it will be collated; ``written``: filled through :meth:`put`
        (else by a decoder, through :attr:`rows`)."""
        self._keys.append(key)
        self._dtypes[key] = dtype
        if shape is None:
            self._lists[key] = [None] * self.size
            return
        full = (self.size, *shape)
        tensor = batch_tensor(full, dtype) if shared else torch.empty(full, dtype=dtype)
        self.rows[key] = batch_rows(tensor)
        if written:
            self._arrays[key] = tensor.numpy()

    def add_rows(self, key: str, rows: Sequence[torch.Tensor]) -> None:
        """Declare ``key`` (next in order) as the caller's ``rows``, one per sample, which a
        decoder fills (a mixture's batch tensor, say)."""
        self._keys.append(key)
        self.rows[key] = rows

    def put(self, key: str, where: np.ndarray, values: np.ndarray) -> None:
        """Samples ``where`` of ``key`` are ``values`` (``(len(where), ...)``, cast to the
        key's dtype as ``astype`` casts)."""
        array = self._arrays.get(key)
        if array is not None:
            array[where] = values
            return
        tensor = torch.from_numpy(np.ascontiguousarray(values, dtype=_NUMPY[self._dtypes[key]]))
        self.scatter(key, where.tolist(), tensor.unbind(0))

    def scatter(self, key: str, where: list[int], values: Sequence[Any]) -> None:
        """Samples ``where`` of the per-segment ``key`` are ``values``."""
        column = self._lists[key]
        for i, value in zip(where, values, strict=True):
            column[i] = value

    def meta(self, where: list[int], meta: dict[str, Any]) -> None:
        """Samples ``where`` have ``meta`` (each gets its own copy)."""
        for i in where:
            self._metas[i] = meta

    def samples(self) -> list[dict[str, Any]]:
        """One dict per sample: its row of every key, then ``meta``."""
        keys = self._keys
        columns = [self.rows[k] if k in self.rows else self._lists[k] for k in keys]
        out = []
        for values, meta in zip(zip(*columns, strict=True), self._metas, strict=True):
            sample = dict(zip(keys, values, strict=True))
            sample["meta"] = dict(meta)
            out.append(sample)
        return out
