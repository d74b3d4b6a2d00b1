"""LeRobot's policies get ``task``: ``LeRobotCollate`` keeps ``batch["task"]`` a list of
strings (what LeRobot's processors read), and tokens, from a tokenizer trained here with the
``tokenizers`` package, run in the collate or in the dataset, land under the keys LeRobot's
tokenizer step writes, equal to tokenizing the ingested LeRobot dataset's own tasks."""

from __future__ import annotations

import pickle

import pytest
import torch
from support.fakes import store_slice
from support.recordings import write_lerobot_v21
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import Whitespace
from tokenizers.trainers import WordLevelTrainer
from torch.utils.data import DataLoader

import rayform
from rayform.errors import InvalidArgumentError
from rayform.torch import EpisodeDataset
from rayform.torch.lerobot import LANGUAGE_KEYS, LeRobotCollate, policy_features
from rayform_server.ingest import ingest_lerobot
from rayform_server.store import Store

TASKS = ["pick up the cube", "put it in the bin", "push the cube left"]
EPISODES, FRAMES, FPS, LENGTH = 3, 12, 10, 8
OBS = {"observation.state": "observation/state", "task": "task", "subtask": "language/subtask"}


class WordTokenizer:
    """A Hugging Face ``tokenizers`` WordLevel tokenizer as the callable Rayform takes: a list
    of N strings -> ``input_ids (N, LENGTH) int64`` and ``attention_mask (N, LENGTH)``,
    padded (and truncated) to a fixed length. Picklable, for spawned workers."""

    def __init__(self, corpus: list[str]) -> None:
        tok = Tokenizer(WordLevel(unk_token="[UNK]"))
        tok.pre_tokenizer = Whitespace()
        tok.train_from_iterator(corpus, WordLevelTrainer(special_tokens=["[PAD]", "[UNK]"]))
        tok.enable_padding(pad_id=0, pad_token="[PAD]", length=LENGTH)
        tok.enable_truncation(LENGTH)
        self.tok = tok

    def __call__(self, texts: list[str]) -> dict[str, torch.Tensor]:
        enc = self.tok.encode_batch(texts)
        return {
            "input_ids": torch.tensor([e.ids for e in enc], dtype=torch.long),
            "attention_mask": torch.tensor([e.attention_mask for e in enc], dtype=torch.long),
        }


@pytest.fixture(scope="module")
def ingested(tmp_path_factory: pytest.TempPathFactory) -> tuple[rayform.Slice, list[str]]:
    """A LeRobot v2.1 dataset ingested, and the task of every frame in LeRobot's own data."""
    work = tmp_path_factory.mktemp("lerobot-task")
    truth = write_lerobot_v21(
        work / "ds", episodes=EPISODES, n=FRAMES, fps=FPS, action=True, tasks=TASKS, language=True
    )
    store = Store(work / "root")
    m = ingest_lerobot(store, work / "ds", "slc_7e470a02")
    assert m is not None
    frames = [TASKS[k] for per_episode in truth["tasks"] for k in per_episode]
    return store_slice("slc_7e470a02", m, store), frames


@pytest.fixture(scope="module")
def tokenizer() -> WordTokenizer:
    return WordTokenizer(TASKS + [f"reach {e}" for e in range(EPISODES)] + ["grasp"])


def _dataset(slice_: rayform.Slice, **kw: object) -> EpisodeDataset:
    return EpisodeDataset(
        slice_, obs=OBS, action={"action": "action"}, fps=FPS, horizon=2, shard=None, **kw
    )  # type: ignore[arg-type]


def _batches(ds: EpisodeDataset, collate: LeRobotCollate) -> list[dict]:
    loader = DataLoader(ds, batch_size=5, num_workers=2, collate_fn=collate)
    return list(loader)


def test_the_batch_carries_task_as_lerobot_collates_it(
    ingested: tuple[rayform.Slice, list[str]],
) -> None:
    slice_, frames = ingested
    ds = _dataset(slice_)
    assert len(ds) == len(frames) == EPISODES * FRAMES  # one sample per LeRobot frame
    batches = _batches(ds, LeRobotCollate(ds))
    tasks = [t for b in batches for t in b["task"]]
    assert all(isinstance(b["task"], list) for b in batches)
    assert tasks == frames
    subtasks = [t for b in batches for t in b["subtask"]]
    half = FRAMES // 2  # each episode's subtask "reach <e>" from 0 s, "grasp" from its middle
    assert subtasks == [
        s for e in range(EPISODES) for s in [f"reach {e}"] * half + ["grasp"] * half
    ]
    assert "meta" not in batches[0] and LANGUAGE_KEYS["task"][0] not in batches[0]
    # Text is no policy feature: LeRobot's processors read it from the batch, not the config.
    inputs, _ = policy_features(ds)
    assert set(inputs) == {"observation.state"}


def test_tokens_from_the_collate_equal_the_ground_truth_tokens(
    ingested: tuple[rayform.Slice, list[str]], tokenizer: WordTokenizer
) -> None:
    slice_, frames = ingested
    ds = _dataset(slice_)
    collate = pickle.loads(pickle.dumps(LeRobotCollate(ds, tokenizer=tokenizer)))
    batches = _batches(ds, collate)
    tokens_key, mask_key = LANGUAGE_KEYS["task"]
    ids = torch.cat([b[tokens_key] for b in batches])
    mask = torch.cat([b[mask_key] for b in batches])
    expected = tokenizer(frames)
    assert ids.shape == (len(frames), LENGTH) and mask.dtype == torch.bool
    assert torch.equal(ids, expected["input_ids"])
    assert torch.equal(mask, expected["attention_mask"].bool())
    assert len(set(map(tuple, ids.tolist()))) == len(TASKS)  # three tasks, three rows of ids
    sub_ids = torch.cat([b[LANGUAGE_KEYS["subtask"][0]] for b in batches])
    assert torch.equal(sub_ids[: FRAMES // 2], tokenizer(["reach 0"] * (FRAMES // 2))["input_ids"])


def test_tokens_from_the_dataset_workers_take_lerobots_keys(
    ingested: tuple[rayform.Slice, list[str]], tokenizer: WordTokenizer
) -> None:
    slice_, frames = ingested
    ds = _dataset(slice_, tokenizer=tokenizer)
    batches = _batches(ds, LeRobotCollate(ds))
    tokens_key, mask_key = LANGUAGE_KEYS["task"]
    ids = torch.cat([b[tokens_key] for b in batches])
    assert torch.equal(ids, tokenizer(frames)["input_ids"])
    assert torch.equal(ids, torch.cat([b["task_input_ids"] for b in batches]))  # kept too
    assert all(b[mask_key].dtype == torch.bool for b in batches)
    assert [t for b in batches for t in b["task"]] == frames  # the strings stay


def test_a_collate_tokenizer_needs_a_task_key(
    ingested: tuple[rayform.Slice, list[str]], tokenizer: WordTokenizer
) -> None:
    slice_, _ = ingested
    ds = EpisodeDataset(
        slice_, obs={"observation.state": "observation/state"}, action=None, fps=FPS, shard=None
    )
    with pytest.raises(InvalidArgumentError, match="tokenizes the sample keys 'task'"):
        LeRobotCollate(ds, tokenizer=tokenizer)
    with pytest.raises(InvalidArgumentError, match="pass a callable"):
        LeRobotCollate(_dataset(slice_), tokenizer="bert")  # type: ignore[arg-type]


def test_the_ingested_tasks_are_lerobots(ingested: tuple[rayform.Slice, list[str]]) -> None:
    slice_, frames = ingested
    assert sorted(t for t, _ in slice_.tasks()) == sorted(set(frames))
