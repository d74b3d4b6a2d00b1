"""EpisodeSampler resume: stop after batch k, continue bit for bit, on any number of workers."""

from __future__ import annotations

import json
import time
from collections import Counter
from itertools import islice

import numpy as np
import pytest
import torch
from support.datasets import FPS, build_slice
from torch.utils.data import DataLoader, default_collate
from torchdata.stateful_dataloader import StatefulDataLoader

from rayform.errors import InvalidArgumentError
from rayform.torch import EpisodeDataset, EpisodeSampler, MixtureDataset, collate

OBS = ["cam0/rgb", "joints/position"]
ACTION = "joints/position_delta"
B = 4
EPOCH = 1
pytestmark = [
    # 3 workers on a 2-core machine is the point of the test, not a mistake.
    pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning"),
    # torchdata 0.11's StatefulDataLoader calls torch.set_vital, deprecated in torch 2.13.
    pytest.mark.filterwarnings("ignore:'set_vital' is deprecated:UserWarning"),
]


@pytest.fixture(scope="module")
def slice_(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("resume")
    return build_slice(root / "store", root / "cache", seconds=(2.0, 1.0, 1.5))[0]


def jitter(sample: dict) -> dict:
    sample["noise"] = torch.rand(2)  # per-sample RNG, seeded from (seed, epoch, index)
    return sample


def make(slice_, **kw) -> EpisodeDataset:
    ds = EpisodeDataset(
        slice_, obs=OBS, action=ACTION, fps=FPS, horizon=3, seed=11, transform=jitter, **kw
    )
    ds.set_epoch(EPOCH)
    return ds


def ids(batch: dict) -> list[tuple]:
    """What identifies each sample of a batch (cheap to compare)."""
    meta = batch["meta"]
    return list(
        zip(
            meta["segment"],
            batch["t_ns"].tolist(),
            meta["site"],
            batch["noise"][:, 0].tolist(),
            strict=True,
        )
    )


@pytest.fixture(scope="module")
def reference(slice_):
    """The uninterrupted epoch: batches (ids) and the full tensors of every batch."""
    ds = make(slice_)
    batches = list(DataLoader(ds, batch_size=B, sampler=EpisodeSampler(ds), num_workers=0))
    return [ids(b) for b in batches], batches


def resumed_tail(slice_, k: int, save_workers: int, workers: int, collate_fn) -> list:
    """Run k batches on ``save_workers``, save (JSON), resume on ``workers``: the rest."""
    ds = make(slice_)
    sampler = EpisodeSampler(ds)
    loader = DataLoader(
        ds, batch_size=B, sampler=sampler, num_workers=save_workers, collate_fn=collate_fn
    )
    consumed = sum(len(b["t_ns"]) for b in islice(loader, k))  # a plain loop counts what it used
    state = json.loads(json.dumps(sampler.state_dict(consumed=consumed)))
    ds2 = make(slice_)
    sampler2 = EpisodeSampler(ds2)
    sampler2.load_state_dict(state)
    loader2 = DataLoader(
        ds2, batch_size=B, sampler=sampler2, num_workers=workers, collate_fn=collate_fn
    )
    return list(loader2)


@pytest.mark.parametrize(
    "collate_fn", [default_collate, collate], ids=["default_collate", "rayform_collate"]
)
@pytest.mark.parametrize("workers", [0, 2, 3])
def test_resume_gives_the_remaining_batches(slice_, reference, workers: int, collate_fn) -> None:
    ref_ids, ref_batches = reference
    last = len(ref_ids) - 1
    save_workers = {0: 2, 2: 3, 3: 0}[workers]  # always resume on a different worker count
    for k in (0, last // 2, last):
        tail = resumed_tail(slice_, k, save_workers, workers, collate_fn)
        assert [ids(b) for b in tail] == ref_ids[k:], (k, workers)
    # One case compares every tensor bit for bit, video frames included.
    if workers == 2 and collate_fn is collate:
        for got, want in zip(tail, ref_batches[last:], strict=True):
            assert sorted(got) == sorted(want)
            for key in want:
                if key != "meta":
                    assert torch.equal(got[key], want[key]), key


def test_state_is_small_json_and_resumes_after_the_epoch_ends(slice_, reference) -> None:
    ds = make(slice_)
    sampler = EpisodeSampler(ds)
    assert sampler.state_dict()["history"] == [[1, 0]]
    list(DataLoader(ds, batch_size=B, sampler=sampler))
    state = sampler.state_dict()
    text = json.dumps(state)
    assert len(text) < 300 and state["epoch"] == EPOCH and state["history"] == [[1, len(ds)]]
    again = EpisodeSampler(make(slice_))
    again.load_state_dict(json.loads(text))
    assert len(again) == 0 and list(again) == []  # that epoch is done
    assert len(again) == len(ds)  # and the next iteration is a fresh epoch


def test_state_dict_costs_well_under_a_millisecond(slice_) -> None:
    ds = make(slice_)
    sampler = EpisodeSampler(ds)
    it = iter(sampler)
    for _ in range(7):
        next(it)
    t = time.perf_counter()
    for _ in range(100):
        sampler.state_dict()
    assert (time.perf_counter() - t) / 100 < 1e-3


def test_next_indices_is_what_the_sampler_yields_next(slice_) -> None:
    ds = make(slice_)
    sampler = EpisodeSampler(ds)
    ahead = sampler.next_indices(10).tolist()
    it = iter(sampler)
    assert [next(it).sample for _ in range(10)] == ahead
    ahead = sampler.next_indices(5).tolist()
    assert [next(it).sample for _ in range(5)] == ahead
    state = sampler.state_dict()
    rest = [k.sample for k in it]
    other = EpisodeSampler(make(slice_))
    other.load_state_dict(state)
    assert other.next_indices(1000).tolist() == rest
    # An epoch is a permutation of the dataset.
    assert sorted(EpisodeSampler(ds).next_indices(10_000).tolist()) == list(range(len(ds)))


@pytest.mark.parametrize("workers", [0, 2, 3])
def test_stateful_dataloader_resumes_exactly(slice_, reference, workers: int) -> None:
    ref_ids, _ = reference
    k = len(ref_ids) // 2
    ds = make(slice_)
    loader = StatefulDataLoader(
        ds, batch_size=B, sampler=EpisodeSampler(ds), num_workers=workers, collate_fn=collate
    )
    it = iter(loader)
    assert [ids(next(it)) for _ in range(k)] == ref_ids[:k]
    state = loader.state_dict()
    del it
    ds2 = make(slice_)
    loader2 = StatefulDataLoader(
        ds2, batch_size=B, sampler=EpisodeSampler(ds2), num_workers=workers, collate_fn=collate
    )
    loader2.load_state_dict(state)
    assert [ids(b) for b in loader2] == ref_ids[k:]
    # The sampler's part of the loader's state also resumes a loader with other workers.
    sampler3 = EpisodeSampler(make(slice_))
    sampler3.load_state_dict(EpisodeSampler.state_in(state))
    other = DataLoader(
        sampler3.dataset, batch_size=B, sampler=sampler3, num_workers=(workers + 2) % 4
    )
    assert [ids(b) for b in other] == ref_ids[k:]


def shard_keys(
    slice_, world: int, rank: int, state: dict | None, take: int | None
) -> tuple[list[int], dict]:
    ds = make(slice_, shard=(rank, world))
    sampler = EpisodeSampler(ds)
    if state is not None:
        sampler.load_state_dict(state)
    keys = [k.sample for k in islice(sampler, take)]
    return keys, sampler.state_dict()


@pytest.mark.parametrize("even", ["split", "pad"])
@pytest.mark.parametrize(("first", "second"), [(2, 3), (3, 2), (2, 2), (1, 4), (4, 1)])
def test_elastic_resume_covers_the_epoch_once(slice_, first: int, second: int, even: str) -> None:
    n = len(make(slice_))
    seen: list[int] = []
    take = 5
    states = []
    for r in range(first):
        keys, st = shard_keys(slice_, first, r, None, take)
        seen += keys
        states.append(st)
    assert all(s == states[0] for s in states)  # the state is global: every rank saves the same
    lengths = set()
    for r in range(second):
        ds = make(slice_, shard=(r, second))
        sampler = EpisodeSampler(ds)
        sampler.load_state_dict(states[0])
        length = len(sampler)
        lengths.add(length)
        keys = [k.sample for k in sampler]
        assert len(keys) == length
        seen += keys
    assert len(lengths) == 1  # every rank of the new world has the same number of keys
    counts = Counter(seen)
    assert set(counts) == set(range(n))
    if even == "split":  # exactly once, apart from at most world - 1 pads at the end
        assert len(seen) - n <= second - 1
        assert all(c <= 2 for c in counts.values())


def test_wrong_state_or_epoch_is_a_clear_error(slice_) -> None:
    sampler = EpisodeSampler(make(slice_))
    state = sampler.state_dict()
    other = EpisodeSampler(
        EpisodeDataset(slice_, obs=OBS, action=ACTION, fps=FPS, horizon=3, seed=12)
    )
    with pytest.raises(InvalidArgumentError, match="seed=11"):
        other.load_state_dict(state)
    with pytest.raises(InvalidArgumentError, match="format"):
        sampler.load_state_dict({"epoch": 1})
    ds = make(slice_)
    fresh = EpisodeSampler(ds)
    fresh.load_state_dict(state)
    ds.set_epoch(EPOCH + 1)
    with pytest.raises(InvalidArgumentError, match=rf"set_epoch\({EPOCH}\)"):
        next(iter(fresh))
    with pytest.raises(InvalidArgumentError, match="consumed"):
        EpisodeSampler(make(slice_)).state_dict(consumed=3)


def test_unshuffled_order_is_dataset_order(slice_) -> None:
    ds = make(slice_)
    assert [k.sample for k in EpisodeSampler(ds, shuffle=False)] == list(range(len(ds)))
    keys = list(EpisodeSampler(ds))
    assert sorted(k.sample for k in keys) == list(range(len(ds))) and {k.epoch for k in keys} == {
        EPOCH
    }
    assert np.any(np.diff([k.sample for k in keys]) != 1)


@pytest.mark.parametrize("workers", [0, 2])
def test_windowed_sampler_resumes_exactly_and_elastically(slice_, workers: int) -> None:
    ds = make(slice_)
    sampler = EpisodeSampler(ds, window=1)
    ref = [ids(b) for b in DataLoader(ds, batch_size=B, sampler=sampler, num_workers=workers)]
    segments = [s for batch in ref for s, *_ in batch]
    # window=1: one episode after another, each episode's samples shuffled.
    assert (
        sum(a != b for a, b in zip(segments[:-1], segments[1:], strict=True))
        == len(slice_.segments) - 1
    )
    assert ref != [ids(b) for b in DataLoader(ds, batch_size=B, sampler=EpisodeSampler(ds))]
    k = 3
    first = EpisodeSampler(make(slice_), window=1)
    loader = DataLoader(first.dataset, batch_size=B, sampler=first, num_workers=workers)
    consumed = sum(len(b["t_ns"]) for b in islice(loader, k))
    state = json.loads(json.dumps(first.state_dict(consumed=consumed)))
    assert state["window"] == 1
    again = EpisodeSampler(make(slice_), window=1)
    again.load_state_dict(state)
    assert [
        ids(b) for b in DataLoader(again.dataset, batch_size=B, sampler=again, num_workers=workers)
    ] == ref[k:]
    # Saved on 2 ranks, resumed on 3: every sample once, apart from at most 2 pads.
    n, seen, states = len(ds), [], []
    for r in range(2):
        s = EpisodeSampler(make(slice_, shard=(r, 2)), window=2)
        seen += [key.sample for key in islice(s, 5)]
        states.append(s.state_dict())
    for r in range(3):
        s = EpisodeSampler(make(slice_, shard=(r, 3)), window=2)
        s.load_state_dict(states[0])
        seen += [key.sample for key in s]
    assert set(seen) == set(range(n)) and len(seen) - n <= 2


def test_window_errors_are_clear(slice_) -> None:
    ds = make(slice_)
    for bad in (0, -2, 1.5, True, "4"):
        with pytest.raises(InvalidArgumentError, match=r"window=.*number of episodes >= 1"):
            EpisodeSampler(ds, window=bad)
    with pytest.raises(
        InvalidArgumentError, match="shuffle=False reads the shard in dataset order"
    ):
        EpisodeSampler(ds, shuffle=False, window=4)
    with pytest.raises(
        InvalidArgumentError, match="saved with window=2 but this sampler has window=None"
    ):
        EpisodeSampler(ds, window=None).load_state_dict(EpisodeSampler(ds, window=2).state_dict())
    with pytest.raises(InvalidArgumentError, match=r"window=.*'auto'"):
        EpisodeSampler(ds, window="big")
    mixture = MixtureDataset([(ds, 1.0), (make(slice_), 1.0)])
    with pytest.raises(InvalidArgumentError, match="MixtureDataset draws across its sources"):
        EpisodeSampler(mixture, window=2)
