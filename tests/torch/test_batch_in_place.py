"""A batch read in one pass: ``__getitems__`` resizes each camera's frames straight into one
batch tensor (in a worker, the slot ``collate`` ships), and the batches are the per-sample
path's bit for bit."""

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
        (None, {}),  # full resolution: decoded straight into the batch
        (None, {"decode_threads": 2}),
        (None, {"decoder_backend": "pyav"}),  # decoded, then copied into the batch
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
    first = ship(collate(ds.__getitems__(keys)))  # collate seen: the next batch goes in place
    assert_same(first, per_sample)
    samples = ds.__getitems__(keys)
    assert all(s[cam].is_shared() for s in samples for cam in CAMS), "rows of the next slot"
    carrier = collate(samples)
    for cam in CAMS:  # kept where the reader wrote them: not copied again
        assert carrier.data[cam].data_ptr() == samples[0][cam].data_ptr()
    del samples
    batch = ship(carrier)
    del carrier
    assert_same(batch, per_sample)
    assert busy().count(1) == 2, "the first batch's slot and this one's"
    del batch, first
    assert busy() == [0] * len(busy()), "freed with the batch, as a copied batch's slot is"


@pytest.mark.parametrize("mode", ["pad", None])
def test_workers_give_default_collates_batches(demo: Slice, mode: str | None) -> None:
    ds = make(demo, mode)
    ref = list(DataLoader(ds, batch_size=8, shuffle=False))
    for collate_fn in (collate, default_collate):
        loader = DataLoader(
            ds, batch_size=8, num_workers=2, collate_fn=collate_fn, persistent_workers=True
        )
        for _ in range(2):  # the second epoch reads every batch in place
            assert_same(list(loader), ref)


def test_a_caller_that_reorders_the_samples_gets_a_copy(demo: Slice, as_worker) -> None:
    ds = make(demo)
    keys = keys_of(ds)
    busy = as_worker
    collate(ds.__getitems__(keys))
    samples = ds.__getitems__(keys)
    assert samples[0]["cam0/rgb"].is_shared()
    batch = ship(collate(samples[::-1]))
    assert_same(batch, default_collate(samples[::-1]))
    held = busy().count(1)
    # Its rows may still be someone's: that slot is never written again, and this process
    # reads the next batches as before (one slot lost, not one per batch).
    again = ds.__getitems__(keys)
    assert not again[0]["cam0/rgb"].is_shared()
    del batch
    assert busy().count(1) == held - 1


def test_a_transform_and_a_mixture_read_as_before(demo: Slice, as_worker) -> None:
    def flip(sample: dict) -> dict:
        return {**sample, "cam0/rgb": sample["cam0/rgb"].flip(-1)}

    flipped = make(demo, transform=flip)
    collate(flipped.__getitems__([0, 1]))
    samples = flipped.__getitems__([0, 1])
    assert not any(s["cam0/rgb"].is_shared() or s["wrist/rgb"].is_shared() for s in samples)
    assert_same(ship(collate(samples)), default_collate(samples))
    # A mixture's sources' shares are read in one pass: the same samples as one by one (a
    # mixture's frames are copied into the batch by collate).
    mix = MixtureDataset([(make(demo), 1.0), (make(demo, "crop"), 1.0)], seed=0)
    keys = [(0, 0), (1, 0), (2, 0)]
    plain = [mix[key] for key in keys]
    assert_same(ship(collate(mix.__getitems__(keys))), default_collate(plain))
