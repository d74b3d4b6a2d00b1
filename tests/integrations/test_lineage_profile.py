"""The profile trackers log (episodes, hours, sites) of a v2 slice comes from its columns:
a 20,000-episode slice profiles without building one Segment per episode."""

from __future__ import annotations

import time
from typing import Any

import pytest
from support import DEMO_SLICE
from support.fakes import StoreBlobs

import rayform.manifest._segments as segtable
from rayform.integrations._common import dataset_profile
from rayform.integrations.mlflow import from_episode_dataset
from rayform.slice import Slice
from rayform.torch import EpisodeDataset
from rayform_server._fleet import build_shared_demo
from rayform_server.store import Store

EPISODES = 20_000


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Slice:
    """A v2 slice of 20,000 episodes sharing the demo's blobs (as `demo --share-blobs`)."""
    root = tmp_path_factory.mktemp("fleet") / "root"
    digest = build_shared_demo(root, DEMO_SLICE, EPISODES, small=True, seed=0)
    return Slice(DEMO_SLICE, digest, Store(root).load_manifest(digest), StoreBlobs(None))


def test_profile_of_a_big_v2_slice_reads_columns_not_segments(
    fleet: Slice, monkeypatch: pytest.MonkeyPatch
):
    made = []
    real = segtable.segment_of_row

    def counting(row: dict[str, Any]) -> Any:
        made.append(row["id"])
        return real(row)

    monkeypatch.setattr(segtable, "segment_of_row", counting)
    assert isinstance(fleet.segments, segtable.Segments)  # (a v2 manifest)
    ds = EpisodeDataset(
        fleet, obs=["cam0/rgb", "joints/position"], action="joints/position_delta", fps=15
    )
    made.clear()
    t0 = time.perf_counter()
    profile = dataset_profile(ds)
    seconds = time.perf_counter() - t0
    assert made == [] and seconds < 0.5
    summary = fleet.manifest.summary
    assert profile["segments"] == EPISODES and sum(profile["sites"].values()) == EPISODES
    assert sorted(profile["sites"]) == summary["sites"]
    assert profile["hours"] == round(summary["duration_ns"] / 1e9 / 3600, 6)
    assert profile["samples"] == len(ds)

    # The whole MLflow dataset (schema, digest, URI) builds at most the first episode.
    logged = from_episode_dataset(ds)
    assert len(made) <= 1 and logged.profile == profile


def test_profile_of_a_view_counts_only_its_episodes(fleet: Slice, monkeypatch: pytest.MonkeyPatch):
    site = fleet.manifest.summary["sites"][0]
    view = fleet.select(sites=[site])
    ds = EpisodeDataset(view, obs=["joints/position"], action="joints/position_delta", fps=15)
    made: list[Any] = []
    monkeypatch.setattr(
        segtable,
        "segment_of_row",
        lambda row: made.append(row) or pytest.fail("a Segment was built"),
    )
    profile = dataset_profile(ds)
    assert list(profile["sites"]) == [site] and profile["segments"] == len(view.segments) < EPISODES
    assert ds.uri.endswith(f"&select=sites:{site}") and made == []
