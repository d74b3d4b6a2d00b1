"""EpisodeDataset and spans labels: ``obs=[..., "label:events"]`` gives each sample the names of
the ranges holding its time, and ``within=`` keeps the grid times inside ranges of a name;
both pin the label set in the URI, rebuild with ``from_uri`` and work offline after a pull."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support import DEMO_SLICE, WRITE_TOKEN, ServerProcess
from torch.utils.data import DataLoader, default_collate

import rayform
from rayform.errors import InvalidArgumentError
from rayform.torch import EpisodeDataset, EpisodeSampler, MixtureDataset, collate
from rayform.torch.lerobot import LeRobotCollate

MS = 1_000_000
ACTION = "joints/position_delta"


def _label(slice_: rayform.Slice) -> dict[str, list[tuple[int, int, str]]]:
    """Ranges on episodes 1 and 3 (two overlap on 1; one starts before a grid time and ends
    exactly on one, to pin half-openness); episode 0 and the rest have none."""
    ranges = {}
    for e, spec in (
        (1, [(200, 700, "grasp_failed"), (500, 900, "slip")]),
        (3, [(100, 400, "grasp_failed")]),
    ):
        seg = slice_.segments[e]
        ranges[seg.id] = [(seg.start_ns + a * MS, seg.start_ns + b * MS, n) for a, b, n in spec]
    slice_.label_all({ep: {"events": r} for ep, r in ranges.items()})
    slice_.label(slice_.segments[2].id, success=True)
    return ranges


def _names_at(ranges: list[tuple[int, int, str]], t: int) -> list[str]:
    return [n for a, b, n in ranges if a <= t < b]


def _client(server: ServerProcess, cache: Path, **kw: Any) -> rayform.Client:
    return rayform.Client(endpoint=server.url, token=WRITE_TOKEN, cache_dir=cache, **kw)


def test_label_names_in_every_sample_through_workers(
    write_server: ServerProcess, tmp_path: Path
) -> None:
    slice_ = _client(write_server, tmp_path / "c").slices.get(DEMO_SLICE)
    ranges = _label(slice_)
    ds = EpisodeDataset(
        slice_, obs=["joints/position", "label:events"], action=ACTION, fps=15, obs_steps=2
    )
    assert ds.sample_spec()["label:events"] == ("events", (2,))
    assert f"labels={slice_.labels.hash}" in ds.uri and "obs=joints/position,label:events" in ds.uri
    loader = DataLoader(
        ds,
        batch_size=16,
        num_workers=2,
        collate_fn=collate,
        sampler=EpisodeSampler(ds, shuffle=True),
    )
    seen = hits = 0
    for batch in loader:
        for i, episode in enumerate(batch["meta"]["segment"]):
            t = int(batch["t_ns"][i])
            prev = t - round(1e9 / 15)
            own = ranges.get(episode, [])
            got = [batch["label:events"][0][i], batch["label:events"][1][i]]
            pad = batch["label:events_is_pad"][i].tolist()
            # the history step before the episode's grid start repeats step 0, as a state does
            assert got[1] == _names_at(own, t)
            if not pad[0]:
                assert got[0] == _names_at(own, prev)
            hits += bool(got[1])
            seen += 1
    assert seen == len(ds) and hits > 10
    one = EpisodeDataset(slice_, obs={"events": "label:events"}, action=ACTION, fps=15)
    start = ds.segment_lengths[slice_.segments[0].id]
    batch = default_collate([one[start + k] for k in range(4, 12)])
    assert isinstance(batch["events"], list) and all(isinstance(v, list) for v in batch["events"])
    assert ["grasp_failed", "slip"] in batch["events"]
    # LeRobot's collate keeps the names as lists too
    policy = EpisodeDataset(
        slice_,
        obs={"observation.state": "joints/position", "events": "label:events"},
        action={"action": ACTION},
        fps=15,
    )
    lerobot = LeRobotCollate(policy)([policy[start + k] for k in range(4, 12)])
    assert lerobot["events"] == batch["events"]


def test_within_keeps_exactly_the_times_inside_and_is_pinned(
    write_server: ServerProcess, tmp_path: Path
) -> None:
    client = _client(write_server, tmp_path / "c")
    slice_ = client.slices.get(DEMO_SLICE)
    ranges = _label(slice_)
    whole = EpisodeDataset(slice_, obs=["joints/position"], action=ACTION, fps=15, horizon=4)
    ds = EpisodeDataset(
        slice_,
        obs=["joints/position"],
        action=ACTION,
        fps=15,
        horizon=4,
        within="events:grasp_failed",
    )
    assert "within=events:grasp_failed" in ds.uri and f"labels={slice_.labels.hash}" in ds.uri
    want = [
        (i, int(s["t_ns"]))
        for i in range(len(whole))
        for s in [whole[i]]
        if _names_at(ranges.get(s["meta"]["segment"], []), int(s["t_ns"])).count("grasp_failed")
    ]
    got = [int(ds[i]["t_ns"]) for i in range(len(ds))]
    assert got == [t for _, t in want] and len(got) > 5
    # a sample inside a range is the same sample (action chunk, padding) as without within=
    first = ds[0]
    same = whole[want[0][0]]
    assert np.array_equal(first["action"].numpy(), same["action"].numpy())
    assert set(ds.segment_lengths.values()) - {0} and sum(ds.segment_lengths.values()) == len(ds)
    assert ds.stats() == whole.stats()  # statistics of the episodes' whole grids
    any_range = EpisodeDataset(
        slice_, obs=["joints/position"], action=ACTION, fps=15, within="events"
    )
    assert len(any_range) > len(ds)
    # DDP: disjoint and complete shards, by episode
    parts = [
        [k.sample for k in EpisodeSampler(EpisodeDataset(slice_, obs=["joints/position"], action=ACTION, fps=15,
                                           within="events:grasp_failed", shard=(r, 2)))]
        for r in range(2)
    ]  # fmt: skip
    assert sorted(parts[0] + parts[1]) == list(range(len(ds))) and not set(parts[0]) & set(parts[1])
    # the labels change: the URI still rebuilds the ranges it pinned
    uri = ds.uri
    ep = slice_.segments[1]
    slice_.label(ep.id, events=[(ep.start_ns, ep.start_ns + 1500 * MS, "grasp_failed")])
    assert len(EpisodeDataset(slice_, obs=["joints/position"], action=ACTION, fps=15,
                              within="events:grasp_failed")) > len(ds)  # fmt: skip
    again = EpisodeDataset.from_uri(uri, client=client)
    assert again.uri == uri and [int(again[i]["t_ns"]) for i in range(len(again))] == got
    # offline after a pull: the pinned version is the one the pull cached
    cache = tmp_path / "pulled"
    online = _client(write_server, cache)
    online.slices.get(DEMO_SLICE).pull()
    latest = EpisodeDataset(online.slices.get(DEMO_SLICE), obs=["joints/position", "label:events"],
                            action=ACTION, fps=15, within="events:grasp_failed")  # fmt: skip
    offline = rayform.Client(cache_dir=cache, offline=True)
    back = EpisodeDataset.from_uri(latest.uri, client=offline)
    assert back.uri.partition("/slc_")[2] == latest.uri.partition("/slc_")[2]  # no host offline
    assert len(back) == len(latest)
    assert [s["label:events"] for s in back.__getitems__(list(range(len(back))))] == [
        s["label:events"] for s in latest.__getitems__(list(range(len(latest))))
    ]


def test_bad_label_keys_are_clear_errors(write_server: ServerProcess, tmp_path: Path) -> None:
    slice_ = _client(write_server, tmp_path / "c").slices.get(DEMO_SLICE)
    _label(slice_)
    kw: dict[str, Any] = dict(action=ACTION, fps=15)
    with pytest.raises(
        InvalidArgumentError, match=r"'evnts' is not a label .* spans labels: events"
    ):
        EpisodeDataset(slice_, obs=["joints/position", "label:evnts"], **kw)
    with pytest.raises(
        InvalidArgumentError, match=r"'success' holds bool values.*spans labels: events"
    ):
        EpisodeDataset(slice_, obs=["joints/position"], within="success", **kw)
    with pytest.raises(InvalidArgumentError, match=r"keeps no sample.*'grasp_failed', 'slip'"):
        EpisodeDataset(slice_, obs=["joints/position"], within="events:dropped", **kw)
    with pytest.raises(InvalidArgumentError, match="labels= is the label set"):
        EpisodeDataset(slice_, obs=["joints/position"], labels=slice_.labels, **kw)
    with pytest.raises(InvalidArgumentError, match="all text streams or labels"):
        EpisodeDataset(slice_, obs=["label:events"], action=None, fps=15)


def test_a_dataset_without_labels_reads_none(
    write_server: ServerProcess, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cost guard: without label observations or within=, no label set is read and no
    span code runs, when the dataset is built or read."""
    slice_ = _client(write_server, tmp_path / "c").slices.get(DEMO_SLICE)
    _label(slice_)
    import rayform.torch._spans as spans

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("the spans path ran for a dataset without labels")

    monkeypatch.setattr(rayform.Slice, "labels", property(refuse))
    monkeypatch.setattr(spans.SpanTable, "names_at", refuse)
    ds = EpisodeDataset(slice_, obs=["joints/position"], action=ACTION, fps=15)
    assert "labels=" not in ds.uri and "v=1&" in ds.uri
    assert len(ds.__getitems__(list(range(32)))) == 32


def test_a_mixture_reads_labels_and_rebuilds(write_server: ServerProcess, tmp_path: Path) -> None:
    client = _client(write_server, tmp_path / "c")
    slice_ = client.slices.get(DEMO_SLICE)
    ranges = _label(slice_)
    labelled = EpisodeDataset(
        slice_, obs={"state": "joints/position", "events": "label:events"}, action=ACTION, fps=15
    )
    plain = EpisodeDataset(slice_, obs={"state": "joints/position"}, action=ACTION, fps=15)
    mix = MixtureDataset([(labelled, 1.0), (plain, 1.0)], num_samples=64, layout="union")
    loader = DataLoader(mix, batch_size=64, sampler=EpisodeSampler(mix), collate_fn=collate)
    batch = next(iter(loader))
    for i, missing in enumerate(batch["events_is_missing"].tolist()):
        own = ranges.get(batch["meta"]["segment"][i], [])
        want = [] if missing else _names_at(own, int(batch["t_ns"][i]))
        assert batch["events"][i] == want
    assert any(batch["events"]) and any(batch["events_is_missing"].tolist())
    again = MixtureDataset.from_uri(mix.uri, client=client)
    assert again.uri == mix.uri and f"labels%3D{slice_.labels.hash}" in mix.uri
