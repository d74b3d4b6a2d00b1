"""Reused batch memory for a reader whose caller copies each batch out before the next.

Why: outside a DataLoader worker, every batch's camera frames go to new memory, and the kernel
maps and zeroes a large allocation page by page on first write and takes it back when it is
freed: for a block of 96 rows of two 480x640 cameras (177 MB) that is about 0.45 ms per row,
some 15 % of reading it. A Ray read task hands each block to Ray, which copies it into its
object store, before it reads the next: memory written once can be written again.

How: a :class:`BatchMemory` keeps a few buffers. Within ``with memory:`` (one batch),
:func:`~rayform.torch._collate.batch_tensor` hands out consecutive regions of a buffer that
nothing else references. Whether anything does is read from the buffer's reference count, which
every tensor, view, NumPy array and Arrow buffer over it holds up: a buffer whose batch is still
referenced (a fused downstream operator that keeps blocks, a caller that kept a row) is never
written again, and the next batch takes another buffer or new memory. So reuse costs
nothing in correctness; only its speed depends on the caller dropping each batch.
"""

from __future__ import annotations

import threading
from types import TracebackType

import torch

__all__ = ["BatchMemory", "current"]

_ALIGN = 64  # bytes: every region starts on a cache line

_local = threading.local()


def _use_count(buffer: torch.Tensor) -> int | None:
    """References to ``buffer``'s memory (tensors and views over it; the kept buffer itself is
    one), or None where this torch cannot tell (then nothing is reused)."""
    count = getattr(torch._C, "_storage_Use_Count", None)
    if count is None:
        return None
    storage = buffer.untyped_storage()  # a handle: adds one reference while it lives
    return int(count(storage._cdata)) - 1


class BatchMemory:
    """Buffers reused across the batches read inside ``with memory:``, one batch per ``with``.

    Args:
        keep: buffers kept at most (a batch whose buffer is still referenced takes another).
    """

    def __init__(self, keep: int = 2) -> None:
        self.keep = keep
        self.buffers: list[torch.Tensor] = []  # flat uint8
        self.largest = 0  # bytes the biggest batch so far took
        self._buffer: torch.Tensor | None = None
        self._offset = 0
        self._used = 0

    def __enter__(self) -> BatchMemory:
        if getattr(_local, "memory", None) is not None:
            raise RuntimeError("a BatchMemory is already in use in this thread")
        self._buffer = self._free_buffer()
        self._offset = self._used = 0
        _local.memory = self
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        _local.memory = None
        self._buffer = None
        self.largest = max(self.largest, self._used)

    def _free_buffer(self) -> torch.Tensor | None:
        """A kept buffer of at least ``largest`` bytes that nothing references but this
        holder; or a new one while fewer than ``keep`` are kept; or None (new memory)."""
        if self.largest == 0:
            return None  # the first batch measures what one takes
        free = []
        for buffer in self.buffers:
            count = _use_count(buffer)
            if count is None:
                return None
            if count == 1:
                free.append(buffer)
        for buffer in free:
            if buffer.numel() >= self.largest:
                return buffer
        if free:  # too small for this batch: make room for a bigger one
            self.buffers = [b for b in self.buffers if b is not free[0]]
        if len(self.buffers) >= self.keep:
            return None
        buffer = torch.empty(self.largest, dtype=torch.uint8)
        self.buffers.append(buffer)
        return buffer

    def tensor(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """An uninitialised contiguous tensor for this batch: a region of the batch's buffer,
        or new memory where it does not fit."""
        size = dtype.itemsize * _numel(shape)
        nbytes = -(-size // _ALIGN) * _ALIGN
        self._used += nbytes
        buffer = self._buffer
        if buffer is None or self._offset + nbytes > buffer.numel():
            return torch.empty(shape, dtype=dtype)
        out = buffer[self._offset : self._offset + size].view(dtype).view(shape)
        self._offset += nbytes
        return out


def current() -> BatchMemory | None:
    """The :class:`BatchMemory` of the batch being read in this thread, if any."""
    return getattr(_local, "memory", None)


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n
