"""A LeRobot dataset -> ingest -> export -> ``LeRobotDataset`` (0.4.4, the peer venv) gives the
same tables, episodes, timestamps and ``delta_timestamps`` windows, and frames within the
codec's tolerance; the 2.1 export goes through LeRobot's own v2.1 reader (its converter)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.fakes import store_slice
from support.lerobot_peer import run_peer

from rayform.torch.lerobot import export_lerobot
from rayform_server.ingest import ingest_lerobot
from rayform_server.ingest._common import Progress
from rayform_server.store import Store

pytestmark = pytest.mark.slow

#: Frames after LeRobot's AV1 -> ingest's H.264 (crf 23) -> export (packets copied, or H.264
#: crf 18), against LeRobot's decode of the original; measured 42 dB copied, 36-39 dB re-encoded.
PSNR_FLOOR_DB = 32.0


@pytest.fixture(scope="module")
def original(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A v3.0 dataset written by LeRobot 0.4.4 itself."""
    root = tmp_path_factory.mktemp("lerobot") / "original"
    assert run_peer("lerobot_write.py", str(root)) == {"frames": 91}
    return root


@pytest.fixture(scope="module")
def slice_of_original(original: Path, tmp_path_factory: pytest.TempPathFactory):
    work = tmp_path_factory.mktemp("store")
    store = Store(work / "root")
    m = ingest_lerobot(store, original, "slc_0000e001", progress=Progress(None))
    return store_slice("slc_0000e001", m, store, work / "cache")


@pytest.mark.parametrize("reencode", [False, True], ids=["copied", "reencoded"])
def test_round_trip_v30(original: Path, slice_of_original, tmp_path: Path, reencode: bool) -> None:
    out = tmp_path / "exported"
    # two files, so that episodes are also read across files and from inside one
    report = export_lerobot(
        slice_of_original, out, task="push", episodes_per_file=2, reencode=reencode
    )
    assert (report.episodes, report.frames, report.files_written) == (3, 91, 2)
    got = run_peer("lerobot_compare.py", str(original), str(out))
    assert got["len"] == [91, 91]
    assert got["tables_equal"], got["diff"]
    assert got["episodes"][0] == got["episodes"][1] == [[30, 0, 30], [24, 30, 54], [37, 54, 91]]
    assert got["fps"] == [30, 30]
    assert got["psnr_min"] >= PSNR_FLOOR_DB, got
    assert got["windows_equal"], got["window_diff"]
    assert got["window_psnr_min"] >= PSNR_FLOOR_DB
    assert got["info_rayform"]["slice"] == "slc_0000e001"
    assert got["info_rayform"]["manifest"] == slice_of_original.manifest_hash


def test_round_trip_v21_through_lerobots_converter(
    original: Path, slice_of_original, tmp_path: Path
) -> None:
    """LeRobot 0.4.4 reads v2.1 only through its v2.1 -> v3.0 converter, which reads every v2.1
    file with LeRobot's own legacy readers (episodes, tasks, episode stats, per-episode parquet
    and MP4): the converted dataset must then equal the original."""
    parent = tmp_path / "hub"
    out = parent / "rayform" / "v21"
    export_lerobot(slice_of_original, out, task="push", version="2.1")
    info = json.loads((out / "meta" / "info.json").read_text())
    assert info["codebase_version"] == "v2.1"
    assert sorted(p.name for p in (out / "meta").iterdir()) == [
        "episodes.jsonl",
        "episodes_stats.jsonl",
        "info.json",
        "stats.json",
        "tasks.jsonl",
    ]
    assert (out / "data/chunk-000/episode_000002.parquet").is_file()
    assert (out / "videos/chunk-000/observation.images.top/episode_000002.mp4").is_file()
    converted = run_peer("lerobot_convert21.py", str(parent), "rayform/v21")
    assert converted["codebase_version"] == "v3.0"
    got = run_peer("lerobot_compare.py", str(original), converted["root"])
    assert got["tables_equal"], got["diff"]
    assert got["episodes"][0] == got["episodes"][1]
    assert got["psnr_min"] >= PSNR_FLOOR_DB
    assert got["windows_equal"], got["window_diff"]
