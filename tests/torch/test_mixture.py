"""MixtureDataset: weighted draws from several slices, deterministic, sharded and resumable."""

from __future__ import annotations

import json
import pickle
from collections import Counter
from itertools import islice

import numpy as np
import pytest
import torch
from support.datasets import FPS, build_slice
from torch.utils.data import DataLoader

from rayform.errors import InvalidArgumentError
from rayform.torch import EpisodeDataset, EpisodeSampler, MixtureDataset, collate

OBS = ["joints/position"]
ACTION = "joints/position_delta"


@pytest.fixture(scope="module")
def slices(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("mixture")
    a = build_slice(root / "a", root / "ca", seconds=(3.0, 2.0))[0]
    b = build_slice(root / "b", root / "cb", seconds=(1.0,))[0]
    return a, b


def sources(slices, **kw):
    a, b = slices
    return (
        EpisodeDataset(a, obs=OBS, action=ACTION, fps=FPS, horizon=2, **kw),
        EpisodeDataset(b, obs=OBS, action=ACTION, fps=FPS, horizon=2, **kw),
    )


def test_proportions_over_10000_samples_are_within_2_percent(slices) -> None:
    a, b = sources(slices)
    for replacement in (False, True):
        mix = MixtureDataset(
            [(a, 0.7), (b, 0.3)], num_samples=10_000, replacement=replacement, seed=3
        )
        drawn = EpisodeSampler(mix).next_indices(10_000)
        src, local = mix.locate(drawn)
        share = np.bincount(src, minlength=2) / len(drawn)
        assert abs(share[0] - 0.7) < 0.02 and abs(share[1] - 0.3) < 0.02
        # Any stretch of the epoch, not just the whole: the first 1,000 draws.
        assert abs(np.mean(src[:1000] == 0) - 0.7) < 0.05
        if not replacement:  # every sample of a source equally often, give or take one
            for k, ds in enumerate((a, b)):
                counts = np.bincount(local[src == k], minlength=len(ds))
                assert counts.max() - counts.min() <= 1 and counts.sum() == mix.quotas[k]


def test_samples_say_their_source_and_the_epoch_length_rule(slices) -> None:
    a, b = sources(slices)
    mix = MixtureDataset([(a, 2.0), (b, 1.0)])
    assert len(mix) == len(a) + len(b) and mix.num_samples == len(a) + len(b)
    assert mix.quotas.sum() == mix.num_samples and mix.weights == pytest.approx((2 / 3, 1 / 3))
    sampler = EpisodeSampler(mix)
    drawn = sampler.next_indices(mix.num_samples)
    src, local = mix.locate(drawn)
    batches = list(
        DataLoader(mix, batch_size=8, sampler=sampler, num_workers=2, collate_fn=collate)
    )
    got_src = np.concatenate([b["meta"]["source"].numpy() for b in batches])
    assert got_src.tolist() == src.tolist()
    t_ns = np.concatenate([b["t_ns"].numpy() for b in batches])
    want = [(a, b)[k][int(i)]["t_ns"].item() for k, i in zip(src, local, strict=True)]
    assert t_ns.tolist() == want


def test_mixture_run_resumes_exactly(slices) -> None:
    def run(state=None, stop=None):
        mix = MixtureDataset(
            list(zip(sources(slices), (0.6, 0.4), strict=True)), num_samples=60, seed=5
        )
        mix.set_epoch(2)
        sampler = EpisodeSampler(mix)
        if state is not None:
            sampler.load_state_dict(state)
        loader = DataLoader(mix, batch_size=6, sampler=sampler, num_workers=2)
        out = [
            list(zip(b["meta"]["source"].tolist(), b["t_ns"].tolist(), strict=True))
            for b in islice(loader, stop)
        ]
        return out, sampler.state_dict(consumed=6 * len(out))

    full, _ = run()
    assert len(full) == 10
    head, state = run(stop=4)
    tail, _ = run(state=json.loads(json.dumps(state)))
    assert head + tail == full


def test_mixture_is_sharded_and_elastic(slices) -> None:
    def mix(rank, world):
        return MixtureDataset(
            list(zip(sources(slices, shard=(rank, world)), (0.5, 0.5), strict=True)), num_samples=50
        )

    whole = Counter(EpisodeSampler(mix(0, 1)).next_indices(50).tolist())
    seen: Counter[int] = Counter()
    state = None
    for r in range(2):
        sampler = EpisodeSampler(mix(r, 2))
        seen.update(k.sample for k in islice(sampler, 7))
        state = sampler.state_dict()
    for r in range(3):
        sampler = EpisodeSampler(mix(r, 3))
        sampler.load_state_dict(state)
        seen.update(k.sample for k in sampler)
    extra = seen - whole
    assert not whole - seen and sum(extra.values()) <= 2  # the epoch's draws, plus world - 1 pads


def _noise(sample):
    sample["noise"] = torch.rand(())  # stands for a random augmentation
    return sample


@pytest.mark.parametrize("replacement", [False, True])
def test_each_draw_of_a_sample_gets_its_own_augmentation(slices, replacement) -> None:
    a, b = sources(slices, transform=_noise)
    # b is drawn about 3 times over per epoch: its repeats must not share one augmentation.
    mix = MixtureDataset([(a, 1.0), (b, 1.0)], num_samples=6 * len(b), replacement=replacement)
    mix.set_epoch(1)
    sampler = EpisodeSampler(mix)
    loader = DataLoader(mix, batch_size=7, sampler=sampler, num_workers=2, collate_fn=collate)
    runs = []
    for _ in range(2):
        drawn = np.concatenate(
            [np.stack([b["meta"]["source"].numpy(), b["noise"].numpy()], 1) for b in loader]
        )
        runs.append(drawn)
    assert np.array_equal(runs[0], runs[1])  # deterministic whatever the worker
    keys = [(int(k.sample), int(k.epoch)) for k in sampler]
    src, local = mix.locate(np.array([k for k, _ in keys]))
    assert src.tolist() == runs[0][:, 0].astype(int).tolist()
    noise = runs[0][:, 1]
    repeated = 0
    for k in range(2):
        for i in np.unique(local[src == k]).tolist():
            seen = noise[(src == k) & (local == i)]
            repeated += len(seen) > 1
            assert len(np.unique(seen)) == len(seen), (k, i, seen)
    assert repeated >= len(b) // 2
    if not replacement:  # source 1's first pass: each sample augmented as when it is alone
        first = int(mix.quotas[0]) + np.arange(len(b))
        _, at = mix.locate(first, epoch=1)
        for u, i in zip(first.tolist(), at.tolist(), strict=True):
            assert torch.equal(mix[(u, 1)]["noise"], b[(i, 1)]["noise"])


def test_describe_and_stats(slices) -> None:
    a, b = sources(slices)
    mix = MixtureDataset([(a, 0.75), (b, 0.25)])
    d = mix.describe()
    json.dumps(d)
    assert [s["weight"] for s in d["sources"]] == [0.75, 0.25]
    assert all(s["slice"] and s["manifest_hash"] for s in d["sources"])
    stats = mix.stats()
    sa, sb = a.stats(), b.stats()
    assert stats["sources"] == [sa, sb]
    comb = stats["combined"][ACTION]
    want = 0.75 * np.array(sa[ACTION]["mean"]) + 0.25 * np.array(sb[ACTION]["mean"])
    assert np.allclose(comb["mean"], want)
    assert comb["count"] == sa[ACTION]["count"] + sb[ACTION]["count"]
    assert comb["max"] == np.maximum(sa[ACTION]["max"], sb[ACTION]["max"]).tolist()


def test_wrong_combinations_are_clear_errors(slices) -> None:
    a, b = sources(slices)
    other = EpisodeDataset(
        slices[1], obs=["joints/position", "ee/pose"], action=ACTION, fps=FPS, horizon=2
    )
    with pytest.raises(InvalidArgumentError, match="'ee/pose'"):
        MixtureDataset([(a, 1.0), (other, 1.0)])
    longer = EpisodeDataset(slices[1], obs=OBS, action=ACTION, fps=FPS, horizon=5)
    with pytest.raises(InvalidArgumentError, match="'action'"):
        MixtureDataset([(a, 1.0), (longer, 1.0)])
    with pytest.raises(InvalidArgumentError, match="weight"):
        MixtureDataset([(a, 1.0), (b, 0)])
    mix = MixtureDataset([(a, 1.0), (b, 1.0)])
    with pytest.raises(InvalidArgumentError, match="EpisodeSampler"):
        next(iter(DataLoader(mix, batch_size=4, shuffle=True)))


def test_a_pickled_mixture_leaves_its_pass_tables_behind(slices) -> None:
    a, b = sources(slices)
    mix = MixtureDataset([(a, 1.0), (b, 1.0)], num_samples=4 * len(b))  # b read in passes
    keys = [(i, 0) for i in range(0, len(mix), max(1, len(mix) // 16))]
    before = mix.locate(np.array([k for k, _ in keys]), 0)
    assert mix.__dict__.get("_pass_cache")  # built by the draws above
    copy = pickle.loads(pickle.dumps(mix))
    assert "_pass_cache" not in copy.__dict__
    after = copy.locate(np.array([k for k, _ in keys]), 0)
    assert all(np.array_equal(a, b) for a, b in zip(before, after, strict=True))
