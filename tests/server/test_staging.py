"""Distributed ingest: several processes stage episodes at once, one step commits the slice."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from support import DEMO_SLICE
from support.recordings import write_bag, write_lerobot_v21

from rayform_server._fleet import demo_description
from rayform_server.staging import commit_staged, stage_segment, staged
from rayform_server.store import Store


def _server(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "rayform_server", *args],
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def test_parallel_staging_then_one_commit_is_the_serial_build(
    tmp_path: Path, demo_root: Path
) -> None:
    root = tmp_path / "shared"
    workers = [
        _server("demo", "--root", str(root), "--small", "--stage", "run-1", "--shard", f"{k}/3")
        for k in range(3)
    ]
    for w in workers:
        _, err = w.communicate(timeout=300)
        assert w.returncode == 0, err
    store = Store(root)
    assert list(store.list_slices()) == []  # staged, not visible: no half slice
    assert [seg.id for _, seg in staged(store, "run-1")] == [
        s.id
        for s in Store(demo_root)
        .load_manifest(Store(demo_root).get_slice(DEMO_SLICE)["manifest"])
        .segments
    ]

    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "rayform_server",
            "commit",
            "--root",
            str(root),
            "--stage",
            "run-1",
            "--slice",
            DEMO_SLICE,
            "--expect",
            "5",
        ],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 2 and "holds 4 segments, expected 5" in out.stderr
    assert "Traceback" not in out.stderr and list(store.list_slices()) == []

    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "rayform_server",
            "commit",
            "--root",
            str(root),
            "--stage",
            "run-1",
            "--slice",
            DEMO_SLICE,
            "--expect",
            "4",
            "--description",
            demo_description(4, 0),
        ],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr
    # The same bytes as one process building the demo: same manifest hash.
    assert (
        store.get_slice(DEMO_SLICE)["manifest"]
        == Store(demo_root).get_slice(DEMO_SLICE)["manifest"]
    )
    assert not (root / "staging" / "run-1").exists()


def test_commit_refuses_a_segment_whose_blob_is_missing(tmp_path: Path, demo_root: Path) -> None:
    source = Store(demo_root)
    seg = source.load_manifest(source.get_slice(DEMO_SLICE)["manifest"]).segments[0]
    store = Store(tmp_path / "other")  # staged by a worker that wrote its blobs elsewhere
    stage_segment(store, "b", seg)
    with pytest.raises(ValueError, match="not in the store"):
        commit_staged(store, "b", "slc_0000beef")
    with pytest.raises(ValueError, match="holds no segment"):
        commit_staged(store, "empty", "slc_0000beef")
    with pytest.raises(ValueError, match="staging batch"):
        stage_segment(store, "../escape", seg)
    assert list(store.list_slices()) == []


def _ingest(*args: str) -> subprocess.Popen[str]:
    return _server("ingest", *args)


@pytest.mark.parametrize("kind", ["lerobot", "mcap"])
def test_staged_ingest_on_several_workers_is_the_serial_ingest(kind: str, tmp_path: Path) -> None:
    if kind == "lerobot":
        # With tasks and language columns: text streams staged and committed like the rest.
        write_lerobot_v21(
            tmp_path / "ds", episodes=5, n=12, fps=10, action=True, tasks=["a", "b"], language=True
        )
        sources, workers = [str(tmp_path / "ds")], 3
    else:
        sources = []
        for k in range(3):
            write_bag(tmp_path / f"run_{k}.mcap", seed=k)
            sources.append(str(tmp_path / f"run_{k}.mcap"))
        workers = 2
    serial = _ingest(
        kind, "--root", str(tmp_path / "serial"), "--slice", "slc_0000aaaa", "--quiet", *sources
    )
    assert serial.communicate(timeout=300)[0] == "" and serial.returncode == 0

    shared = tmp_path / "shared"
    procs = [
        _ingest(
            kind,
            "--root",
            str(shared),
            "--slice",
            "slc_0000aaaa",
            "--stage",
            "b1",
            "--shard",
            f"{k}/{workers}",
            *sources,
        )
        for k in range(workers)
    ]  # all at once
    outs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), [err for _, err in outs]
    assert all("when every worker is done run: rayform-server commit" in err for _, err in outs)
    assert list(Store(shared).list_slices()) == []  # nothing visible before the commit
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "rayform_server",
            "commit",
            "--root",
            str(shared),
            "--stage",
            "b1",
            "--slice",
            "slc_0000aaaa",
        ],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr

    def segments(root: Path) -> list[dict]:
        store = Store(root)
        return [
            s.to_json()
            for s in store.load_manifest(store.get_slice("slc_0000aaaa")["manifest"]).segments
        ]

    want = segments(tmp_path / "serial")
    assert len(want) == (5 if kind == "lerobot" else 3)
    assert segments(shared) == want  # same segments, same blobs, same order

    # --jobs: local workers staging in a private batch, then one commit: the serial manifest.
    jobs = _ingest(
        kind, "--root", str(tmp_path / "jobs"), "--slice", "slc_0000aaaa", "--jobs", "2", *sources
    )
    _, err = jobs.communicate(timeout=300)
    assert jobs.returncode == 0, err
    assert "2 worker processes" in err and "Traceback" not in err
    serial_hash = Store(tmp_path / "serial").get_slice("slc_0000aaaa")["manifest"]
    assert Store(tmp_path / "jobs").get_slice("slc_0000aaaa")["manifest"] == serial_hash
    assert not any((tmp_path / "jobs" / "staging").glob("*"))  # the private batch is gone

    bad = subprocess.run(
        [
            sys.executable,
            "-m",
            "rayform_server",
            "ingest",
            kind,
            "--root",
            str(shared),
            "--slice",
            "slc_0000aaaa",
            "--shard",
            "0/2",
            *sources,
        ],
        capture_output=True,
        text=True,
    )
    assert (
        bad.returncode == 2
        and "give the staging batch too" in bad.stderr
        and "Traceback" not in bad.stderr
    )
    bad = subprocess.run(
        [
            sys.executable,
            "-m",
            "rayform_server",
            "ingest",
            kind,
            "--root",
            str(shared),
            "--slice",
            "slc_0000aaaa",
            "--stage",
            "b2",
            "--shard",
            "2/2",
            *sources,
        ],
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 2 and "use 0 <= I < N" in bad.stderr and "Traceback" not in bad.stderr
    bad = subprocess.run(
        [
            sys.executable,
            "-m",
            "rayform_server",
            "ingest",
            kind,
            "--root",
            str(shared),
            "--slice",
            "slc_0000aaaa",
            "--stage",
            "b2",
            "--jobs",
            "2",
            *sources,
        ],
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 2 and "start one per --shard instead" in bad.stderr
