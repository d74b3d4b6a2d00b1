"""The `rayform` command line in real subprocesses against the real server stub."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support import DEMO_SLICE, TOKEN, ServerProcess

from rayform.format import hash_file


def _run(
    *args: str, env: dict[str, str] | None = None, script: bool = False
) -> subprocess.CompletedProcess[str]:
    cmd = (
        [str(Path(sys.executable).parent / "rayform")]
        if script
        else [sys.executable, "-m", "rayform"]
    )
    result = subprocess.run(
        [*cmd, *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env if env is not None else dict(os.environ),
    )
    assert TOKEN not in result.stdout and TOKEN not in result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    return result


def test_help_and_usage_errors() -> None:
    top = _run("--help", script=True)
    assert top.returncode == 0 and "pull" in top.stdout and "cache" in top.stdout
    pull = _run("pull", "--help")
    assert pull.returncode == 0 and "--streams" in pull.stdout and "--jobs" in pull.stdout
    assert _run("pull").returncode == 2
    assert _run("cache", "prune").returncode == 2  # --max-size is required


def _pull_json(*args: str) -> dict[str, object]:
    """``rayform pull DEMO_SLICE ARGS --json``, parsed."""
    result = _run("pull", DEMO_SLICE, *args, "--json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_pull_prints_progress_then_fetches_nothing_again(client_env: ServerProcess) -> None:
    pulled = _run("pull", DEMO_SLICE, "--jobs", "4")
    assert pulled.returncode == 0, pulled.stderr
    assert f"{DEMO_SLICE}: 28 blobs" in pulled.stdout and "fetched 28" in pulled.stdout
    assert "100%" in pulled.stderr  # the progress bar
    again = _pull_json()
    assert again["fetched_blobs"] == 0 and again["cached_blobs"] == 28


def test_slices_show_and_ls(client_env: ServerProcess) -> None:
    show = json.loads(_run("slices", "show", DEMO_SLICE, "--json").stdout)
    assert show["id"] == DEMO_SLICE and len(show["segments"]) == 4
    assert "cam0/rgb" in show["streams"]
    text = _run("slices", "show", DEMO_SLICE).stdout
    assert text.startswith(f"<Slice {DEMO_SLICE}") and "site=lab-" in text
    assert [s["id"] for s in json.loads(_run("slices", "ls", "--json").stdout)] == [DEMO_SLICE]


def test_cache_path_du_and_ls(client_env: ServerProcess, isolated_env: Path) -> None:
    _pull_json()
    assert _run("cache", "path").stdout.strip() == str(isolated_env)
    du = json.loads(_run("cache", "du", "--json").stdout)
    assert du["blobs"] == 28 and du["manifests"] == 2  # the v2 root and its one page
    entries = json.loads(_run("cache", "ls", "--json").stdout)
    assert len(entries) == 30  # 28 blobs, the root, its page


def test_cache_verify_removes_a_corrupt_blob_and_pull_repairs_it(
    client_env: ServerProcess, isolated_env: Path
) -> None:
    _pull_json()
    victim = next(p for p in (isolated_env / "blobs").rglob("*") if p.is_file())
    os.chmod(victim, 0o644)
    victim.write_bytes(b"corrupt")
    verify = json.loads(_run("cache", "verify", "--json").stdout)
    assert verify == {"checked": 30, "removed": [victim.name]}
    # the next pull repairs exactly what verify removed
    assert _pull_json()["fetched_blobs"] == 1
    assert hash_file(victim) == victim.name


def test_cache_prune_to_a_size(client_env: ServerProcess) -> None:
    _pull_json()
    pruned = json.loads(_run("cache", "prune", "--max-size", "100KiB", "--json").stdout)
    assert (
        pruned["evicted"]
        and json.loads(_run("cache", "du", "--json").stdout)["blob_bytes"] <= 100 * 1024
    )


def test_pull_named_streams(client_env: ServerProcess) -> None:
    out = _pull_json("--streams", "joints/position", "ee/pose")
    assert out["blobs"] == 8 and out["fetched_blobs"] == 8
    # Commas, as --image-size takes them (a newcomer's first try), name the same streams.
    for spelled in (["joints/position,ee/pose"], ["joints/position,", "ee/pose"]):
        out = _pull_json("--streams", *spelled)
        assert out["blobs"] == 8 and out["cached_blobs"] == 8, spelled


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("pull", "slc_NOPE"), "malformed slice ID"),
        (("pull", "slc_0000000f"), "not found"),
        (("slices", "show", DEMO_SLICE, "--offline"), f"rayform pull {DEMO_SLICE}"),
        (("pull", DEMO_SLICE, "--streams", "nope/x"), "no stream nope/x"),
        (("cache", "prune", "--max-size", "lots"), "cannot read size"),
    ],
)
def test_errors_are_one_clear_line(
    client_env: ServerProcess, args: tuple[str, ...], message: str
) -> None:
    result = _run(*args)
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("rayform: error: ") and message in lines[0]


def test_wrong_token_exit_code(client_env: ServerProcess) -> None:
    env = {**os.environ, "RAYFORM_TOKEN": "not-the-right-token"}
    result = _run("slices", "ls", env=env)
    assert result.returncode == 1 and "RAYFORM_TOKEN" in result.stderr
    assert "not-the-right-token" not in result.stderr
