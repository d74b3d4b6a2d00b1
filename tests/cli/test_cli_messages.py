"""What a newcomer sees: each message and exit code of the command line, checked in real
subprocesses of `rayform`, `rayform-server` and `python`, stream by stream (stdout vs stderr)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from support import DEMO_SLICE, SCRIPTS, TOKEN, ServerProcess

BIN = Path(sys.executable).parent  # the console scripts installed next to this interpreter
SDK = Path(__file__).resolve().parents[2] / "sdk"


def _run(
    cmd: list[str], *, stdout: int | None = subprocess.PIPE, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        cmd,
        stdout=stdout,
        stderr=subprocess.PIPE,
        text=True,
        timeout=120,
        env=env if env is not None else dict(os.environ),
    )
    assert "Traceback" not in result.stderr, result.stderr
    assert "Exception ignored" not in result.stderr, result.stderr
    assert TOKEN not in (result.stdout or "") + result.stderr
    return result


def rayform(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return _run([str(BIN / "rayform"), *args], env=env)


def rayform_server(*args: str) -> subprocess.CompletedProcess[str]:
    return _run([str(BIN / "rayform-server"), *args])


def _into_closed_pipe(cmd: list[str]) -> subprocess.CompletedProcess[str]:
    """Run ``cmd`` with stdout a pipe whose reader is already gone: ``cmd | head -0``, without
    the race of when `head` exits."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        return _run(cmd, stdout=write_end)
    finally:
        os.close(write_end)


# -- a closed pipe -------------------------------------------------------------------------
def test_closed_pipe_ends_quietly_like_coreutils(
    client_env: ServerProcess, demo_root: Path
) -> None:
    assert rayform("pull", DEMO_SLICE, "--quiet").returncode == 0
    for cmd in (
        [str(BIN / "rayform"), "cache", "ls"],
        [str(BIN / "rayform"), "slices", "show", DEMO_SLICE],
        [str(BIN / "rayform-server"), "slices", "--root", str(demo_root)],
    ):
        result = _into_closed_pipe(cmd)
        # 141 = 128 + SIGPIPE, what a shell reports for `yes | head -1`; nothing on stderr.
        assert (result.returncode, result.stderr) == (141, ""), cmd


def test_pipe_into_head_prints_the_first_line(client_env: ServerProcess) -> None:
    shown = subprocess.run(
        f"{BIN / 'rayform'} slices show {DEMO_SLICE} | head -1",
        shell=True,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert (
        shown.stdout.startswith(f"<Slice {DEMO_SLICE} manifest=") and shown.stdout.count("\n") == 1
    )
    assert shown.stderr == ""


# -- the cache directory is a file -----------------------------------------------------------
def test_cache_dir_that_is_a_file_is_one_clear_error(tmp_path: Path) -> None:
    afile = tmp_path / "not-a-dir"
    afile.write_text("x")
    env = {**os.environ, "RAYFORM_CACHE_DIR": str(afile)}
    for args in (
        ("cache", "du"),
        ("cache", "ls"),
        ("cache", "verify"),
        ("slices", "ls", "--offline"),
        ("slices", "show", DEMO_SLICE, "--offline"),
    ):
        result = rayform(*args, env=env)
        assert result.returncode == 1, args
        assert result.stdout == ""
        assert result.stderr == (
            f"rayform: error: the cache directory {afile} is a file, not a directory; set "
            "RAYFORM_CACHE_DIR (or --cache-dir, or cache_dir=) to a directory, e.g. "
            "~/.cache/rayform\n"
        ), args
    below = rayform("cache", "du", "--cache-dir", str(afile / "sub" / "cache"))
    assert below.returncode == 1
    assert f"is under {afile}, which is a file" in below.stderr


def test_cache_dir_that_is_a_file_raises_cache_error_in_python(tmp_path: Path) -> None:
    afile = tmp_path / "not-a-dir"
    afile.write_text("x")
    code = SCRIPTS / "cache_error.py"  # prints the CacheError of rayform.Client(offline=True)
    result = _run([sys.executable, str(code)], env={**os.environ, "RAYFORM_CACHE_DIR": str(afile)})
    assert result.returncode == 0 and result.stderr == ""
    assert result.stdout.startswith(f"CacheError the cache directory {afile} is a file")


# -- --json everywhere docs/cli.md promises it ------------------------------------------------
def test_cache_path_json(isolated_env: Path) -> None:
    result = rayform("cache", "path", "--json")
    assert result.returncode == 0 and result.stderr == ""
    assert result.stdout == f'{{\n  "path": "{isolated_env}"\n}}\n'


def test_every_command_accepts_json() -> None:
    for args in (
        ("pull", "--help"),
        ("slices", "show", "--help"),
        ("slices", "ls", "--help"),
        ("cache", "path", "--help"),
        ("cache", "ls", "--help"),
        ("cache", "du", "--help"),
        ("cache", "verify", "--help"),
        ("cache", "prune", "--help"),
    ):
        result = rayform(*args)
        assert result.returncode == 0 and "--json" in result.stdout, args


# -- slice IDs -------------------------------------------------------------------------------
def test_malformed_slice_id_points_at_slices_ls() -> None:
    result = rayform("slices", "show", "myslice", "--endpoint", "http://127.0.0.1:9")
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr == (
        "rayform: error: malformed slice ID 'myslice': a slice ID is 'slc_' followed by 8 to 64 "
        "lowercase hex digits, e.g. 'slc_7c1e04aa'. `rayform slices ls` lists the slice IDs "
        "your token may read.\n"
    )
    assert "web UI" not in result.stderr


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--resize", "crop"], "--resize crop without --image-size"),
        (["--image-size", "\u00b2x2"], "write HEIGHTxWIDTH in pixels"),
        (["--image-size", "0x5"], "two integers from 1 to 8192"),
        (["--streams", "joints/position,Cam0/RGB"], "malformed stream name 'Cam0/RGB'"),
        (["--streams", ","], "names no stream"),
    ],
)
def test_pull_at_a_resolution_refuses_what_it_cannot_mean(args: list[str], says: str) -> None:
    # Refused before any network access (the endpoint has nothing listening).
    result = rayform("pull", DEMO_SLICE, *args, "--endpoint", "http://127.0.0.1:9")
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr.startswith("rayform: error: ") and says in result.stderr


def test_malformed_new_slice_id_at_ingest_says_how_to_choose_one(tmp_path: Path) -> None:
    bag = tmp_path / "run.mcap"
    bag.write_bytes(b"")
    result = rayform_server(
        "ingest", "mcap", "--root", str(tmp_path / "data"), "--slice", "myslice", str(bag)
    )
    assert result.returncode == 2 and result.stdout == ""
    assert "malformed slice ID 'myslice'" in result.stderr
    assert "Choose a new one" in result.stderr and "secrets.token_hex(4)" in result.stderr
    assert "rayform slices" not in result.stderr and "web UI" not in result.stderr
    # The command it suggests really makes a valid ID.
    suggested = re.search(r'python -c "(.*)"', result.stderr)
    assert suggested is not None
    made = _run([sys.executable, "-c", suggested.group(1)]).stdout.strip()
    assert re.fullmatch(r"slc_[0-9a-f]{8}", made)


# -- tokens ------------------------------------------------------------------------------------
def test_no_token_and_wrong_token_say_different_things(demo_server: ServerProcess) -> None:
    base = {k: v for k, v in os.environ.items() if k != "RAYFORM_TOKEN"}
    base["RAYFORM_ENDPOINT"] = demo_server.url
    missing = rayform("slices", "show", DEMO_SLICE, env=base)
    assert missing.returncode == 1 and missing.stdout == ""
    assert missing.stderr == (
        f"rayform: error: resolving slice {DEMO_SLICE}: the server requires an access token and "
        "RAYFORM_TOKEN is not set; set RAYFORM_TOKEN to your token (or pass token= to "
        "rayform.Client)\n"
    )
    wrong = rayform("slices", "show", DEMO_SLICE, env={**base, "RAYFORM_TOKEN": "wrong-token-123"})
    assert wrong.returncode == 1 and wrong.stdout == ""
    assert "did not accept the access token" in wrong.stderr
    assert "not set" not in wrong.stderr and "wrong-token-123" not in wrong.stderr


# -- offline listing of an empty cache -----------------------------------------------------------
def test_offline_slices_ls_on_an_empty_cache_says_so(isolated_env: Path) -> None:
    result = rayform("slices", "ls", "--offline")
    assert result.returncode == 0 and result.stdout == ""
    assert result.stderr == (
        f"no slices are remembered in the cache {isolated_env}; with network "
        "access, `rayform pull SLICE_ID` into it first\n"
    )
    as_json = rayform("slices", "ls", "--offline", "--json")
    assert (as_json.returncode, as_json.stdout, as_json.stderr) == (0, "[]\n", "")


# -- MCAP files that are not MCAP -------------------------------------------------------------
@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (b"", "the file is empty (0 bytes)"),
        (b"\x89MCAP0\r\n", "EndOfFile while reading the header (truncated file?)"),
        (b"hello\n", "it does not start with the MCAP magic bytes (it starts with b'hello\\n')"),
    ],
)
def test_unreadable_mcap_says_why(tmp_path: Path, content: bytes, reason: str) -> None:
    bag = tmp_path / "run.mcap"
    bag.write_bytes(content)
    result = rayform_server(
        "ingest", "mcap", "--root", str(tmp_path / "data"), "--slice", "slc_4a11ce00", str(bag)
    )
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr == (
        f"rayform-server ingest mcap: error: {bag} is not a readable MCAP "
        f"file: {reason}; pass complete ROS 2 .mcap bags\n"
    )


# -- version, help, dir() ----------------------------------------------------------------------
def test_version() -> None:
    import rayform as package

    result = rayform("--version")
    assert (result.returncode, result.stdout, result.stderr) == (
        0,
        f"rayform {package.__version__}\n",
        "",
    )


def test_top_level_help_lists_every_environment_variable_the_sdk_reads() -> None:
    read = set()
    for path in SDK.rglob("*.py"):
        # Every variable is read by its name as a whole string literal (os.environ or the
        # rayform._env helpers), so the literals are the set the SDK reads.
        read |= set(re.findall(r"""["'](RAYFORM_[A-Z_]+)["']""", path.read_text()))
    assert {"RAYFORM_ENDPOINT", "RAYFORM_TOKEN", "RAYFORM_CACHE_DIR", "RAYFORM_OFFLINE"} <= read
    result = rayform("--help")
    assert result.returncode == 0 and result.stderr == ""
    section = result.stdout.split("environment variables:\n", 1)[1]
    listed = set(re.findall(r"^  (RAYFORM_[A-Z_]+) ", section, flags=re.M))
    assert listed == read


def test_dir_of_the_package_is_the_public_api() -> None:
    code = "import rayform; print(' '.join(dir(rayform)))"
    names = _run([sys.executable, "-c", code]).stdout.split()
    assert {"Client", "Slice", "torch", "errors", "RayformError", "__version__"} <= set(names)
    assert not {"Any", "annotations", "importlib"} & set(names)


def test_slices_ls_on_a_server_with_no_slices_for_the_token_says_so(tmp_path: Path) -> None:
    (tmp_path / "empty-root" / "slices").mkdir(parents=True)
    server = ServerProcess(tmp_path / "empty-root")
    try:
        env = {**os.environ, "RAYFORM_ENDPOINT": server.url, "RAYFORM_TOKEN": TOKEN}
        result = rayform("slices", "ls", env=env)
    finally:
        server.stop()
    assert (result.returncode, result.stdout) == (0, "")
    assert result.stderr == f"your token may read no slices on {server.url}\n"
