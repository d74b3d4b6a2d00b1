"""`rayform export --format lerobot` writes the slice's tasks and language columns, and an
ingest of the export gives the same text streams back."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from support.fakes import store_slice
from support.recordings import write_lerobot_v21

import rayform
from rayform.errors import InvalidArgumentError
from rayform.format import decode_text
from rayform.torch.lerobot import export_lerobot
from rayform_server.builder import SliceBuilder, TableData, TextData
from rayform_server.ingest import Progress, ingest_lerobot
from rayform_server.store import Store

QUIET = Progress(None)
TASKS = ["pick up the cube", "put it in the bin", "push the cube left"]
SLICE, AGAIN = "slc_7e470010", "slc_7e470011"


def _ingest(store: Store, path: Path, slice_id: str) -> rayform.Slice:
    m = ingest_lerobot(store, path, slice_id, progress=QUIET)
    assert m is not None
    return store_slice(slice_id, m, store)


def _texts(store: Store, slice_: rayform.Slice) -> list[dict[str, list]]:
    """Per segment, each text stream's (time, record) list."""
    out = []
    for seg in slice_.segments:
        streams = {}
        for name, st in sorted(seg.streams.items()):
            if st.kind == "text":
                t, records = decode_text(store.blob_path(st.blob.hash).read_bytes(), st.t0_ns)
                streams[name] = list(zip(t.tolist(), records, strict=True))
        out.append(streams)
    return out


@pytest.fixture(scope="module")
def ingested(tmp_path_factory: pytest.TempPathFactory) -> tuple[Store, rayform.Slice]:
    work = tmp_path_factory.mktemp("lang-export")
    write_lerobot_v21(work / "ds", episodes=3, n=12, fps=10, tasks=TASKS, language=True)
    store = Store(work / "root")
    return store, _ingest(store, work / "ds", SLICE)


@pytest.mark.parametrize("version", ["3.0", "2.1"])
def test_export_writes_the_tasks_and_language_and_ingests_back(
    ingested: tuple[Store, rayform.Slice], tmp_path: Path, version: str
) -> None:
    store, slice_ = ingested
    out = tmp_path / "export"
    export_lerobot(slice_, out, version=version)
    info = json.loads((out / "meta" / "info.json").read_text())
    assert info["total_tasks"] == 3
    assert info["features"]["language_events"]["dtype"] == "language"
    if version == "3.0":
        tasks = pq.read_table(out / "meta" / "tasks.parquet").column("__index_level_0__")
        table = tasks.to_pylist()
        data = pq.read_table(out / "data" / "chunk-000" / "file-000.parquet")
    else:
        lines = (out / "meta" / "tasks.jsonl").read_text().splitlines()
        table = [json.loads(line)["task"] for line in lines]
        data = pq.read_table(out / "data" / "chunk-000" / "episode_000001.parquet")
    assert sorted(table) == sorted(TASKS)  # the real tasks, not the slice ID
    # Episode 1 holds task 1, then task 2 from frame 6 on; its events are on frame 3.
    rows = data.to_pylist()
    if version == "3.0":
        rows = [r for r in rows if r["episode_index"] == 1]
    assert [table[r["task_index"]] for r in rows] == [TASKS[1]] * 6 + [TASKS[2]] * 6
    assert [len(r["language_events"]) for r in rows] == [0, 0, 0, 3] + [0] * 8
    persistent = rows[0]["language_persistent"]
    assert [(p["content"], p["style"], p["timestamp"]) for p in persistent] == [
        ("reach, then grasp", "plan", 0.0),  # by time, then stream name
        ("reach 1", "subtask", 0.0),
        ("grasp", "subtask", pytest.approx(0.6)),
    ]
    episodes = (
        [json.loads(x) for x in (out / "meta" / "episodes.jsonl").read_text().splitlines()]
        if version == "2.1"
        else pq.read_table(out / "meta" / "episodes" / "chunk-000" / "file-000.parquet").to_pylist()
    )
    assert episodes[1]["tasks"] == [TASKS[1], TASKS[2]]
    # An ingest of the export gives the same text streams, record for record.
    again_store = Store(tmp_path / "again")
    again = _ingest(again_store, out, AGAIN)
    assert _texts(again_store, again) == _texts(store, slice_)


def test_a_row_before_the_first_task_gets_the_fallback(tmp_path: Path) -> None:
    store = Store(tmp_path / "root")
    b = SliceBuilder(store)
    t = np.arange(20, dtype=np.int64) * 100_000_000
    b.add_segment(
        "seg_00000001",
        site="lab",
        streams=[
            TableData("joints/position", t, np.zeros((20, 2), np.float32), 10),
            TextData("task", t[5:6], [{"content": "late task"}], 10),
        ],
    )
    slice_ = store_slice("slc_7e470012", b.commit("slc_7e470012"), store)
    export_lerobot(slice_, tmp_path / "out")
    table = pq.read_table(tmp_path / "out" / "meta" / "tasks.parquet").column(1).to_pylist()
    assert table == ["late task", "slc_7e470012"]
    rows = pq.read_table(tmp_path / "out" / "data" / "chunk-000" / "file-000.parquet")
    assert rows.column("task_index").to_pylist() == [1] * 5 + [0] * 15
    assert "language_events" not in rows.column_names
    # task= is every frame's task, as before.
    export_lerobot(slice_, tmp_path / "fixed", task="stack")
    fixed = pq.read_table(tmp_path / "fixed" / "meta" / "tasks.parquet").column(1).to_pylist()
    assert fixed == ["stack"]
    with pytest.raises(InvalidArgumentError, match="holds state, and language_events holds"):
        export_lerobot(
            slice_,
            tmp_path / "bad",
            streams={"joints/position": "observation.state", "task": "language_events"},
        )
