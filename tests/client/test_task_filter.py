"""Filters on the ``task`` text stream: ``select(where="task == ...")`` over a real server,
any-record semantics for an episode with several tasks, the error without a task stream, the
filter pinned in a dataset URI and rebuilt by ``from_uri``, and published by the server."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from support import DEMO_SLICE, TOKEN, WRITE_TOKEN, ServerProcess

import rayform
from rayform import InvalidArgumentError
from rayform.uri import DatasetURI
from rayform_server.builder import SliceBuilder, TableData, TextData
from rayform_server.store import Store

SLICE = "slc_7e470a01"
MS = 1_000_000
#: Each episode's task records, in time order (``None``: no task stream at all).
TASKS: list[list[str] | None] = [
    ["pick the cube", "place it"],
    ["pick the cube"],
    ["wipe"],
    ["wipe"],
    None,
    ["place it", "pick the cube"],
]


@pytest.fixture(scope="module")
def task_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("task-root")
    b = SliceBuilder(Store(root))
    for e, tasks in enumerate(TASKS):
        t0 = 10**12 * (e + 1)
        t = t0 + np.arange(0, 2000, 20, dtype=np.int64) * MS
        streams: list[TableData | TextData] = [
            TableData("joints/position", t, np.full((100, 2), e, np.float32), 50),
            TableData("joints/position_delta", t, np.zeros((100, 2), np.float32), 50),
        ]
        if tasks is not None:
            times = t0 + np.arange(len(tasks), dtype=np.int64) * 1000 * MS
            streams.append(TextData("task", times, [{"content": x} for x in tasks], 10))
        b.add_segment(f"seg_{e:08x}", site="lab", streams=streams)
    b.commit(SLICE)
    server = ServerProcess(root, "--write-token", WRITE_TOKEN)
    yield server
    server.stop()


def _slice(server: ServerProcess, cache: Path, token: str = TOKEN) -> rayform.Slice:
    return rayform.Client(endpoint=server.url, token=token, cache_dir=cache).slices.get(SLICE)


def _kept(view: rayform.Slice) -> list[int]:
    return [int(str(i)[4:], 16) for i in view.segments.ids().to_pylist()]


def _expected(keep: object) -> list[int]:
    return [e for e, tasks in enumerate(TASKS) if tasks is not None and keep(set(tasks))]  # type: ignore[operator]


def test_task_is_true_when_any_record_matches(task_server: ServerProcess, tmp_path: Path) -> None:
    slice_ = _slice(task_server, tmp_path / "c")
    assert _kept(slice_.select(where="task == 'pick the cube'")) == [0, 1, 5]
    assert _kept(slice_.select(where="task == 'place it'")) == [0, 5]
    assert _kept(slice_.select(where="task in ['wipe', 'place it']")) == [0, 2, 3, 5]
    # != and not in: episodes with a task stream and no such record; episode 4 has none.
    assert _kept(slice_.select(where="task != 'pick the cube'")) == _expected(
        lambda s: "pick the cube" not in s
    )
    assert _kept(slice_.select(where="task not in ['wipe', 'place it']")) == [1]
    assert _kept(slice_.select(where="not task == 'wipe'")) == [0, 1, 4, 5]
    assert _kept(slice_.select(where="task == 'wipe' and id != 'seg_00000002'")) == [3]
    # A selection of a selection reads only the blobs its episodes hold, with the same rule.
    within = slice_.select(segments=["seg_00000002", "seg_00000005"])
    assert _kept(within.select(where="task == 'place it'")) == [5]
    with pytest.raises(InvalidArgumentError, match="keeps no segment|no segment"):
        slice_.select(where="task == 'fly'")


def test_task_comparisons_are_checked(task_server: ServerProcess, tmp_path: Path) -> None:
    slice_ = _slice(task_server, tmp_path / "c")
    with pytest.raises(InvalidArgumentError, match="holds strings: use ==, !=, in or not in"):
        slice_.select(where="task > 'a'")
    with pytest.raises(InvalidArgumentError, match="holds category values, not 3"):
        slice_.select(where="task == 3")


def test_a_slice_without_a_task_stream_is_a_clear_error(
    client_env: ServerProcess, tmp_path: Path
) -> None:
    slice_ = rayform.Client(cache_dir=tmp_path / "c").slices.get(DEMO_SLICE)
    with pytest.raises(InvalidArgumentError) as info:
        slice_.select(where="task == 'pick the cube'")
    message = str(info.value)
    assert "'task' reads the episodes' 'task' text stream" in message
    assert "their text streams: none" in message and "docs/language.md" in message


def test_a_task_filter_is_pinned_in_the_uri_and_rebuilt(
    task_server: ServerProcess, tmp_path: Path
) -> None:
    from rayform.torch import EpisodeDataset

    view = _slice(task_server, tmp_path / "a").select(where="task in ['place it']")
    ds = EpisodeDataset(view, obs=["joints/position", "task"], action=None, fps=10, shard=None)
    uri = DatasetURI.parse(str(ds.uri))
    assert uri.selection() == {"where": "task in ['place it']"}
    # Another process's client, another cache: the same episodes, the same samples.
    other = rayform.Client(endpoint=task_server.url, token=TOKEN, cache_dir=tmp_path / "b")
    again = EpisodeDataset.from_uri(str(ds.uri), client=other)
    assert str(again.uri) == str(ds.uri)
    assert [str(s.id) for s in again.spec.slice.segments] == ["seg_00000000", "seg_00000005"]
    assert [again[i]["task"] for i in (0, 10, 20, 30)] == [
        "pick the cube",
        "place it",
        "place it",
        "pick the cube",
    ]


def test_the_server_publishes_what_the_task_filter_keeps(
    task_server: ServerProcess, tmp_path: Path
) -> None:
    slice_ = _slice(task_server, tmp_path / "c", token=WRITE_TOKEN)
    view = slice_.select(where="task == 'wipe'")
    child = slice_.client.slices.create(view)  # type: ignore[attr-defined]
    assert _kept(child) == [2, 3]
    assert child.tasks() == [("wipe", 2)]
