"""The order engine alone (no data): permutations, shards and elastic histories."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from rayform.torch._sampling._order import WindowStream, episode_streams, plan
from rayform.torch._sampling._perm import PassPermutations, Permutation, derive_key


@pytest.mark.parametrize("n", [0, 1, 2, 3, 5, 17, 1000, 12_345])
def test_permutation_is_a_bijection_fixed_by_its_key(n: int) -> None:
    p = Permutation(n, derive_key("t", 1))
    out = p(np.arange(n))
    assert sorted(out.tolist()) == list(range(n))
    assert np.array_equal(Permutation(n, derive_key("t", 1))(np.arange(n)), out)
    if n > 50:
        assert not np.array_equal(Permutation(n, derive_key("t", 2))(np.arange(n)), out)
        assert np.abs(np.corrcoef(np.arange(n), out)[0, 1]) < 0.1  # shuffled, not shifted
    assert np.array_equal(Permutation(n, 1, shuffle=False)(np.arange(n)), np.arange(n))


def test_tweaks_are_independent_permutations() -> None:
    p = Permutation(100, derive_key("t"))
    a = p(np.arange(100), tweak=np.zeros(100, np.int64))
    b = p(np.arange(100), tweak=np.ones(100, np.int64))
    assert sorted(a.tolist()) == sorted(b.tolist()) == list(range(100)) and not np.array_equal(a, b)
    mixed = p(np.arange(200) % 100, tweak=np.arange(200) // 100)
    assert np.array_equal(mixed[:100], a) and np.array_equal(mixed[100:], b)


def test_a_position_of_a_billion_sample_epoch_costs_the_same_as_the_first() -> None:
    p = Permutation(10**9, derive_key("big"))
    far = p(np.array([0, 10**9 - 1, 123_456_789]))
    assert len(set(far.tolist())) == 3 and far.max() < 10**9


def replay(n: int, worlds: list[int], consumed: list[int | None], even: str, offsets=None):
    """Keys every rank reads, segment after segment; returns them and the finishing world."""
    offsets = np.array([0, n]) if offsets is None else offsets
    streams = episode_streams(offsets, worlds[0], even, 0, 0, True)
    lengths = [s.length for s in streams]
    seen, history, finished = [], [], None
    for world, c in zip(worlds, consumed, strict=True):
        history.append([world, 0])
        parts = plan(lengths, history)
        length = parts[0].length
        assert all(p.length == length for p in parts)  # equal on every rank
        c = length if c is None else min(c, length)
        if c == length and finished is None and length:
            finished = world
        for part in parts:
            stream, slot = part.locate(np.arange(c))
            seen += [
                int(streams[s].keys(np.array([j]))[0]) for s, j in zip(stream, slot, strict=True)
            ]
        history[-1][1] = c
    return seen, finished


@pytest.mark.parametrize("n", [0, 1, 2, 5, 17, 100])
@pytest.mark.parametrize("worlds", [[2, 3], [3, 2], [2, 2], [1, 4], [4, 1], [3, 2, 3]])
@pytest.mark.parametrize("c0", [0, 1, 3, 7])
def test_split_histories_read_every_sample_once_plus_world_minus_one(n, worlds, c0) -> None:
    seen, finished = replay(n, worlds, [c0] * (len(worlds) - 1) + [None], "split")
    counts = Counter(seen)
    assert set(counts) == set(range(n))
    assert 0 <= len(seen) - n <= (finished or 1) - 1


def test_same_world_resume_is_the_uninterrupted_order() -> None:
    offsets = np.array([0, 40, 41, 90, 130])
    for even in ("split", "pad", "drop"):
        whole, _ = replay(130, [3], [None], even, offsets)
        a, _ = replay(130, [3, 3], [5, None], even, offsets)
        assert sorted(a) == sorted(whole)
        streams = episode_streams(offsets, 3, even, 0, 0, True)
        lengths = [s.length for s in streams]
        for rank in range(3):
            one = plan(lengths, [[3, 0]])[rank]
            two = plan(lengths, [[3, 5], [3, 0]])[rank]  # stopped after 5, resumed on 3 ranks
            assert two.length == one.length - 5
            for a, b in zip(
                one.locate(np.arange(5, one.length)), two.locate(np.arange(two.length)), strict=True
            ):
                assert np.array_equal(a, b)


def test_split_shards_are_consecutive_episodes() -> None:
    offsets = np.array([0, 10, 30, 35, 60, 100])
    streams = episode_streams(offsets, 2, "split", 0, 0, True)
    ranks = [set(s.keys(np.arange(s.length)).tolist()) for s in streams]
    assert ranks[0] == set(range(50)) and ranks[1] == set(range(50, 100))


@pytest.mark.parametrize("even", ["split", "pad", "drop"])
@pytest.mark.parametrize("world", [1, 2, 3])
@pytest.mark.parametrize("window", [1, 3, 50])
def test_windowed_order_reads_the_shard_once_a_window_of_episodes_at_a_time(
    even, world, window
) -> None:
    counts = np.random.default_rng(5).integers(0, 30, 40)
    offsets = np.concatenate([[0], np.cumsum(counts)])
    whole = episode_streams(offsets, world, even, 0, 2, True)
    windowed = episode_streams(offsets, world, even, 0, 2, True, window)
    for plain, stream in zip(whole, windowed, strict=True):
        assert isinstance(stream, WindowStream) and stream.length == plain.length
        keys = stream.keys(np.arange(stream.length))
        # The same samples as the shard (a multiset: "pad" repeats some), in another order.
        assert sorted(keys.tolist()) == sorted(plain.keys(np.arange(plain.length)).tolist())
        if stream.length > 1:
            assert keys.tolist() != sorted(keys.tolist())
        # Each window's stretch of slots reads at most `window` episodes (runs of one episode).
        episode = np.searchsorted(offsets, keys, side="right") - 1
        _, _, _, wstart = stream._lay()
        for a, b in zip(wstart[:-1], wstart[1:], strict=True):
            assert len(set(episode[a:b].tolist())) <= window
        # Any slot's key inverts back to its slot (to one of them, if "pad" repeated it); a
        # key outside the shard to None.
        repeats = Counter(keys.tolist())
        for slot in range(stream.length):
            found = stream.slot_of(int(keys[slot]))
            assert found is not None and keys[found] == keys[slot]
            assert found == slot or repeats[int(keys[slot])] > 1
        outside = set(range(int(offsets[-1]))) - set(keys.tolist())
        assert all(stream.slot_of(i) is None for i in sorted(outside)[:5])
        # Jumping to a slot gives what reading from the start gives there.
        mid = np.arange(stream.length // 3, stream.length)
        assert np.array_equal(stream.keys(mid), keys[mid])


def test_windowed_order_is_fixed_by_seed_and_epoch() -> None:
    offsets = np.array([0, 40, 41, 90, 130, 131, 200])
    one = episode_streams(offsets, 1, "split", 0, 0, True, 2)[0]
    keys = one.keys(np.arange(one.length))
    assert np.array_equal(
        episode_streams(offsets, 1, "split", 0, 0, True, 2)[0].keys(np.arange(200)), keys
    )
    assert not np.array_equal(
        episode_streams(offsets, 1, "split", 0, 1, True, 2)[0].keys(np.arange(200)), keys
    )
    assert not np.array_equal(
        episode_streams(offsets, 1, "split", 1, 0, True, 2)[0].keys(np.arange(200)), keys
    )
    # Elastic histories over windowed streams still read every sample once (+ world - 1 pads).
    streams = episode_streams(offsets, 2, "split", 0, 0, True, 2)
    lengths = [s.length for s in streams]
    seen = []
    history = [[2, 7], [3, 0]]
    for part in plan(lengths, [[2, 0]]):
        stream, slot = part.locate(np.arange(7))
        seen += [int(streams[s].keys(np.array([j]))[0]) for s, j in zip(stream, slot, strict=True)]
    for part in plan(lengths, history):
        stream, slot = part.locate(np.arange(part.length))
        seen += [int(streams[s].keys(np.array([j]))[0]) for s, j in zip(stream, slot, strict=True)]
    assert set(seen) == set(range(200)) and len(seen) - 200 <= 2


def test_passes_are_the_tweaked_permutation() -> None:
    n, key = 37, derive_key("passes", 3)
    passes = PassPermutations(n, key)
    perm = Permutation(n, key)
    rng = np.random.default_rng(0)
    for _ in range(6):  # draws over up to 5 passes, in no order
        j = rng.integers(0, 5 * n, 40)
        assert np.array_equal(passes(j), perm(j % n, tweak=j // n))
    every = np.arange(3 * n)
    out = passes(every)  # each pass a permutation of the source, and the passes differ
    for p in range(3):
        assert sorted(out[p * n : (p + 1) * n].tolist()) == list(range(n))
    assert not np.array_equal(out[:n], out[n : 2 * n])
