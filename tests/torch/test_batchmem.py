"""Reused batch memory (``rayform.torch._batchmem``): a batch read inside ``with memory:``
goes into memory an earlier batch used only once nothing references that batch any more, and
its samples are the same as without."""

from __future__ import annotations

import pytest
import torch

from rayform.slice import Slice
from rayform.torch import EpisodeDataset
from rayform.torch._batchmem import BatchMemory, current
from rayform.torch._collate import batch_tensor

SHAPE = (4, 3, 8, 8)


def _storage(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def test_a_dropped_batch_memory_is_written_again() -> None:
    memory = BatchMemory(keep=2)
    with memory:  # the first batch measures what a batch takes
        first = batch_tensor(SHAPE), batch_tensor((2,), torch.int64)
        assert current() is memory
    assert current() is None and memory.largest >= first[0].numel() + 16
    assert memory.buffers == []
    del first
    with memory:
        a = batch_tensor(SHAPE)
        b = batch_tensor((2,), torch.int64)  # a second region of the same buffer
    assert _storage(a) == _storage(b) == _storage(memory.buffers[0])
    assert b.data_ptr() >= a.data_ptr() + a.numel()  # regions never overlap
    a.fill_(7)
    ptr = a.data_ptr()
    del a, b
    with memory:
        again = batch_tensor(SHAPE)
    assert again.data_ptr() == ptr  # the same memory, written again
    assert len(memory.buffers) == 1


def test_a_referenced_batch_is_never_overwritten() -> None:
    memory = BatchMemory(keep=1)
    with memory:
        batch_tensor(SHAPE)
    with memory:
        kept = batch_tensor(SHAPE)
    kept.fill_(3)
    row = kept[1].numpy()  # a view that outlives the tensor it came from
    del kept
    with memory:
        other = batch_tensor(SHAPE)  # the only kept buffer is still referenced: new memory
    other.fill_(9)
    assert _storage(other) != _storage(memory.buffers[0])
    assert (row == 3).all()
    del row
    with memory:
        reused = batch_tensor(SHAPE)
    assert _storage(reused) == _storage(memory.buffers[0])


def test_a_bigger_batch_takes_new_memory_and_outside_nothing_is_reused() -> None:
    memory = BatchMemory(keep=1)
    with memory:
        batch_tensor(SHAPE)
    with memory:
        small = batch_tensor(SHAPE)
        big = batch_tensor((64, 3, 8, 8))  # past the end of the buffer: new memory
    assert _storage(small) == _storage(memory.buffers[0]) != _storage(big)
    del small, big
    with memory:  # the buffer was too small for the last batch: replaced by a bigger one
        whole = batch_tensor((68, 3, 8, 8))
    assert _storage(whole) == _storage(memory.buffers[0])
    assert memory.buffers[0].numel() >= whole.numel()
    outside = batch_tensor(SHAPE)
    assert _storage(outside) != _storage(memory.buffers[0])


def test_one_batch_memory_per_thread_at_a_time() -> None:
    with BatchMemory(), pytest.raises(RuntimeError, match="already in use"), BatchMemory():
        pass
    assert current() is None


@pytest.mark.parametrize("image_size", [None, (40, 72)])
def test_samples_read_into_reused_memory_are_the_same(demo: Slice, image_size) -> None:
    dataset = EpisodeDataset(
        demo,
        obs=["cam0/rgb", "wrist/rgb", "joints/position"],
        action="joints/position_delta",
        fps=15,
        shard=None,
        image_size=image_size,
    )
    memory = BatchMemory()
    blocks = [range(i, min(i + 24, len(dataset))) for i in range(0, 96, 24)]
    kept = []
    for rows in blocks:
        with memory:
            got = dataset.__getitems__(list(rows))
        kept.append(_storage(got[0]["cam0/rgb"]) in {_storage(b) for b in memory.buffers})
        cams = {k: torch.stack([s[k] for s in got]) for k in ("cam0/rgb", "wrist/rgb")}
        want = dataset.__getitems__(list(rows))
        for i, sample in enumerate(want):
            for key in ("cam0/rgb", "wrist/rgb"):
                assert torch.equal(cams[key][i], sample[key]), (rows, i, key)
            assert torch.equal(got[i]["action"], sample["action"])
        del got, cams, sample
    assert kept == [False, True, True, True]  # every block after the first in kept memory
    assert len(memory.buffers) == 1
