"""``rayform.torch.collate``: default_collate's batches, shared memory reused, never overwritten."""

from __future__ import annotations

import collections
import gc
import multiprocessing as mp

import numpy as np
import pytest
import torch
from support.batches import assert_same
from support.datasets import FPS, build_slice
from torch.utils.data import DataLoader, Dataset, default_collate

import rayform.torch
from rayform.torch import EpisodeDataset, _collate, collate

Pair = collections.namedtuple("Pair", ["left", "right"])


class Samples(Dataset):
    """Sample ``i``: every kind of value default_collate batches, each derived from ``i``."""

    def __init__(self, n: int = 64, side: int = 16) -> None:
        self.n, self.side = n, side

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict:
        return {
            "img": torch.full((3, self.side, self.side), i % 256, dtype=torch.uint8),
            "vec": torch.tensor([i, -i], dtype=torch.float32),
            "flag": torch.tensor(i % 2 == 0),
            "n": i,
            "x": i / 2,
            "name": f"s{i}",
            "arr": np.full(3, i, dtype=np.int16),
            "nested": {"t": torch.arange(4, dtype=torch.int64) + i},
            "pair": Pair(torch.tensor([i]), "p"),
            "list": [torch.tensor(float(i)), i],
        }


def expected(i: int) -> dict:
    return Samples()[i]


def loader(ds: Dataset, collate_fn=collate, **kw) -> DataLoader:
    kw = {"batch_size": 8, "num_workers": 2, **kw}
    return DataLoader(ds, collate_fn=collate_fn, **kw)


def test_public_and_main_process_is_default_collate() -> None:
    assert rayform.torch.collate is collate
    batch = [Samples()[i] for i in range(5)]
    out = collate(batch)
    assert_same(out, default_collate(batch))
    assert out["img"].is_shared() is False
    assert_same(
        list(loader(Samples(20), num_workers=0)),
        list(loader(Samples(20), default_collate, num_workers=0)),
    )


def test_same_batches_as_default_collate_in_workers() -> None:
    ours = list(loader(Samples(), batch_size=7))  # the last batch is smaller: 64 = 9 x 7 + 1
    theirs = list(loader(Samples(), default_collate, batch_size=7))
    assert len(ours) == 10
    assert_same(ours, theirs)
    assert type(ours[0]) is dict and type(ours[0]["pair"]) is Pair


@pytest.fixture(params=["file_descriptor", "file_system"])
def sharing_strategy(request):
    before = torch.multiprocessing.get_sharing_strategy()
    torch.multiprocessing.set_sharing_strategy(request.param)
    yield request.param
    torch.multiprocessing.set_sharing_strategy(before)


def test_slots_are_reused_when_batches_are_dropped(
    monkeypatch: pytest.MonkeyPatch, sharing_strategy
) -> None:
    made = mp.get_context("fork").Value("i", 0)
    init = _collate._Slot.__init__

    def counting(self, nbytes: int) -> None:
        with made.get_lock():
            made.value += 1
        init(self, nbytes)

    monkeypatch.setattr(_collate._Slot, "__init__", counting)  # inherited by the forked workers
    from_slots = 0
    for b, batch in enumerate(loader(Samples(480, side=64), persistent_workers=True)):
        # A tensor from a slot is re-wrapped on arrival: not itself a shared-memory tensor.
        from_slots += not batch["img"].is_shared()
        assert torch.equal(
            batch["img"][:, 0, 0, 0], torch.arange(b * 8, b * 8 + 8, dtype=torch.uint8)
        )
        del batch
    assert from_slots >= 57, "the slots were not released as the batches were freed"
    assert 2 <= made.value <= 2 * _collate.MAX_SLOTS


def test_held_batches_and_views_are_never_overwritten() -> None:
    kept = []
    fallbacks = 0
    for batch in loader(
        Samples(480, side=64), shuffle=True, generator=torch.Generator().manual_seed(3)
    ):
        fallbacks += batch["img"].is_shared()
        # Keep only views (the batch dict and its tensors are dropped): they must pin the slot.
        kept.append(
            (batch["n"].clone(), batch["img"][2:5], batch["nested"]["t"][1], batch["vec"][:, 1])
        )
        del batch
    assert fallbacks > 0, "with every batch held the workers must fall back to fresh memory"
    for n, img, row, vec in kept:
        assert torch.equal(img[:, 0, 0, 0], (n[2:5] % 256).to(torch.uint8))
        assert torch.equal(img.amin(dim=(1, 2, 3)), img.amax(dim=(1, 2, 3)))
        assert torch.equal(row, torch.arange(4) + n[1])
        assert torch.equal(vec, -n.to(torch.float32))


def _sum_images(queue, out) -> None:
    batch = queue.get()
    out.put(int(batch["img"].to(torch.int64).sum()))


def test_batch_sent_to_another_process_is_a_copy() -> None:
    ctx = torch.multiprocessing.get_context("fork")
    queue, out = ctx.Queue(), ctx.Queue()
    child = ctx.Process(target=_sum_images, args=(queue, out))
    child.start()
    it = iter(loader(Samples(480, side=64), num_workers=1, persistent_workers=True))
    first = next(it)
    want = int(first["img"].to(torch.int64).sum())
    queue.put(first)
    del first
    for _ in it:  # the worker reuses the slot while the child may not have read it yet
        pass
    assert out.get(timeout=60) == want
    child.join(timeout=60)
    assert child.exitcode == 0


def test_spawned_workers() -> None:
    ours = list(loader(Samples(24), multiprocessing_context="spawn"))
    assert_same(
        ours, [default_collate([expected(i) for i in range(b, b + 8)]) for b in range(0, 24, 8)]
    )


class Ragged(Samples):
    def __getitem__(self, i: int) -> dict:
        sample = super().__getitem__(i)
        if i == 13:
            sample["img"] = sample["img"][:, :5]
        return sample


def test_an_error_in_a_worker_reaches_the_caller() -> None:
    it = iter(loader(Ragged(64), num_workers=1))
    assert_same(next(it), default_collate([expected(i) for i in range(8)]))
    with pytest.raises(RuntimeError, match="not resizable|equal size"):  # default_collate's error
        next(it)
    rest = [(b["n"].tolist(), b["img"].is_shared()) for b in it]  # the worker goes on
    assert [n[0] for n, _ in rest] == list(range(16, 64, 8))


@pytest.fixture
def as_worker(monkeypatch: pytest.MonkeyPatch):
    """Run ``collate`` in this process as if it were DataLoader worker 0, with a fresh pool."""
    from torch.utils.data._utils import worker

    monkeypatch.setattr(worker, "_worker_info", object())
    _collate.forget_slots()
    yield lambda: [int(busy) for busy in _collate.slots_in_use()]
    _collate.forget_slots()


def ship(data):
    """What the DataLoader does with a worker's batch: ForkingPickler there, unpickle here."""
    from multiprocessing.reduction import ForkingPickler

    return ForkingPickler.loads(ForkingPickler.dumps(data))


def released(releases: list) -> str:
    """Why a received batch's slot is still busy: its count of live tensors, whether receiving
    gave up on it (a slot tensor it could not re-wrap), and whether a collection frees it."""

    def state() -> list[tuple[int, bool]]:
        return [(r.count, r.flag is None) for r in releases]

    before = state()
    gc.collect()
    return f"(live tensors, gave up) per received batch: {before}; after gc.collect(): {state()}"


def test_slot_protocol(as_worker, monkeypatch: pytest.MonkeyPatch) -> None:
    busy = as_worker
    releases: list = []

    class Recorded(_collate._Release):
        def __init__(self, *args) -> None:
            super().__init__(*args)
            releases.append(self)

    monkeypatch.setattr(_collate, "_Release", Recorded)
    batch = ship(collate([expected(i) for i in range(4)]))
    assert busy() == [1]
    assert_same(batch, default_collate([expected(i) for i in range(4)]))
    view = batch["img"][1:]
    del batch
    assert busy() == [1], "a view still uses the slot"
    ship(collate([expected(i) for i in range(4)]))  # received and dropped at once
    assert busy() == [1, 0], released(releases)
    del view
    assert busy() == [0, 0]
    with pytest.raises(RuntimeError):
        collate([Ragged()[i] for i in range(12, 16)])
    assert busy() == [0, 0], "a failed batch must give its slot back"
    held = [ship(collate([expected(i) for i in range(4)])) for _ in range(_collate.MAX_SLOTS + 2)]
    assert busy() == [1] * _collate.MAX_SLOTS
    assert [b["img"].is_shared() for b in held] == [False] * _collate.MAX_SLOTS + [True, True]
    del held
    assert busy() == [0] * _collate.MAX_SLOTS
    big = ship(collate([Samples(side=64)[i] for i in range(4)]))  # no free slot is big enough
    assert busy().count(1) == 1 and len(busy()) == _collate.MAX_SLOTS
    assert not big["img"].is_shared()


def test_episode_dataset_batches_match_default_collate(tmp_path) -> None:
    slice_, _ = build_slice(tmp_path / "store", tmp_path / "cache")

    def epoch(collate_fn) -> list:
        ds = EpisodeDataset(
            slice_,
            obs=["cam0/rgb", "joints/position"],
            action="joints/position_delta",
            fps=FPS,
            horizon=4,
            seed=1,
        )
        return list(
            loader(
                ds,
                collate_fn,
                batch_size=16,
                shuffle=True,
                generator=torch.Generator().manual_seed(5),
            )
        )

    ours, theirs = epoch(collate), epoch(default_collate)
    assert len(ours) > 3
    assert_same(ours, theirs)
    assert not ours[1]["cam0/rgb"].is_shared()


def test_a_slot_tensor_we_cannot_rewrap_keeps_its_slot_forever(as_worker) -> None:
    busy = as_worker
    samples = [
        {"x": collections.UserList([torch.tensor([i]), torch.tensor([i, i])])} for i in range(3)
    ]
    batch = ship(collate(samples))
    assert isinstance(batch["x"], collections.UserList)
    assert torch.equal(batch["x"][1], torch.tensor([[0, 0], [1, 1], [2, 2]]))
    del batch
    assert busy() == [1], "a tensor outside the re-wrapped ones could still be in use"
