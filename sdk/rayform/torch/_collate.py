"""``collate``: ``default_collate`` that reuses each worker's shared memory across batches.

Why: a DataLoader worker collates every batch into a *new* shared-memory file, which the kernel
allocates, zeroes and frees page by page: for camera batches (32 x two 480x640 frames = 59 MB)
a large share of the loader's CPU is system time spent on it (docs/benchmarks.md measures it).

How: each worker process keeps a few shared-memory *slots*. A batch is collated into a free
slot (every tensor of the batch, in one block), and travels to the main process like any
shared tensor (a file descriptor, no copy). On arrival each tensor is re-wrapped so that the
slot's lifetime follows the user's references: only when the last tensor *or view* of the
batch is freed does the main process mark the slot free, and only then does the worker write
into it again. A worker with no free slot falls back to ``default_collate``'s fresh memory,
so holding on to batches costs speed, never correctness.

In the main process (``num_workers=0``) this is exactly ``default_collate``.

Batches read in one pass: once ``collate`` has run in a worker, :func:`batch_tensor` hands the
reader a region of the next batch's slot, and the reader writes a camera's resized frames for
the whole batch straight into it (each sample holds a row). ``collate`` recognises those rows
and keeps them where they are, placing only the rest of the batch after them: the frames are
not copied again. Anything else (rows out of order, a transform that replaced them, a batch
too large for the slot) is collated by copying, as before: the same values either way.
"""

from __future__ import annotations

import collections.abc
import copy
import threading
import weakref
from collections.abc import Callable
from typing import Any, cast

import numpy as np
import torch
from torch.utils.data import default_collate, get_worker_info
from torch.utils.data._utils.collate import collate as _collate_with
from torch.utils.data._utils.collate import default_collate_fn_map

from rayform._process import PerProcess

__all__ = ["collate", "MAX_SLOTS", "batch_rows", "batch_tensor", "forget_slots", "slots_in_use"]

#: Slots per worker process. A worker has at most ``prefetch_factor`` (default 2) batches in
#: flight, the training step holds one and the worker writes one: four cover the default.
MAX_SLOTS = 4

_ALIGN = 64  # bytes: every tensor starts on a cache line
_HEADER = _ALIGN  # the slot's first cache line holds its in-use flag (int64 at byte 0)


def _aligned(nbytes: int) -> int:
    return -(-nbytes // _ALIGN) * _ALIGN


def _view(
    storage: torch.UntypedStorage, offset: int, dtype: torch.dtype, shape: tuple[int, ...]
) -> torch.Tensor:
    """A contiguous ``dtype`` tensor of ``shape`` at byte ``offset`` of ``storage``."""
    # set_ takes an UntypedStorage at run time; torch's stubs list typed storages only.
    view: torch.Tensor = torch.empty(0, dtype=dtype).set_(  # type: ignore[call-overload]
        storage, offset // dtype.itemsize, shape
    )
    return view


class _Slot:
    """One shared-memory block; ``flag[0]`` is 1 while a batch in it may still be referenced."""

    def __init__(self, nbytes: int) -> None:
        self.storage = torch.empty(nbytes, dtype=torch.uint8).share_memory_().untyped_storage()
        self.nbytes = nbytes
        self.flag = _view(self.storage, 0, torch.int64, (1,))
        self.flag[0] = 0

    def is_free(self) -> bool:
        return int(self.flag[0]) == 0


class _Prefill:
    """A slot the reader is writing the next batch's frames into: ``regions`` maps the byte
    offset of each tensor handed out to its byte size; ``offset`` is the next free byte."""

    def __init__(self, slot: _Slot) -> None:
        self.slot = slot
        self.offset = _HEADER
        self.regions: dict[int, int] = {}
        self.rows: dict[int, tuple[torch.Tensor, ...]] = {}  # by offset: the rows handed out


class _Pool:
    """A worker's slots; ``collates``: ``collate`` ran in this process (so the next batch will
    reach it); ``largest``: the most bytes a batch took; ``prefill``: the slot the next batch's
    frames are being written into."""

    def __init__(self) -> None:
        self.slots: list[_Slot] = []
        self.collates = False
        self.largest = 0
        self.prefill: _Prefill | None = None
        self.prefill_off = False

    def acquire(self, nbytes: int) -> _Slot | None:
        free = [s for s in self.slots if s.is_free()]
        slot = next((s for s in free if s.nbytes >= nbytes), None)
        if slot is None and free and len(self.slots) >= MAX_SLOTS:
            self.slots.remove(free[0])  # too small for this batch: replace it
        if slot is None and len(self.slots) < MAX_SLOTS:
            slot = _Slot(nbytes)
            self.slots.append(slot)
        if slot is not None:
            slot.flag[0] = 1
        return slot


#: This process's slots: a worker never writes into slots its parent made.
_POOL: PerProcess[_Pool] = PerProcess(_Pool)


def slots_in_use() -> list[bool]:
    """For each of this process's slots, oldest first: whether a batch in it may still be
    referenced (``[]`` in a process that has collated nothing into shared memory)."""
    pool = _POOL.peek()
    return [not s.is_free() for s in pool.slots] if pool is not None else []


def forget_slots() -> None:
    """Drop this process's slots (as in a new worker); a slot still referenced by a batch
    stays mapped until that batch is freed."""
    _POOL.clear()


def batch_tensor(shape: tuple[int, ...], dtype: torch.dtype = torch.uint8) -> torch.Tensor:
    """An uninitialised tensor for one batch-wide value the reader fills (a camera's frames,
    one row per sample): in a DataLoader worker where :func:`collate` has run, a region of the
    shared-memory slot the next batch will be collated into, which ``collate`` then keeps in
    place when the batch's samples hold its rows in order; elsewhere new memory."""
    if get_worker_info() is None:
        return torch.empty(shape, dtype=dtype)
    pool = _POOL.get()
    if not pool.collates:  # another collate_fn, none yet, or rows not collated as written
        return torch.empty(shape, dtype=dtype)
    nbytes = _aligned(int(np.prod(shape)) * dtype.itemsize)
    pre = pool.prefill
    if pre is None:
        slot = pool.acquire(max(pool.largest, _HEADER + nbytes))
        if slot is None:
            return torch.empty(shape, dtype=dtype)
        pre = pool.prefill = _Prefill(slot)
    if pre.offset + nbytes > pre.slot.nbytes:
        return torch.empty(shape, dtype=dtype)
    out = _view(pre.slot.storage, pre.offset, dtype, shape)
    pre.regions[pre.offset] = nbytes
    pre.offset += nbytes
    return out


def batch_rows(tensor: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """``tensor.unbind(0)``; for a tensor from :func:`batch_tensor` in the worker's slot,
    ``collate`` then knows a batch holding exactly these row objects, in order, by identity
    (no per-row check of where each row lies)."""
    rows = tensor.unbind(0)
    pool = _POOL.peek()
    pre = pool.prefill if pool is not None else None
    if pre is not None and tensor.untyped_storage().data_ptr() == pre.slot.storage.data_ptr():
        offset = tensor.data_ptr() - pre.slot.storage.data_ptr()
        if offset in pre.regions:
            pre.rows[offset] = rows
    return rows


class _Bump:
    """Hands out consecutive aligned regions of a slot to ``collate``'s tensor function; with
    ``prefill``, a batch whose tensors are the rows of one of its regions, in order, is that
    region (``kept`` counts them), and the rest goes after the regions."""

    def __init__(self, slot: _Slot | None, prefill: _Prefill | None = None) -> None:
        self.slot = slot
        self.prefill = prefill
        self.offset = _HEADER if prefill is None else prefill.offset
        self.tensors = 0
        self.kept: set[int] = set()

    def _region(self, batch: list[torch.Tensor]) -> int | None:
        """The byte offset of the prefill region ``batch`` is the rows of, if it is."""
        pre = self.prefill
        elem = batch[0]
        if pre is None or elem.device.type != "cpu" or not elem.is_contiguous():
            return None
        base: int = pre.slot.storage.data_ptr()
        if elem.untyped_storage().data_ptr() != base:
            return None
        offset = elem.data_ptr() - base
        row = elem.element_size() * elem.numel()
        if pre.regions.get(offset) != _aligned(row * len(batch)):
            return None
        handed = pre.rows.get(offset)
        if (
            handed is not None
            and len(handed) == len(batch)
            and all(x is y for x, y in zip(batch, handed, strict=True))
        ):
            return offset  # the very rows batch_rows handed out, in order
        for i, x in enumerate(batch):
            if (
                x.data_ptr() != base + offset + i * row
                or x.dtype != elem.dtype
                or x.shape != elem.shape
                or not x.is_contiguous()
                or x.untyped_storage().data_ptr() != base
            ):
                return None
        return offset

    def tensor_fn(
        self, batch: list[torch.Tensor], *, collate_fn_map: object = None
    ) -> torch.Tensor | None:
        elem = batch[0]
        shape = (len(batch), *elem.shape)
        nbytes = elem.element_size() * len(batch) * elem.numel()
        region = self._region(batch)
        if region is not None and region not in self.kept:
            self.kept.add(region)
            if self.slot is None:
                return None
            self.tensors += 1
            return _view(self.slot.storage, region, elem.dtype, shape)
        if self.slot is None:  # sizing pass
            self.offset += _aligned(nbytes)
            return None
        if (
            elem.device.type != "cpu"
            or elem.is_nested
            or elem.layout != torch.strided
            or self.offset + nbytes > self.slot.nbytes
            or any(x.shape != elem.shape for x in batch)
        ):
            stacked: torch.Tensor = default_collate_fn_map[torch.Tensor](
                batch, collate_fn_map=collate_fn_map
            )
            return stacked
        out = _view(self.slot.storage, self.offset, elem.dtype, shape)
        self.offset += _aligned(nbytes)
        self.tensors += 1
        return torch.stack(batch, 0, out=out)

    def fn_map(self) -> dict[type | tuple[type, ...], Callable[..., object]]:
        """``default_collate_fn_map`` with tensors collated into the slot by :meth:`tensor_fn`."""
        return {
            torch.Tensor: self.tensor_fn,
            **{k: v for k, v in default_collate_fn_map.items() if k is not torch.Tensor},
        }


def collate(batch: list[Any]) -> Any:
    """``default_collate`` with shared-memory reuse in DataLoader workers.

    Use it as ``DataLoader(dataset, ..., num_workers=N, collate_fn=rayform.torch.collate)``.
    The batches are the same values, types and structure as ``default_collate``'s (dicts,
    tuples, named tuples, lists, numbers and strings batched alike); the tensors are ordinary
    CPU tensors. Each worker keeps up to :data:`MAX_SLOTS` blocks of shared memory the size of
    one batch, for as long as the worker lives.

    Safe to hold on to: a slot is reused only after every tensor of its batch, and every view
    of one, has been freed in the main process. A batch sent on to another process is copied
    there (as for any non-shared tensor).

    In a worker it returns a carrier that becomes the batch when the DataLoader hands it to the
    main process, so pass it as ``collate_fn`` itself; a wrapper that edits batches inside the
    worker should build on ``default_collate`` instead.
    """
    if get_worker_info() is None:
        return default_collate(batch)
    pool = _POOL.get()
    pool.collates = not pool.prefill_off
    prefill, pool.prefill = pool.prefill, None
    sizing = _Bump(None, prefill)
    _collate_with(batch, collate_fn_map=sizing.fn_map())
    if prefill is not None:
        kept = sum(prefill.regions[r] for r in sizing.kept)
        pool.largest = max(pool.largest, sizing.offset - prefill.offset + _HEADER + kept)
        if sizing.kept == set(prefill.regions) and sizing.offset <= prefill.slot.nbytes:
            return _ship(batch, _Bump(prefill.slot, prefill), prefill.slot)
        if sizing.kept == set(prefill.regions):
            # Every region is this batch's, copied below: the slot is free once it is.
            try:
                return _collate_fresh(batch, pool, sizing)
            finally:
                prefill.slot.flag[0] = 0
        # Rows this batch does not hold as they were written: someone else may, so the slot
        # stays marked in use (it is never written again), and this process's batches are
        # read as before from now on (this caller reorders or picks from what it reads).
        pool.collates = False
        pool.prefill_off = True
        return _collate_fresh(batch, pool, sizing)
    pool.largest = max(pool.largest, sizing.offset)
    return _collate_fresh(batch, pool, sizing)


def _collate_fresh(batch: list[Any], pool: _Pool, sizing: _Bump) -> Any:
    """``batch`` collated into a free slot (``default_collate`` when there is none)."""
    if sizing.prefill is not None:  # size the whole batch again, copying every tensor
        sizing = _Bump(None)
        _collate_with(batch, collate_fn_map=sizing.fn_map())
    if sizing.offset == _HEADER:  # no tensors to place
        return default_collate(batch)
    slot = pool.acquire(sizing.offset)
    if slot is None:  # every slot still referenced: fresh memory, as default_collate does
        return default_collate(batch)
    return _ship(batch, _Bump(slot), slot)


def _ship(batch: list[Any], bump: _Bump, slot: _Slot) -> Any:
    """``batch`` collated into ``slot`` through ``bump``, as a shipment to the main process."""
    try:
        data = _collate_with(batch, collate_fn_map=bump.fn_map())
    except BaseException:
        slot.flag[0] = 0
        raise
    if bump.tensors == 0:  # nothing landed in the slot (e.g. non-CPU tensors)
        slot.flag[0] = 0
        return data
    return _Shipment(data, slot.flag, bump.tensors)


class _Shipment:
    """A collated batch on its way to the main process; unpickles as the plain batch."""

    def __init__(self, data: object, flag: torch.Tensor, tensors: int) -> None:
        self.data, self.flag, self.tensors = data, flag, tensors

    def __reduce__(self) -> tuple[Callable[..., object], tuple[object, torch.Tensor, int]]:
        return _receive, (self.data, self.flag, self.tensors)


class _Release:
    """Marks the slot free once the last of its ``count`` tensors (and their views) is freed."""

    def __init__(self, flag: torch.Tensor, count: int) -> None:
        self.flag: torch.Tensor | None = flag
        self.count = count
        self.lock = threading.Lock()  # finalizers may run in the pin-memory thread

    def done(self) -> None:
        with self.lock:
            self.count -= 1
            if self.count == 0 and self.flag is not None:
                self.flag[0] = 0
                self.flag = None  # unmaps with the batch


def _receive(data: object, flag: torch.Tensor, tensors: int) -> object:
    """In the receiving process: rewrap the slot's tensors so their lifetime frees the slot."""
    ptr = flag.untyped_storage().data_ptr()
    release = _Release(flag, tensors)
    wrapped = 0

    def wrap(t: torch.Tensor) -> torch.Tensor:
        nonlocal wrapped
        if t.untyped_storage().data_ptr() != ptr:
            return t
        # ``t.numpy()`` keeps ``t`` (and the mapping) alive; the new tensor's storage keeps the
        # array alive; so the array dies exactly when the last view of the new tensor does.
        array = t.reshape(-1).view(torch.uint8).numpy()
        weakref.finalize(array, release.done).atexit = False
        wrapped += 1
        return torch.from_numpy(array).view(t.dtype).view(t.shape)

    out = _map_tensors(data, wrap)
    if wrapped != tensors:
        # Some slot tensor sits where we could not reach it: never mark this slot free.
        release.flag = None
    return out


def _map_tensors(data: object, fn: Callable[[torch.Tensor], torch.Tensor]) -> object:
    if isinstance(data, torch.Tensor):
        return fn(data)
    if isinstance(data, collections.abc.Mapping):
        items = {k: _map_tensors(v, fn) for k, v in data.items()}
        if type(data) is dict:
            return items
        try:  # keep the mapping's type, as default_collate does
            if isinstance(data, collections.abc.MutableMapping):
                clone = copy.copy(data)
                clone.update(items)
                return clone
            return cast(Any, type(data))(items)
        except TypeError:
            return items
    if isinstance(data, tuple) and hasattr(data, "_fields"):
        return cast(Any, type(data))(*(_map_tensors(v, fn) for v in data))
    if isinstance(data, (list, tuple)):
        return cast(Any, type(data))(_map_tensors(v, fn) for v in data)
    return data
