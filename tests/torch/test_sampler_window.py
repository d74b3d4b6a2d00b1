"""``EpisodeSampler(window="auto")``: a full shuffle when the data fit the cache limit, else the
largest window that fits half the limit per local rank; recorded in the state and in describe()."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from support import DEMO_SLICE, ServerProcess, make_client
from torch.utils.data import DataLoader

from rayform.torch import EpisodeDataset, EpisodeSampler, MixtureDataset
from rayform.torch._sampling._window import CacheFootprint, choose_window

OBS = ["wrist/rgb", "joints/position"]
ACTION = "joints/position_delta"


def _dataset(server: ServerProcess, cache: Path, limit: int | None, **kw: object) -> EpisodeDataset:
    client = make_client(server.url, cache, cache_limit=limit)
    return EpisodeDataset(
        client.slices.get(DEMO_SLICE), obs=OBS, action=ACTION, fps=15, horizon=4, **kw
    )


def _sizes(ds: EpisodeDataset) -> tuple[int, int, int]:
    """(bytes read per epoch, episodes, largest episode's bytes), from the manifest."""
    per = [
        sum(b.size for n in [*OBS, ACTION] for b in seg.streams[n].blobs()) for seg in ds.segments
    ]
    return sum(per), len(per), max(per)


def test_auto_is_a_full_shuffle_without_a_limit_or_when_the_data_fit(
    client_env: ServerProcess, tmp_path: Path
) -> None:
    free = _dataset(client_env, tmp_path / "a", None)
    s = EpisodeSampler(free)
    assert s.window is None and s.describe()["window_reason"] == "no cache limit: full shuffle"
    total, _, _ = _sizes(free)
    roomy = EpisodeSampler(_dataset(client_env, tmp_path / "b", total))
    assert roomy.window is None and "fit the cache limit" in roomy.describe()["window_reason"]
    assert roomy.describe()["window_auto"] is True
    assert EpisodeSampler(free, shuffle=False).window is None


def test_auto_window_under_a_small_limit_reads_every_sample_once(
    client_env: ServerProcess, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    probe = _dataset(client_env, tmp_path / "probe", None)
    total, episodes, largest = _sizes(probe)
    limit = max(total // 4, largest)  # a quarter of the data
    assert limit < total
    with caplog.at_level(logging.INFO, logger="rayform.sampler"):
        ds = _dataset(client_env, tmp_path / "c", limit)
        sampler = EpisodeSampler(ds)
    expected = max(1, int(limit * 0.5 // (total / episodes)))
    assert sampler.window == expected
    info = sampler.describe()
    assert info["window"] == expected and info["window_auto"] is True
    assert f"window of {expected} episodes" in info["window_reason"]
    assert any(f"window of {expected} episodes" in r.getMessage() for r in caplog.records)
    # A pure function of the dataset and the limit: the same on every rank, cached or not.
    make_client(client_env.url, tmp_path / "c").slices.get(DEMO_SLICE).pull()
    for shard in ((0, 2), (1, 2)):
        assert (
            EpisodeSampler(_dataset(client_env, tmp_path / "c", limit, shard=shard)).window
            == expected
        )
    # Every sample exactly once per epoch, through a real loader.
    assert sorted(k.sample for k in sampler) == list(range(len(ds)))
    assert sum(len(b["t_ns"]) for b in DataLoader(ds, batch_size=16, sampler=sampler)) == len(ds)


class _Sized:
    """A dataset stand-in with a given footprint (the demo's 4 episodes only ever give 1)."""

    seed, epoch, shard, shard_auto, accepts_window = 0, 0, (0, 1), False, True

    def __init__(self, total: int, episodes: int, limit: int | None) -> None:
        self._fp = None if limit is None else CacheFootprint(total, episodes, limit)

    def cache_footprint(self) -> CacheFootprint | None:
        return self._fp

    def order_fingerprint(self) -> dict[str, object]:
        return {}

    def order_streams(
        self, world: int, epoch: int, shuffle: bool, window: int | None = None
    ) -> list[object]:
        return []

    def follow_order(self, shuffle: bool, window: int | None) -> None:
        pass


@pytest.mark.parametrize(
    ("total", "episodes", "limit", "local", "window"),
    [
        (1000, 100, None, "1", None),  # no limit
        (1000, 100, 1000, "1", None),  # fits
        (1000, 100, 250, "1", 12),  # a quarter of the data: half of it per window
        (1000, 100, 250, "4", 3),  # four local ranks share the node's cache
        (1000, 100, 10, "1", 1),  # at least one episode
    ],
)
def test_auto_window_size(
    total: int,
    episodes: int,
    limit: int | None,
    local: str,
    window: int | None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("LOCAL_WORLD_SIZE", local)
    choice = choose_window(_Sized(total, episodes, limit), "auto", True)
    assert choice.window == window and choice.auto


def test_saved_window_wins_and_old_states_resume(client_env: ServerProcess, tmp_path: Path) -> None:
    probe = _dataset(client_env, tmp_path / "probe", None)
    total, _, largest = _sizes(probe)
    small = _dataset(client_env, tmp_path / "c", max(total // 4, largest))
    auto = EpisodeSampler(small)
    assert auto.window is not None
    # A state saved before "auto" existed (window None, full shuffle) resumes as it was.
    old = EpisodeSampler(small, window=None)
    it = iter(old)
    first = [next(it) for _ in range(5)]
    state = old.state_dict()
    assert state["window"] is None
    resumed = EpisodeSampler(small)
    resumed.load_state_dict(state)
    assert resumed.window is None and resumed.describe()["window_reason"].startswith(
        "the window of"
    )
    rest = list(resumed)
    assert sorted(first + rest) == sorted(EpisodeSampler(small, window=None))
    # A saved window wins over the one recomputed under another limit.
    it = iter(auto)
    next(it)
    saved = auto.state_dict()
    roomy = EpisodeSampler(_dataset(client_env, tmp_path / "c", None))
    assert roomy.window is None
    roomy.load_state_dict(saved)
    assert roomy.window == auto.window
    # An explicit window still has to match.
    with pytest.raises(Exception, match="window"):
        EpisodeSampler(small, window=(auto.window or 1) + 1).load_state_dict(saved)


def test_full_shuffle_under_a_small_limit_warns_once_with_the_fix(
    client_env: ServerProcess, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    probe = _dataset(client_env, tmp_path / "probe", None)
    total, _, largest = _sizes(probe)
    ds = _dataset(client_env, tmp_path / "c", max(total // 2, largest))
    with caplog.at_level(logging.WARNING, logger="rayform.sampler"):
        EpisodeSampler(ds, window=None)
        EpisodeSampler(ds, window=None)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "window='auto'" in warnings[0] and "20x" in warnings[0]


def test_a_mixture_gets_a_full_shuffle_under_auto(
    client_env: ServerProcess, tmp_path: Path
) -> None:
    a = _dataset(client_env, tmp_path / "c", None)
    mix = MixtureDataset([(a, 1.0), (a, 1.0)])
    s = EpisodeSampler(mix)
    assert s.window is None and "not read by episode windows" in s.describe()["window_reason"]
