"""The command line's traps for a newcomer, each through the real `rayform` in a subprocess:
a list option that swallows the slice ID, abbreviated options, a size with a space, a
mistyped option, no endpoint, an on/off variable that is neither."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support import DEMO_SLICE, TOKEN, ServerProcess

BIN = Path(sys.executable).parent


def rayform(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [str(BIN / "rayform"), *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env if env is not None else dict(os.environ),
    )
    assert "Traceback" not in result.stderr, result.stderr
    assert TOKEN not in result.stdout + result.stderr
    return result


def _usage_error(result: subprocess.CompletedProcess[str], command: str) -> str:
    """The message of a usage error, after checking it is one of ``command``'s."""
    assert result.returncode == 2 and result.stdout == "", result
    assert result.stderr.startswith(f"usage: {command} "), result.stderr
    lines = result.stderr.strip().splitlines()
    assert lines[-1].startswith(f"{command}: error: ")
    return lines[-1]


def test_a_list_that_took_the_slice_id_says_how_to_write_it() -> None:
    said = _usage_error(
        rayform("pull", "--streams", "cam0/rgb", "wrist/rgb", DEMO_SLICE), "rayform pull"
    )
    assert f"--streams took 'cam0/rgb wrist/rgb {DEMO_SLICE}'" in said
    assert "put SLICE_ID before --streams" in said
    assert "end the list with --" in said
    export = rayform(
        "export", DEMO_SLICE, "--segments", "seg_a", "seg_b", "out", "--format", "lerobot"
    )
    said = _usage_error(export, "rayform export")
    assert "--segments took 'seg_a seg_b out'" in said and "put DIR before --segments" in said
    sites = rayform("export", "--sites", "lab-zurich", DEMO_SLICE, "out", "--format", "lerobot")
    said = _usage_error(sites, "rayform export")
    assert "--sites took 'lab-zurich slc_7c1e04aa out'" in said


def test_the_three_ways_to_write_a_list_pull_the_same(client_env: ServerProcess) -> None:
    ways = [
        [DEMO_SLICE, "--streams", "joints/position", "ee/pose"],
        [DEMO_SLICE, "--streams", "joints/position,ee/pose"],
        ["--streams", "joints/position", "ee/pose", "--", DEMO_SLICE],
    ]
    for args in ways:
        pulled = rayform("pull", "--json", *args)
        assert pulled.returncode == 0, (args, pulled.stderr)
        assert json.loads(pulled.stdout)["blobs"] == 8, args


def test_an_abbreviated_or_mistyped_option_is_an_error_of_its_subcommand() -> None:
    # --stream was read as --streams: it pulled what the user may not have meant.
    said = _usage_error(rayform("pull", DEMO_SLICE, "--stream", "cam0/rgb"), "rayform pull")
    assert "unrecognized arguments: --stream cam0/rgb" in said
    assert "did you mean --streams?" in said
    said = _usage_error(rayform("cache", "du", "--limt", "10GB"), "rayform cache du")
    assert "did you mean --limit?" in said
    said = _usage_error(rayform("cache", "prune", "--max", "1GB"), "rayform cache prune")
    assert "required: --max-size" in said  # --max was not read as --max-size either
    after = rayform("pull", "--streams", "a/b", "--", DEMO_SLICE, "--quiet")
    assert "--quiet is an option: put it before --" in _usage_error(after, "rayform pull")


def test_a_size_may_have_a_space_before_its_unit(isolated_env: Path) -> None:
    for spelled in (["10", "GB"], ["10 GB"], ["10GB"]):
        pruned = rayform("cache", "prune", "--max-size", *spelled, "--json")
        assert pruned.returncode == 0, (spelled, pruned.stderr)
        assert json.loads(pruned.stdout) == {"evicted": [], "evicted_bytes": 0}
    du = rayform("cache", "du", "--limit", "2", "KiB", "--json")
    assert du.returncode == 0 and json.loads(du.stdout)["limit"] == 2048
    said = _usage_error(
        rayform("cache", "prune", "--max-size", "10", "GB", "x"), "rayform cache prune"
    )
    assert "'10 GB x' is not one size" in said
    bad = rayform("cache", "prune", "--max-size", "ten", "GB")
    assert bad.returncode == 1 and "cannot read size 'tenGB'" in bad.stderr


def test_no_endpoint_names_the_command_lines_fix(isolated_env: Path) -> None:
    for args in (("pull", DEMO_SLICE), ("slices", "ls"), ("slices", "show", DEMO_SLICE)):
        result = rayform(*args)
        assert result.returncode == 1 and result.stdout == "", args
        assert result.stderr == (
            "rayform: error: no server endpoint: pass --endpoint https://... or set "
            "RAYFORM_ENDPOINT (or --offline to read only the cache)\n"
        ), args
    assert "no slices are remembered" in rayform("slices", "ls", "--offline").stderr


@pytest.mark.parametrize("value", ["2", "enabled"])
def test_an_on_off_variable_that_is_neither_is_an_error(
    value: str, client_env: ServerProcess
) -> None:
    env = {**os.environ, "RAYFORM_OFFLINE": value}
    result = rayform("slices", "ls", env=env)
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr.startswith(
        f"rayform: error: RAYFORM_OFFLINE={value!r} is not an on/off value"
    )
    assert "1, true, yes or on" in result.stderr and "or unset it" in result.stderr
    for on_or_off in ("yes", "off"):
        assert (
            rayform("slices", "ls", "--json", env={**env, "RAYFORM_OFFLINE": on_or_off}).returncode
            == 0
        )
