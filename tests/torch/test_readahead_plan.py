"""Read-ahead's plan: a batch is located in this rank's part in O(batch), by inverting the order."""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import numpy as np
import pytest
from support import DEMO_SLICE, TOKEN, ServerProcess
from torch.utils.data import DataLoader

import rayform
from rayform._net._fetchlog import FetchLog, fetch_log
from rayform.cache._evict import Pins
from rayform.torch import EpisodeDataset, EpisodeSampler
from rayform.torch._readahead import _EpochPlan
from rayform.torch._sampling._order import IndexStream, episode_streams
from rayform.torch._sampling._perm import Permutation, derive_key


@pytest.mark.parametrize("n", [0, 1, 2, 3, 7, 64, 1000, 4097])
def test_permutation_inverse_undoes_it(n: int) -> None:
    for seed in range(3):
        perm = Permutation(n, derive_key("test", seed, n))
        x = np.arange(n)
        assert np.array_equal(perm.inverse(perm(x)), x)
    assert np.array_equal(Permutation(n, 1, shuffle=False).inverse(np.arange(n)), np.arange(n))


class _Episodes:
    """What the plan reads from a dataset: its shard and its epoch's streams."""

    def __init__(self, counts: list[int], rank: int, world: int, ddp_even: str) -> None:
        self.offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        self.shard = (rank, world)
        self.ddp_even = ddp_even
        self.seed, self.epoch = 7, 3
        self.shard_auto, self.accepts_window = False, True

    def locate(self, flat: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        seg = np.searchsorted(self.offsets, flat, side="right") - 1
        return seg, flat - self.offsets[seg]

    def order_fingerprint(self) -> dict[str, object]:
        return {"samples": int(self.offsets[-1])}

    def order_streams(
        self, world: int, epoch: int, shuffle: bool, window: int | None = None
    ) -> list[IndexStream]:
        return episode_streams(self.offsets, world, self.ddp_even, 7, epoch, shuffle, window)

    def cache_footprint(self) -> None:
        return None

    def follow_order(self, shuffle: bool, window: int | None) -> None:
        pass


@pytest.mark.parametrize("window", [None, 2])
@pytest.mark.parametrize("ddp_even", ["split", "pad", "drop"])
@pytest.mark.parametrize("world", [1, 2, 3])
def test_every_position_of_every_rank_is_found_where_the_sampler_reads_it(
    ddp_even: str, world: int, window: int | None
) -> None:
    counts = [5, 9, 1, 14, 3, 8, 2]
    parts = set()
    for rank in range(world):
        ds = _Episodes(counts, rank, world, ddp_even)
        p = _EpochPlan(ds.order_streams, ds.shard, ds.locate, 3, (True, window))
        sampler = EpisodeSampler(ds, window=window)
        expected = [k.sample for k in sampler]
        got = p.indices(0, len(expected) + 5)
        assert got.tolist() == expected  # the plan is the sampler's order, and ends where it does
        resumed = EpisodeSampler(
            ds, window=window
        )  # a same-size resume continues the planned order
        resumed.load_state_dict(sampler.state_dict(consumed=4))
        assert [k.sample for k in resumed] == p.indices(4, len(expected)).tolist()
        assert np.array_equal(p.episodes(0, len(expected)), ds.locate(got)[0])
        for pos, index in enumerate(got.tolist()):
            first = p.position(index)
            assert first is not None and first <= pos and got[first] == index
            if index not in got[:pos]:
                assert first == pos
        parts.add(tuple(sorted(set(got.tolist()))))
        assert p.position(int(ds.offsets[-1]) + 5) is None  # not a dataset index
    if ddp_even != "pad":  # ranks read disjoint shards (pads may repeat another rank's episode)
        flat = [i for part in parts for i in part]
        assert len(flat) == len(set(flat))


def _in_child(fn) -> object:  # noqa: ANN001 - a test helper
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            out = pickle.dumps(fn())
        except BaseException as exc:  # noqa: BLE001 - reported to the parent
            out = pickle.dumps(repr(exc))
        os.write(w, out)
        os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        value = pickle.loads(f.read())
    os.waitpid(pid, 0)
    return value


def test_pins_and_fetch_counts_are_per_process(tmp_path: Path) -> None:
    blob = tmp_path / "ab" / "abcdef"
    blob.parent.mkdir()
    blob.write_bytes(b"x")
    pins, counts = Pins(4), FetchLog()
    assert pins.pin(blob) and pins.pinned() == {"abcdef"}
    counts.fetched(10, 0.5)
    child = _in_child(
        lambda: (pins.pinned(), counts.total().fetched_bytes, pins.pin(blob), pins.pinned())
    )
    assert child == (set(), 0, True, {"abcdef"})  # a fork starts with none, then pins its own
    copy = pickle.loads(pickle.dumps((pins, counts)))
    assert (
        copy[0].pinned() == set() and copy[0].max_pins == 4 and copy[1].total().fetched_bytes == 0
    )
    assert (
        pins.pinned() == {"abcdef"} and counts.total().fetched_bytes == 10
    )  # the parent keeps its own
    pins.close()
    assert pins.pinned() == set()


def test_an_unshuffled_sampler_is_read_ahead_too(
    demo_server: ServerProcess, tmp_path: Path
) -> None:
    client = rayform.Client(endpoint=demo_server.url, token=TOKEN, cache_dir=tmp_path)
    ds = EpisodeDataset(client.slices.get(DEMO_SLICE), obs=["joints/position"], action=None, fps=15)
    before = fetch_log().total()
    n = sum(
        len(b["t_ns"])
        for b in DataLoader(ds, sampler=EpisodeSampler(ds, shuffle=False), batch_size=4)
    )
    assert ds._readahead.join(30)
    assert n == len(ds) and fetch_log().total().ahead_bytes > before.ahead_bytes
