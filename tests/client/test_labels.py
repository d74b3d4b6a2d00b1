"""Episode labels through the SDK and the CLI: versions, history, tables, the merge rule of
concurrent writers (also two real processes racing), offline reads after ``rayform pull``."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pytest
from support import DEMO_SLICE, TOKEN, WRITE_TOKEN, ServerProcess, forbid_network

import rayform
from rayform import AccessDeniedError, InvalidArgumentError, OfflineError
from rayform.cli import main
from rayform.errors import ConflictError


def _client(
    server: ServerProcess, cache: Path, token: str = WRITE_TOKEN, **kw: object
) -> rayform.Client:
    return rayform.Client(endpoint=server.url, token=token, cache_dir=cache, **kw)


def test_label_versions_history_and_tables(write_server: ServerProcess, tmp_path: Path) -> None:
    slice_ = _client(write_server, tmp_path / "c").slices.get(DEMO_SLICE)
    manifest = slice_.manifest_hash
    ids = [str(i) for i in slice_.segments.ids().to_pylist()]
    assert slice_.labels.version == 0 and len(slice_.labels) == 0
    v1 = slice_.label(ids[0], success=True, quality=0.9, tags=["regrasp", "dim"])
    assert v1.version == 1 and v1[ids[0]] == {
        "success": True,
        "quality": 0.9,
        "tags": ["dim", "regrasp"],
    }
    table = pa.table({"episode": ids[1:3], "success": [False, True], "quality": [0.2, None]})
    v2 = slice_.label_all(table)
    assert v2.version == 2 and v2.parent == v1.hash
    assert v2[ids[1]] == {"success": False, "quality": 0.2} and v2[ids[2]] == {"success": True}
    v3 = slice_.label(ids[0], tags=None, note="gripper slipped", kinds={"note": "text"})
    assert "tags" not in v3[ids[0]] and v3.kinds["note"] == "text"
    history = v3.history()
    assert [h["version"] for h in history] == [1, 2, 3]
    assert history[1]["episodes"] == 2 and history[1]["keys"] == ["quality", "success"]
    assert all(h["by"] == "writer" and h["at"].endswith("Z") for h in history)
    arrow = v3.to_arrow()
    assert arrow.column_names == ["episode", "note", "quality", "success"]
    assert arrow.num_rows == 3
    shown = v3._repr_html_()
    assert f"<code>{ids[0]}</code>" in shown and "quality (number)" in shown
    frame = v3.to_pandas()
    assert bool(frame.loc[ids[1], "success"]) is False
    # What the slice read stays in this process: a pickled slice (a DataLoader worker's)
    # carries no label set, and a view of it none either.
    import pickle

    assert pickle.loads(pickle.dumps(slice_))._seen is None
    assert b"gripper slipped" not in pickle.dumps(slice_.select(where="success"))
    # Labels never change the slice's manifest, and another client reads the same version.
    other = _client(write_server, tmp_path / "d", token=TOKEN).slices.get(DEMO_SLICE)
    assert other.manifest_hash == manifest
    assert other.labels.hash == v3.hash and dict(other.labels.items()) == dict(v3.items())


def test_bad_labels_fail_before_any_request(
    write_server: ServerProcess, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    slice_ = _client(write_server, tmp_path / "c").slices.get(DEMO_SLICE)
    ep = str(slice_.segments.ids()[0])
    forbid_network(monkeypatch, "a bad label reached the network")
    slice_.client.close()
    with pytest.raises(InvalidArgumentError, match="reserved"):
        slice_.label(ep, site="x")
    with pytest.raises(InvalidArgumentError, match="not a finite number"):
        slice_.label(ep, quality=float("nan"))
    with pytest.raises(InvalidArgumentError, match="not a segment ID"):
        slice_.label("episode-1", success=True)
    with pytest.raises(InvalidArgumentError, match="'episode' column"):
        slice_.label_all(pa.table({"id": [ep], "success": [True]}))


def test_read_token_may_not_label(write_server: ServerProcess, tmp_path: Path) -> None:
    slice_ = _client(write_server, tmp_path / "c", token=TOKEN).slices.get(DEMO_SLICE)
    with pytest.raises(AccessDeniedError, match="write token"):
        slice_.label(str(slice_.segments.ids()[0]), success=True)
    assert slice_.labels.version == 0


def test_writers_from_one_version_merge_and_only_a_changed_key_conflicts(
    write_server: ServerProcess, tmp_path: Path
) -> None:
    alice, bob, carol = (
        _client(write_server, tmp_path / n).slices.get(DEMO_SLICE) for n in ("a", "b", "c")
    )
    ids = [str(i) for i in alice.segments.ids().to_pylist()]
    assert alice.labels.version == bob.labels.version == carol.labels.version == 0
    alice.label(ids[0], success=True)
    bob.label(ids[1], success=False)  # another episode: merged
    with pytest.raises(ConflictError, match=f"{ids[0]} success: you read None, it is now True"):
        carol.label_all({ids[0]: {"success": False}})  # carol read version 0: she is told
    carol.label(ids[0], quality=0.5)  # another key of the same episode: merged
    latest = alice.labels
    assert latest.version == 3
    assert latest[ids[0]] == {"success": True, "quality": 0.5}
    assert latest[ids[1]] == {"success": False}
    # Having read the latest, the change is deliberate and lands; a slice that never read
    # the labels writes on the latest version.
    assert carol.labels[ids[0]]["success"] is True
    assert carol.label(ids[0], success=False)[ids[0]]["success"] is False
    fresh = _client(write_server, tmp_path / "d").slices.get(DEMO_SLICE)
    assert fresh.label(ids[0], success=True).version == 5


_RACER = r"""
import sys, time
from pathlib import Path
import rayform
from rayform.errors import ConflictError
url, token, cache, name, go, mode = sys.argv[1:7]
slice_ = rayform.Client(endpoint=url, token=token, cache_dir=cache).slices.get("slc_7c1e04aa")
ids = [str(i) for i in slice_.segments.ids().to_pylist()]
slice_.labels  # both read the same version first
Path(cache + ".ready").touch()
while not Path(go).exists():
    time.sleep(0.005)
if mode == "disjoint":  # each writes its own key on every episode, one write per episode
    for ep in ids:
        slice_.label(ep, **{name: True})
    print("ok")
else:  # both set the same key of the same episode
    try:
        slice_.label(ids[0], winner=name)
        print("won")
    except ConflictError as exc:
        print("conflict", exc)
"""


def _race(server: ServerProcess, tmp_path: Path, mode: str) -> list[str]:
    go = tmp_path / "go"
    caches = [tmp_path / f"c{i}" for i in range(2)]
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _RACER, server.url, WRITE_TOKEN, str(c), f"w{i}", str(go), mode],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i, c in enumerate(caches)
    ]
    deadline = time.monotonic() + 60
    while not all(Path(str(c) + ".ready").exists() for c in caches):
        assert time.monotonic() < deadline and all(p.poll() is None for p in procs), [
            p.communicate() for p in procs
        ]
        time.sleep(0.01)
    go.touch()
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        outs.append(out.strip())
    return outs


def test_two_processes_labelling_at_once_lose_nothing(
    write_server: ServerProcess, tmp_path: Path
) -> None:
    assert _race(write_server, tmp_path, "disjoint") == ["ok", "ok"]
    labels = _client(write_server, tmp_path / "check").slices.get(DEMO_SLICE).labels
    assert len(labels) == 4
    assert all(labels[ep] == {"w0": True, "w1": True} for ep in labels)
    assert labels.version == 8  # one version per write, none lost or doubled
    assert sorted(h["keys"][0] for h in labels.history()) == ["w0"] * 4 + ["w1"] * 4


def test_two_processes_setting_one_key_one_wins_one_is_told(
    write_server: ServerProcess, tmp_path: Path
) -> None:
    outs = _race(write_server, tmp_path, "same")
    assert sorted(o.split()[0] for o in outs) == ["conflict", "won"]
    winner = "w0" if outs[0] == "won" else "w1"
    conflict = next(o for o in outs if o.startswith("conflict"))
    assert "read the labels again" in conflict
    labels = _client(write_server, tmp_path / "check").slices.get(DEMO_SLICE).labels
    assert labels.version == 1 and next(iter(dict(labels.items()).values())) == {"winner": winner}


def test_labels_read_offline_after_pull(
    write_server: ServerProcess, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = tmp_path / "c"
    writer = _client(write_server, tmp_path / "w").slices.get(DEMO_SLICE)
    ep = str(writer.segments.ids()[0])
    written = writer.label(ep, success=True)
    client = _client(write_server, cache, token=TOKEN)
    client.pull(DEMO_SLICE, streams=["joints/position"])
    forbid_network(monkeypatch)
    offline = rayform.Client(cache_dir=cache, offline=True).slices.get(DEMO_SLICE)
    assert offline.labels.hash == written.hash and offline.labels[ep] == {"success": True}
    assert len(offline.select(where="success")) == 1
    with pytest.raises(OfflineError, match="needs the server"):
        offline.label(ep, success=False)
    never = rayform.Client(cache_dir=tmp_path / "empty", offline=True)
    with pytest.raises(OfflineError, match=f"rayform pull {DEMO_SLICE}"):
        never.label_remote().read(DEMO_SLICE, offline.manifest_hash, offline.segments)


def test_labels_cli(
    write_server: ServerProcess,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("RAYFORM_ENDPOINT", write_server.url)
    monkeypatch.setenv("RAYFORM_TOKEN", WRITE_TOKEN)
    ids = [
        str(i)
        for i in _client(write_server, tmp_path / "x")
        .slices.get(DEMO_SLICE)
        .segments.ids()
        .to_pylist()
    ]
    assert (
        main(["labels", "set", DEMO_SLICE, ids[0], "success=true", "quality=0.75", "grade=good"])
        == 0
    )
    assert "v1" in capsys.readouterr().out
    csv_file = tmp_path / "labels.csv"
    csv_file.write_text(f"episode,success,quality\n{ids[1]},false,0.1\n{ids[2]},true,\n")
    assert main(["labels", "import", DEMO_SLICE, str(csv_file)]) == 0
    capsys.readouterr()
    assert main(["labels", "show", DEMO_SLICE, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["version"] == 2
    assert doc["episodes"][ids[0]] == {"grade": "good", "quality": 0.75, "success": True}
    assert doc["episodes"][ids[2]] == {"success": True}
    assert main(["labels", "history", DEMO_SLICE]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("v1 ") and "writer" in lines[1] and "2 episodes" in lines[1]
    assert main(["labels", "set", DEMO_SLICE, ids[0], "grade=3"]) == 1
    assert "holds category values" in capsys.readouterr().err


def test_time_ranges_within_an_episode(write_server: ServerProcess, tmp_path: Path) -> None:
    import httpx

    slice_ = _client(write_server, tmp_path / "c").slices.get(DEMO_SLICE)
    seg = slice_.segments[0]
    t0, mid = seg.start_ns, seg.start_ns + 500_000_000
    labels = slice_.label(seg.id, events=[(mid, mid + 10**8, "slip"), (t0, mid, "grasp")])
    assert labels.kinds["events"] == "spans"
    assert labels.spans(seg.id, "events") == [(t0, mid, "grasp"), (mid, mid + 10**8, "slip")]
    row = labels.to_arrow().to_pylist()[0]
    assert row["events"][0] == {"t0_ns": t0, "t1_ns": mid, "name": "grasp"}
    assert [str(s) for s in slice_.select(where="'slip' in events").segments.ids().to_pylist()] == [
        seg.id
    ]
    with pytest.raises(InvalidArgumentError, match="lies outside the episode"):
        slice_.label(seg.id, events=[(seg.end_ns, seg.end_ns + 10**9, "late")])
    with pytest.raises(InvalidArgumentError, match="t0_ns < t1_ns"):
        slice_.label(seg.id, events=[(mid, mid, "empty")])
    # The server checks the same, whatever a client sends.
    resp = httpx.post(
        f"{write_server.url}/v1/slices/{DEMO_SLICE}/labels/{slice_.manifest_hash}",
        json={"base": labels.hash, "set": {seg.id: {"events": [[0, 1, "before"]]}}},
        headers={"Authorization": f"Bearer {WRITE_TOKEN}"},
    )
    assert resp.status_code == 400 and "outside the episode" in resp.json()["message"]
