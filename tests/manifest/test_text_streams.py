"""Text streams in the manifest: the blob format, both manifest versions, tasks of a slice."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from support import TOKEN, ServerProcess
from support.fakes import store_slice

import rayform
from rayform.cli import main as cli_main
from rayform.errors import IntegrityError, InvalidArgumentError, ManifestError
from rayform.format import decode_text, encode_text
from rayform.manifest import Manifest
from rayform_server.builder import SliceBuilder, TableData, TextData
from rayform_server.store import Store

SLICE = "slc_7e470001"
TASKS = ["pick up the red cube", "place it in the bin", "pick up the red cube"]


def _build(root: Path) -> Store:
    """Three 1 s episodes at 10 Hz, a task each (two share one), and a subtask stream that
    changes half-way through the first."""
    store = Store(root)
    b = SliceBuilder(store, description="language")
    for e, task in enumerate(TASKS):
        t = np.arange(10, dtype=np.int64) * 100_000_000 + e * 10**10
        streams: list[TableData | TextData] = [
            TableData("joints/position", t, np.full((10, 2), e, np.float32), rate_hz=10),
            TextData("task", t[:1], [{"content": task, "role": "user", "style": "task"}], 10),
        ]
        if e == 0:
            streams.append(
                TextData(
                    "language/subtask",
                    t[[0, 5]],
                    [{"content": "reach"}, {"content": "grasp"}],
                    rate_hz=10,
                )
            )
        b.add_segment(f"seg_{e:08x}", site="lab", streams=streams)
    b.commit(SLICE)
    return store


def _slice(store: Store) -> rayform.Slice:
    return store_slice(SLICE, store.load_manifest(store.get_slice(SLICE)["manifest"]), store)


def test_text_blob_round_trip_and_relative_times() -> None:
    records = [
        {"content": "pick", "role": "user", "style": "task"},
        {"content": "où est la tasse ?", "tool_calls": [{"name": "look"}], "camera": "cam0"},
    ]
    blob = encode_text([1_000, 1_500], records)
    t_ns, back = decode_text(blob, t0_ns=1_000)
    assert t_ns.tolist() == [1_000, 1_500]
    assert back[0] == {**records[0], "camera": None, "tool_calls": None}
    assert back[1]["content"] == "où est la tasse ?"
    assert back[1]["tool_calls"] == [{"name": "look"}]
    # Times are relative to the first record: the same records later are the same bytes.
    assert encode_text([7_000, 7_500], records) == blob
    assert "où".encode() in blob  # UTF-8, not \u escapes


@pytest.mark.parametrize(
    ("data", "says"),
    [
        (b'{"content":"a","dt_ns":0}', "newline"),
        (b"\xff\xfe\n", "not a JSON record"),
        (b"[1,2]\n", "not a JSON object"),
        (b'{"camera":null,"content":"a","dt_ns":0,"role":null,"style":null}\n', "keys must"),
        (
            b'{"camera":null,"content":"a","dt_ns":5,"role":null,"style":null,"tool_calls":null}\n',
            "first record",
        ),
        (
            b'{"camera":null,"content":1,"dt_ns":0,"role":null,"style":null,"tool_calls":null}\n',
            "content must be a string",
        ),
        (
            b'{"camera":null,"content":"a","dt_ns":0,"role":null,"style":null,"tool_calls":null}\n'
            b'{"camera":null,"content":"b","dt_ns":-1,"role":null,"style":null,"tool_calls":null}\n',
            "dt_ns",
        ),
    ],
)
def test_malformed_text_blobs_are_integrity_errors(data: bytes, says: str) -> None:
    with pytest.raises(IntegrityError, match=says):
        decode_text(data)


def test_encode_text_refuses_bad_records() -> None:
    with pytest.raises(InvalidArgumentError, match="unknown keys"):
        encode_text([0], [{"content": "a", "text": "b"}])
    with pytest.raises(InvalidArgumentError, match="must not decrease"):
        encode_text([5, 4], [{"content": "a"}, {"content": "b"}])
    with pytest.raises(InvalidArgumentError, match="content must be a string or null"):
        encode_text([0], [{"content": 5}])


def test_a_record_that_is_only_a_tool_call_has_null_content() -> None:
    # LeRobot's speech rows (its say tool): no text, no style, the call in tool_calls.
    call = {"type": "function", "function": {"name": "say", "arguments": {"text": "stopping"}}}
    data = encode_text([0, 10], [{"content": "stop!"}, {"content": None, "tool_calls": [call]}])
    _, records = decode_text(data)
    assert records[1]["content"] is None and records[1]["tool_calls"] == [call]
    from rayform.torch._text import state_at

    # As a state, a record without text holds no string: "" as before the first record.
    assert state_at(np.array([0, 10]), records, np.array([-1, 5, 10])) == ["", "stop!", ""]


@pytest.mark.parametrize("form", ["pages", "memory"])
def test_pages_and_memory_carry_text_streams(tmp_path: Path, form: str) -> None:
    slice_ = _slice(_build(tmp_path))
    if form == "memory":
        twin = slice_.manifest.to_v1()
        assert isinstance(twin, Manifest) and tuple(slice_.segments) == twin.segments
        slice_ = store_slice(SLICE, twin, Store(tmp_path))
    assert slice_.text_streams() == ["language/subtask", "task"]
    assert "task" in slice_.streams
    task = slice_.segments[1].streams["task"]
    assert (task.kind, task.shape, task.dtype, task.quantity) == ("text", (1,), "str", "state")
    info = slice_.segments.summary()["streams"]["language/subtask"]
    assert info["kind"] == "text" and info["segments"] == 1
    # Two episodes with the same task share its blob.
    refs = [slice_.segments[e].streams["task"].blob for e in range(3)]
    assert refs[0] == refs[2] != refs[1]


def test_tasks_count_episodes_per_distinct_task(tmp_path: Path) -> None:
    slice_ = _slice(_build(tmp_path))
    assert slice_.tasks() == [("pick up the red cube", 2), ("place it in the bin", 1)]
    assert slice_.tasks("language/subtask") == [("grasp", 1), ("reach", 1)]
    assert slice_.tasks("no/such") == []
    with pytest.raises(InvalidArgumentError, match="not text; its text streams"):
        slice_.tasks("joints/position")


def _segments_doc(stream: dict) -> bytes:
    blob = {"hash": "0" * 64, "size": 10}
    seg = {"id": "seg_00000001", "version": 1, "site": "a", "start_ns": 0, "end_ns": 0}
    base = {"kind": "text", "blob": blob, "rate_hz": 10.0, "shape": [1], "dtype": "str"}
    seg["streams"] = {"task": {**base, "count": 1, "t0_ns": 0, "t1_ns": 0, **stream}}
    return json.dumps({"segments": [seg]}).encode()


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        ({"quantity": "pose"}, "quantity is one of"),
        ({}, "quantity is one of"),
        ({"quantity": "state", "shape": [2]}, "shape is \\[1\\]"),
        ({"quantity": "state", "dtype": "float32"}, "for text streams"),
        ({"quantity": "state", "frame": "ros"}, "no frame"),
    ],
)
def test_misdescribed_text_streams_are_refused(fields: dict, says: str) -> None:
    with pytest.raises(ManifestError, match=says):
        Manifest.from_json(json.loads(_segments_doc(fields)))


def test_a_table_stream_may_not_claim_text_dtype() -> None:
    doc = json.loads(_segments_doc({"quantity": "state"}))
    doc["segments"][0]["streams"]["task"]["kind"] = "table"
    doc["segments"][0]["streams"]["task"].pop("quantity")
    with pytest.raises(ManifestError, match="for text streams"):
        Manifest.from_json(doc)
    ok = Manifest.from_json(json.loads(_segments_doc({"quantity": "events"})))
    assert isinstance(ok, Manifest) and ok.segments[0].streams["task"].quantity == "events"


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ServerProcess]:
    _build(tmp_path / "root")
    proc = ServerProcess(tmp_path / "root")
    yield proc
    proc.stop()


def test_slices_show_lists_text_streams_and_tasks(
    server: ServerProcess, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("RAYFORM_ENDPOINT", server.url)
    monkeypatch.setenv("RAYFORM_TOKEN", TOKEN)
    assert cli_main(["slices", "show", SLICE]) == 0
    out = capsys.readouterr().out
    assert "tasks: 2 distinct" in out
    assert "2 episodes  pick up the red cube" in out
    assert "1 episodes  place it in the bin" in out
    assert "language/subtask" in out
    assert cli_main(["slices", "show", SLICE, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["tasks"] == [
        {"task": "pick up the red cube", "segments": 2},
        {"task": "place it in the bin", "segments": 1},
    ]
    assert "task" in doc["streams"]
