"""`rayform-server ingest lerobot`: tasks and language columns become text streams."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from support.fakes import store_slice
from support.recordings import write_lerobot_v21

from rayform.errors import InvalidArgumentError
from rayform.format import decode_text
from rayform.manifest import Segment
from rayform_server.ingest import Progress, add_parser, ingest_lerobot
from rayform_server.store import Store

QUIET = Progress(None)
TASKS = ["pick up the cube", "push the cube left", "open the drawer"]
N, FPS = 12, 10


def _text(store: Store, seg: Segment, name: str) -> tuple[list[int], list[dict]]:
    st = seg.streams[name]
    t_ns, records = decode_text(store.blob_path(st.blob.hash).read_bytes(), st.t0_ns)
    assert (len(records), int(t_ns[-1])) == (st.count, st.t1_ns)
    return t_ns.tolist(), records


def _frame_ns(k: int) -> int:
    return int(np.rint(k * (1e9 / FPS)))


def test_v21_tasks_and_language_columns(tmp_path: Path) -> None:
    write_lerobot_v21(tmp_path / "ds", episodes=3, n=N, fps=FPS, tasks=TASKS, language=True)
    store = Store(tmp_path / "root")
    m = ingest_lerobot(store, tmp_path / "ds", "slc_7a5c0001", progress=QUIET)
    assert m is not None
    seg = m.segments[1]
    assert sorted(seg.streams) == [
        "front/rgb",
        "language/interjection",
        "language/plan",
        "language/subtask",
        "language/vqa",
        "observation/state",
        "task",
    ]
    # Episode 1 holds task 1 in its first half and task 2 from frame N // 2 on.
    t, records = _text(store, seg, "task")
    assert t == [0, _frame_ns(N // 2)]
    assert [r["content"] for r in records] == [TASKS[1], TASKS[2]]
    assert records[0]["style"] == "task" and seg.streams["task"].quantity == "state"
    # Persistent rows, one stream per style, each row once at its (snapped) timestamp.
    t, records = _text(store, seg, "language/subtask")
    assert t == [0, _frame_ns(N // 2)] and [r["content"] for r in records] == ["reach 1", "grasp"]
    assert seg.streams["language/plan"].count == 1
    # Events at the time of the frame they were emitted on, in their order.
    t, records = _text(store, seg, "language/vqa")
    assert seg.streams["language/vqa"].quantity == "events"
    assert t == [_frame_ns(3)] * 2
    assert [r["content"] for r in records] == ["what is in the gripper?", "a cube"]
    assert records[0]["camera"] == "observation.images.front"
    assert records[1]["tool_calls"] == ["look"] and records[1]["role"] == "assistant"
    assert _text(store, seg, "language/interjection")[1][0]["content"] == "stop!"
    # The slice lists the distinct tasks with the episodes that hold each.
    slice_ = store_slice("slc_7a5c0001", m, store)
    assert dict(slice_.tasks()) == {TASKS[0]: 2, TASKS[1]: 2, TASKS[2]: 2}


def _cli(*argv: str) -> int:
    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers())
    args = parser.parse_args(["ingest", "lerobot", *argv])
    return int(args.func(args))


def test_stream_renames_the_task_and_the_language_prefix(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_lerobot_v21(tmp_path / "ds", episodes=2, n=N, fps=FPS, tasks=TASKS, language=True)
    root = tmp_path / "root"
    argv = ["--root", str(root), "--slice", "slc_7a5c0002", "--quiet", str(tmp_path / "ds")]
    specs = [
        "--stream",
        "instruction=task",
        "--stream",
        "joints=observation.state",
        "--stream",
        "talk=language_events",
    ]
    assert _cli(*specs, *argv) == 0
    store = Store(root)
    m = store.load_manifest(store.get_slice("slc_7a5c0002")["manifest"])
    assert sorted(m.segments[0].streams) == [
        "instruction",
        "joints",
        "talk/interjection",
        "talk/vqa",
    ]
    assert _cli("--stream", "x=tasks", *argv) != 0
    err = capsys.readouterr().err
    assert "no video, vector or text feature 'tasks'" in err and "task, language" in err


def test_a_dataset_without_tasks_table_has_no_task_stream(tmp_path: Path) -> None:
    write_lerobot_v21(tmp_path / "ds", episodes=1, n=N, fps=FPS)
    store = Store(tmp_path / "root")
    m = ingest_lerobot(store, tmp_path / "ds", "slc_7a5c0003", progress=QUIET)
    assert m is not None and "task" not in m.segments[0].streams
    with pytest.raises(InvalidArgumentError, match=r"has no meta/tasks.parquet"):
        ingest_lerobot(
            store, tmp_path / "ds", "slc_7a5c0003", streams={"task": "task"}, progress=QUIET
        )


def test_an_unknown_task_index_is_refused(tmp_path: Path) -> None:
    write_lerobot_v21(tmp_path / "ds", episodes=1, n=N, fps=FPS, tasks=TASKS[:1])
    (tmp_path / "ds" / "meta" / "tasks.jsonl").write_text(
        json.dumps({"task_index": 5, "task": "other"}) + "\n"
    )
    store = Store(tmp_path / "root")
    with pytest.raises(InvalidArgumentError, match="task_index 0, which the tasks table lacks"):
        ingest_lerobot(store, tmp_path / "ds", "slc_7a5c0004", progress=QUIET)
    assert list(store.list_slices()) == []


def write_lerobot_v30_tasks(root: Path, episodes: int = 2, n: int = N) -> None:
    """A v3.0 layout by hand: one data file for every episode, tasks in meta/tasks.parquet
    as pandas writes a frame indexed by the task string."""
    features = {
        "observation.state": {"dtype": "float32", "shape": [2], "names": None},
        **{
            k: {"dtype": "int64", "shape": [1], "names": None}
            for k in ("frame_index", "episode_index", "index", "task_index")
        },
        "timestamp": {"dtype": "float32", "shape": [1], "names": None},
    }
    info = {"codebase_version": "v3.0", "fps": FPS, "features": features}
    (root / "meta" / "episodes" / "chunk-000").mkdir(parents=True)
    (root / "data" / "chunk-000").mkdir(parents=True)
    (root / "meta" / "info.json").write_text(json.dumps(info))
    pq.write_table(
        pa.table(
            {
                "episode_index": np.arange(episodes),
                "length": np.full(episodes, n),
                "data/chunk_index": np.zeros(episodes, np.int64),
                "data/file_index": np.zeros(episodes, np.int64),
            }
        ),
        root / "meta" / "episodes" / "chunk-000" / "file-000.parquet",
    )
    frames = np.tile(np.arange(n), episodes)
    ep = np.repeat(np.arange(episodes), n)
    state = np.zeros((n * episodes, 2), np.float32)
    pq.write_table(
        pa.table(
            {
                "observation.state": pa.FixedSizeListArray.from_arrays(pa.array(state.ravel()), 2),
                "timestamp": (frames / FPS).astype(np.float32),
                "frame_index": frames,
                "episode_index": ep,
                "index": np.arange(n * episodes),
                "task_index": (ep + (frames >= n // 2)) % 2,
            }
        ),
        root / "data" / "chunk-000" / "file-000.parquet",
    )
    tasks = pa.table(
        {"task_index": pa.array([0, 1], pa.int64()), "__index_level_0__": ["fold", "unfold"]}
    )
    pq.write_table(tasks, root / "meta" / "tasks.parquet")


def test_v30_tasks_parquet(tmp_path: Path) -> None:
    write_lerobot_v30_tasks(tmp_path / "ds")
    store = Store(tmp_path / "root")
    m = ingest_lerobot(store, tmp_path / "ds", "slc_7a5c0005", progress=QUIET)
    assert m is not None
    t, records = _text(store, m.segments[1], "task")
    assert t == [0, _frame_ns(N // 2)]
    assert [r["content"] for r in records] == ["unfold", "fold"]
    # Episode 0 holds the same two tasks in the other order: another blob.
    refs = {g.streams["task"].blob.hash for g in m.segments}
    assert len(refs) == 2


def test_jobs_give_the_serial_manifest_with_text_streams(tmp_path: Path) -> None:
    write_lerobot_v21(tmp_path / "ds", episodes=4, n=N, fps=FPS, tasks=TASKS, language=True)
    serial = ingest_lerobot(Store(tmp_path / "a"), tmp_path / "ds", "slc_7a5c0006", progress=QUIET)
    jobs = ingest_lerobot(
        Store(tmp_path / "b"), tmp_path / "ds", "slc_7a5c0006", progress=QUIET, jobs=2
    )
    assert serial is not None and jobs is not None
    assert "language/vqa" in serial.segments[0].streams
    assert jobs.hash == serial.hash


def test_mcap_string_topics_by_log_time_and_task_per_bag(tmp_path: Path) -> None:
    from support.recordings import INSTRUCTIONS, write_bag

    from rayform_server.ingest import ingest_mcap

    truth = write_bag(tmp_path / "run.mcap", instruction=True)
    store = Store(tmp_path / "root")
    m = ingest_mcap(
        store, [tmp_path / "run.mcap"], "slc_7a5c0010", progress=QUIET, task="stack the cups"
    )
    assert m is not None
    seg = m.segments[0]
    st = seg.streams["instruction"]
    assert (st.kind, st.quantity) == ("text", "state")
    t, records = _text(store, seg, "instruction")
    assert t == truth["instruction"].tolist()  # String has no header: the log time
    assert [r["content"] for r in records] == INSTRUCTIONS
    t, records = _text(store, seg, "task")
    assert t == [seg.start_ns] and records[0]["content"] == "stack the cups"
    slice_ = store_slice("slc_7a5c0010", m, store)
    assert slice_.tasks() == [("stack the cups", 1)]
    # Named with --stream, a String topic is ingested under that name; --task "" is refused.
    named = ingest_mcap(
        store,
        [tmp_path / "run.mcap"],
        "slc_7a5c0011",
        progress=QUIET,
        streams={"say": "/instruction", "joints": "/joint_states:position"},
    )
    assert named is not None and sorted(named.segments[0].streams) == ["joints", "say"]
    with pytest.raises(InvalidArgumentError, match="non-empty string"):
        ingest_mcap(store, [tmp_path / "run.mcap"], "slc_7a5c0012", progress=QUIET, task=" ")
