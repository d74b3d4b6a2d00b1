"""A batch read in one pass (``__getitems__``: every segment's tables aligned at once, each
camera's frames decoded and resized together) gives the per-sample path's batches bit for bit,
through ``default_collate`` and through ``collate``'s shared-memory slots."""

from __future__ import annotations

import types
from multiprocessing.reduction import ForkingPickler

import pytest
from support.batches import assert_same
from torch.utils.data import DataLoader, default_collate

from rayform.slice import Slice
from rayform.torch import EpisodeDataset, MixtureDataset, _collate, collate

CAMS = ["cam0/rgb", "wrist/rgb"]
#: Each camera its own size (two resize groups), the wrist's not 4:3.
SIZES = {"cam0/rgb": (64, 64), "wrist/rgb": (40, 72)}


@pytest.fixture
def as_worker(monkeypatch: pytest.MonkeyPatch):
    """This process as if it were DataLoader worker 0, with a fresh pool of slots."""
    from torch.utils.data._utils import worker

    info = types.SimpleNamespace(id=0, num_workers=1, seed=0, dataset=None)
    monkeypatch.setattr(worker, "_worker_info", info)
    _collate.forget_slots()
    yield lambda: [int(busy) for busy in _collate.slots_in_use()]
    _collate.forget_slots()


def make(slice_: Slice, mode: str | None = "pad", **kw) -> EpisodeDataset:
    """At ``SIZES`` resized in ``mode``; at full resolution with ``None``."""
    sized = {} if mode is None else {"image_size": SIZES, "resize": mode}
    return EpisodeDataset(
        slice_,
        obs=[*CAMS, "joints/position"],
        action="joints/position_delta",
        fps=15,
        horizon=4,
        shard=None,
        **sized,
        **kw,
    )


def keys_of(ds: EpisodeDataset) -> list[int]:
    """Every episode's last steps (their action chunks padded past the episode's end), a key
    twice (one frame, two rows), out of order and across episodes."""
    ends, total = [], 0
    for n in ds.segment_lengths.values():
        total += n
        ends += [total - 1, total - 2]
    return [ends[3], 9, *ends[:3], 0, 9, *ends[4:], 20]


def ship(data):
    """What the DataLoader does with a worker's batch: ForkingPickler there, unpickle here."""
    return ForkingPickler.loads(ForkingPickler.dumps(data))


@pytest.mark.parametrize(
    ("mode", "kw"),
    [
        ("pad", {}),
        ("squash", {}),
        ("crop", {}),
        ("pad", {"decode_threads": 2}),
        (None, {}),  # full resolution
        (None, {"decode_threads": 2}),
        (None, {"decoder_backend": "pyav"}),
    ],
)
def test_a_batch_read_in_one_pass_is_the_per_sample_path_bit_for_bit(
    demo: Slice, mode: str | None, kw: dict, as_worker
) -> None:
    ds = make(demo, mode, **kw)
    keys = keys_of(ds)
    per_sample = default_collate([ds[k] for k in keys])  # each sample read on its own
    assert per_sample["action_is_pad"].any(), "the keys reach past an episode's end"
    assert_same(default_collate(ds.__getitems__(keys)), per_sample)
    busy = as_worker
    first = ship(collate(ds.__getitems__(keys)))
    assert_same(first, per_sample)
    batch = ship(collate(ds.__getitems__(keys)))
    assert_same(batch, per_sample)
    assert busy() == [1, 1], "each batch in its own slot while it is held"
    del batch, first
    assert busy() == [0, 0], "freed with the batch"


@pytest.mark.parametrize("mode", ["pad", None])
def test_workers_give_default_collates_batches(demo: Slice, mode: str | None) -> None:
    ds = make(demo, mode)
    ref = list(DataLoader(ds, batch_size=8, shuffle=False))
    for collate_fn in (collate, default_collate):
        loader = DataLoader(
            ds, batch_size=8, num_workers=2, collate_fn=collate_fn, persistent_workers=True
        )
        for _ in range(2):  # the second epoch reuses the first one's slots
            assert_same(list(loader), ref)


def test_a_transform_and_a_mixture_give_the_per_sample_batches(demo: Slice, as_worker) -> None:
    def flip(sample: dict) -> dict:
        return {**sample, "cam0/rgb": sample["cam0/rgb"].flip(-1)}

    flipped = make(demo, transform=flip)
    plain = [flipped[k] for k in (0, 1)]
    assert_same(ship(collate(flipped.__getitems__([0, 1]))), default_collate(plain))
    # A mixture's sources' shares are read in one pass: the same samples as one by one.
    mix = MixtureDataset([(make(demo), 1.0), (make(demo, "crop"), 1.0)], seed=0)
    keys = [(0, 0), (1, 0), (2, 0)]
    plain = [mix[key] for key in keys]
    assert_same(ship(collate(mix.__getitems__(keys))), default_collate(plain))
