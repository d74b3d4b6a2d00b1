"""EpisodeDataset and text streams: a state's string and a step's events in every sample."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from support.fakes import store_slice
from torch.utils.data import DataLoader, default_collate

import rayform
from rayform.errors import InvalidArgumentError, NotFoundError
from rayform.torch import EpisodeDataset, EpisodeSampler
from rayform_server.builder import SliceBuilder, TableData, TextData
from rayform_server.store import Store

SLICE = "slc_7e470002"
MS = 1_000_000
FPS = 10  # a grid step every 100 ms


def _build(root: Path) -> rayform.Slice:
    """Two 2 s episodes: joints at 50 Hz from t0, a task that switches at exactly 1.0 s, a
    subtask that starts at 0.25 s, and events at 0.35 s, 1.0 s (two), 1.05 s. The second
    episode has no events and one task."""
    store = Store(root)
    b = SliceBuilder(store)
    for e in range(2):
        t0 = 10**12 * (e + 1)
        joints = t0 + np.arange(0, 2000, 20, dtype=np.int64) * MS
        streams: list[TableData | TextData] = [
            TableData("joints/position", joints, np.arange(100, dtype=np.float32)[:, None], 50),
        ]
        if e == 0:
            streams += [
                TextData("task", t0 + np.array([0, 1000]) * MS,
                         [{"content": "pick the cube"}, {"content": "place it"}], FPS),
                TextData("language/subtask", t0 + np.array([250]) * MS, [{"content": "reach"}], FPS),
                TextData(
                    "language/vqa",
                    t0 + np.array([350, 1000, 1000, 1050]) * MS,
                    [{"content": "q1"}, {"content": "q2", "role": "user"},
                     {"content": "a2", "role": "assistant"}, {"content": "q3"}],
                    FPS,
                    timing="events",
                ),
            ]  # fmt: skip
        else:
            streams += [
                TextData("task", np.array([t0]), [{"content": "wipe"}], FPS),
                TextData("language/subtask", np.array([t0]), [{"content": "wipe"}], FPS),
            ]
        b.add_segment(f"seg_{e:08x}", site="lab", streams=streams)
    m = b.commit(SLICE)
    return store_slice(SLICE, m, store)


@pytest.fixture(scope="module")
def slice_(tmp_path_factory: pytest.TempPathFactory) -> rayform.Slice:
    return _build(tmp_path_factory.mktemp("text"))


def _ds(slice_: rayform.Slice, **kw: object) -> EpisodeDataset:
    kw.setdefault("obs", ["joints/position", "task", "language/subtask", "language/vqa"])
    return EpisodeDataset(slice_, action=None, fps=FPS, shard=None, **kw)  # type: ignore[arg-type]


def test_state_is_the_latest_record_at_or_before_t(slice_: rayform.Slice) -> None:
    ds = _ds(slice_)
    assert len(ds) == 20 + 20  # text streams do not shorten the grid
    tasks = [ds[i]["task"] for i in range(20)]
    assert tasks == ["pick the cube"] * 10 + ["place it"] * 10  # switch at exactly 1.0 s
    subtasks = [ds[i]["language/subtask"] for i in range(4)]
    assert subtasks == ["", "", "", "reach"]  # nothing before 0.25 s, never a later record
    assert ds[25]["task"] == "wipe" and isinstance(ds[25]["task"], str)


def test_each_event_is_in_exactly_one_grid_step(slice_: rayform.Slice) -> None:
    ds = _ds(slice_)
    steps = [[r["content"] for r in ds[i]["language/vqa"]] for i in range(20)]
    # (t - 100 ms, t]: 0.35 s -> step 0.4 s; 1.0 s -> step 1.0 s; 1.05 s -> step 1.1 s.
    assert steps[4] == ["q1"] and steps[10] == ["q2", "a2"] and steps[11] == ["q3"]
    assert sum(len(x) for x in steps) == 4  # none twice, none lost
    assert steps[3] == steps[5] == steps[9] == []
    record = ds[10]["language/vqa"][0]
    assert record == {
        "content": "q2",
        "role": "user",
        "style": None,
        "camera": None,
        "tool_calls": None,
    }
    # The second episode has no vqa stream: every step has no events.
    assert all(ds[i]["language/vqa"] == [] for i in range(20, 40))


def test_history_and_collate(slice_: rayform.Slice) -> None:
    ds = _ds(slice_, obs_steps=3)
    sample = ds[1]
    assert sample["task"] == ["pick the cube"] * 3
    assert [len(x) for x in sample["language/vqa"]] == [0, 0, 0]
    assert sample["task_is_pad"].tolist() == [True, False, False]
    s11 = ds[11]
    assert [[r["content"] for r in x] for x in s11["language/vqa"]] == [[], ["q2", "a2"], ["q3"]]
    assert s11["task"] == ["pick the cube", "place it", "place it"]
    batch = default_collate([ds[10], ds[11]])
    assert list(batch["task"][2]) == ["place it", "place it"]  # default_collate: step, sample
    one = _ds(slice_)
    batch = default_collate([one[i] for i in (4, 10, 12)])
    assert batch["task"] == ["pick the cube", "place it", "place it"]
    assert [[r["content"] for r in x] for x in batch["language/vqa"]] == [["q1"], ["q2", "a2"], []]
    assert batch["joints/position"].shape == (3, 1)


def test_dataloader_workers_and_rayform_collate(slice_: rayform.Slice) -> None:
    ds = _ds(slice_, obs={"state": "joints/position", "instruction": "task", "vqa": "language/vqa"})
    loader = DataLoader(
        ds,
        batch_size=8,
        num_workers=2,
        sampler=EpisodeSampler(ds, shuffle=True),
        collate_fn=rayform.torch.collate,
    )
    seen: dict[int, str] = {}
    events = 0
    for batch in loader:
        assert isinstance(batch["instruction"], list) and len(batch["instruction"]) == len(
            batch["t_ns"]
        )
        for t, text, vqa in zip(
            batch["t_ns"].tolist(), batch["instruction"], batch["vqa"], strict=True
        ):
            seen[t] = text
            events += len(vqa)
        assert batch["state"].dtype == torch.float32
    assert len(seen) == 40 and events == 4
    assert seen[10**12 + 1000 * MS] == "place it" and seen[10**12 + 900 * MS] == "pick the cube"


def test_stats_skip_text_and_errors_name_what_the_slice_has(slice_: rayform.Slice) -> None:
    stats = _ds(slice_).stats()
    assert set(stats) == {"joints/position"}
    with pytest.raises(NotFoundError, match="'language/plan' is not in slice.*language/vqa"):
        _ds(slice_, obs=["joints/position", "language/plan"])
    with pytest.raises(InvalidArgumentError, match="'task' is a text stream: the action must"):
        EpisodeDataset(slice_, obs=["joints/position"], action="task", fps=FPS, shard=None)
    with pytest.raises(InvalidArgumentError, match="all text streams"):
        _ds(slice_, obs=["task"])
    spec = _ds(slice_).sample_spec()
    assert spec["task"] == ("str", ()) and spec["language/vqa"] == ("events", ())


def test_a_mixture_source_without_the_stream_gives_no_text(
    slice_: rayform.Slice, tmp_path: Path
) -> None:
    from rayform.torch import MixtureDataset

    store = Store(tmp_path / "plain")
    b = SliceBuilder(store)
    t = 10**12 + np.arange(0, 2000, 20, dtype=np.int64) * MS
    b.add_segment(
        "seg_000000aa", site="lab", streams=[TableData("joints/position", t, np.ones((100, 2)), 50)]
    )
    plain = store_slice("slc_7e470003", b.commit("slc_7e470003"), store)
    a = _ds(slice_, obs={"state": "joints/position", "task": "task", "vqa": "language/vqa"})
    c = EpisodeDataset(plain, obs={"state": "joints/position"}, action=None, fps=FPS, shard=None)
    mix = MixtureDataset([(a, 1.0), (c, 1.0)], layout="union")
    assert mix.sample_spec()["task"] == ("str", ()) and mix.sample_spec()["task_is_missing"] == (
        "bool",
        (),
    )
    samples = [mix[k] for k in EpisodeSampler(mix)]
    mine = [s for s in samples if s["meta"]["slice"] == "slc_7e470003"]
    theirs = [s for s in samples if s["meta"]["slice"] == SLICE]
    assert mine and theirs
    assert all(s["task"] == "" and s["vqa"] == [] and bool(s["task_is_missing"]) for s in mine)
    assert all(not s["task_is_missing"] and s["task"] for s in theirs)
    batch = default_collate(samples[:8])
    assert len(batch["task"]) == 8 and batch["task_is_missing"].dtype == torch.bool


def test_uri_rebuilds_text_samples_and_trackers_record_text_keys(slice_: rayform.Slice) -> None:
    ds = _ds(slice_, obs={"state": "joints/position", "task": "task", "vqa": "language/vqa"})
    assert "task" in ds.uri
    pytest.importorskip("mlflow")
    from rayform.integrations.mlflow import from_episode_dataset

    schema = from_episode_dataset(ds).schema.features.to_dict()
    by_name = {c["name"]: c["tensor-spec"]["dtype"] for c in schema}
    assert by_name["task"] == "object" and by_name["vqa"] == "object"
    assert by_name["state"] == "float32"


def _bytes_tokenizer(texts: list[str]) -> dict[str, torch.Tensor]:
    ids = torch.zeros(len(texts), 16, dtype=torch.long)
    for i, text in enumerate(texts):
        raw = torch.tensor(list(text.encode()[:16]), dtype=torch.long)
        ids[i, : len(raw)] = raw
    return {"input_ids": ids, "attention_mask": ids != 0}


def _decoded(ids: torch.Tensor) -> str:
    return bytes(ids[ids != 0].tolist()).decode()


def test_tokenizer_runs_in_the_workers_on_state_keys(slice_: rayform.Slice) -> None:
    ds = _ds(
        slice_, obs={"state": "joints/position", "task": "task", "vqa": "language/vqa"},
        tokenizer=_bytes_tokenizer,
    )  # fmt: skip
    sample = ds[12]
    assert sample["task"] == "place it" and _decoded(sample["task_input_ids"]) == "place it"
    assert sample["task_attention_mask"].shape == (16,) and "vqa_input_ids" not in sample
    loader = DataLoader(
        ds,
        batch_size=8,
        num_workers=2,
        sampler=EpisodeSampler(ds),
        collate_fn=rayform.torch.collate,
    )
    for batch in loader:
        assert batch["task_input_ids"].shape == (len(batch["task"]), 16)
        assert [_decoded(x) for x in batch["task_input_ids"]] == batch["task"]
    hist = _ds(slice_, obs=["joints/position", "task"], obs_steps=2, tokenizer=_bytes_tokenizer)
    assert hist[10]["task_input_ids"].shape == (2, 16)
    assert [_decoded(x) for x in hist[10]["task_input_ids"]] == ["pick the cube", "place it"]


def test_the_tokenizer_sees_each_distinct_string_of_a_batch_once(slice_: rayform.Slice) -> None:
    calls: list[list[str]] = []

    def counting(texts: list[str]) -> dict[str, torch.Tensor]:
        calls.append(list(texts))
        return _bytes_tokenizer(texts)

    ds = _ds(slice_, obs={"state": "joints/position", "task": "task"}, tokenizer=counting)
    keys = list(range(len(ds)))
    batch = ds.__getitems__(keys)
    tasks = [s["task"] for s in batch]
    assert len(set(tasks)) < len(tasks)  # the slice repeats its tasks
    assert calls == [list(dict.fromkeys(tasks))]
    # Every sample's tokens are its own string's, as a call on all of them gives.
    whole = _bytes_tokenizer(tasks)
    assert all(
        torch.equal(s["task_input_ids"], row)
        for s, row in zip(batch, whole["input_ids"], strict=True)
    )


def test_tokenizer_errors_say_what_is_expected(slice_: rayform.Slice) -> None:
    with pytest.raises(InvalidArgumentError, match="events are not tokenized"):
        _ds(slice_, obs=["joints/position", "language/vqa"], tokenizer=_bytes_tokenizer)
    with pytest.raises(InvalidArgumentError, match="tokenizer must be callable"):
        _ds(slice_, tokenizer="bert")
    bad = _ds(slice_, tokenizer=lambda texts: {"ids": [1] * len(texts)})
    with pytest.raises(InvalidArgumentError, match="return_tensors='pt'"):
        bad[0]
