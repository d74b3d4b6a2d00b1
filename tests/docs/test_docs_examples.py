"""Every shell and Python example of README.md and docs/ runs against the demo slice, or says
why not. How a doc author marks blocks and shows output: docs/contributing-docs.md (and the
docstring of ``support/docblocks.py``).

The demo root (``rayform-server demo``, the full 20 episodes) and small stand-in recordings
are built once; each page gets a fresh working directory holding them, its own server of that
``data/`` and an empty cache, so its outputs do not depend on which pages ran before it.
"""

from __future__ import annotations

import contextlib
import difflib
import fcntl
import json
import os
import pty
import shutil
import signal
import struct
import subprocess
import sys
import termios
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import DEMO_SLICE, TOKEN, WRITE_TOKEN, ServerProcess
from support.docblocks import (
    REPO,
    Block,
    collect,
    doc_files,
    matches,
    normalise,
    terminal,
    transcript,
)

BIN = Path(sys.executable).parent
RUNNER = Path(__file__).resolve().parents[1] / "support" / "scripts" / "docrunner.py"
PAGES = doc_files()


@pytest.fixture(scope="module")
def docs_inputs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """What every page's working directory starts with: ``data/``, the demo root as a user
    builds it (`rayform-server demo --root data/`, docs/server.md), and small recordings that
    stand in for a reader's own: ``my_lerobot_dataset/`` (LeRobot v2.1 layout, 4 episodes of
    4 s at 10 fps: a 64x48 camera, state and action, two tasks per episode, LeRobot 0.6.1's
    language columns) and ``bags/run_001.mcap``,
    ``bags/run_002.mcap`` (ROS 2 bags: two cameras, joint states, a pose)."""
    from support.recordings import write_bag, write_lerobot_v21

    inputs = tmp_path_factory.mktemp("docs-inputs")
    subprocess.run(
        [str(BIN / "rayform-server"), "demo", "--root", str(inputs / "data")],
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        timeout=900,
    )
    write_lerobot_v21(
        inputs / "my_lerobot_dataset",
        episodes=4,
        n=40,
        fps=10,
        action=True,
        tasks=["pick up the cube", "put it in the bin", "push the cube left"],
        language=True,
    )
    (inputs / "bags").mkdir()
    for k in (1, 2):
        write_bag(inputs / "bags" / f"run_00{k}.mcap", seed=k)
    return inputs


@pytest.fixture
def page_env(docs_inputs: Path, tmp_path: Path) -> Iterator[tuple[Path, dict[str, str]]]:
    """A fresh working directory (a copy of ``docs_inputs``, by hard links: stored files are
    never modified in place), its ``data/`` served on a loopback port with a token, and the
    environment a reader has set: RAYFORM_ENDPOINT, RAYFORM_TOKEN (also $TOKEN), a write token
    in $WRITE_TOKEN (docs/curation.md) and an empty RAYFORM_CACHE_DIR. Processes a page
    leaves running (`... &`) are stopped afterwards."""
    cwd = tmp_path / "work"
    shutil.copytree(docs_inputs, cwd, copy_function=os.link)
    server = ServerProcess(cwd / "data", "--write-token", WRITE_TOKEN)
    env = _env(server, tmp_path / "cache")
    try:
        yield cwd, env
    finally:
        server.stop()
        for pgid in _GROUPS:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGTERM)
        _GROUPS.clear()


_GROUPS: list[int] = []  # process groups of the page's shell commands, for the cleanup


def _env(server: ServerProcess, cache: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAYFORM_")}
    env.update(
        RAYFORM_ENDPOINT=server.url,
        RAYFORM_TOKEN=TOKEN,
        TOKEN=TOKEN,
        WRITE_TOKEN=WRITE_TOKEN,
        RAYFORM_CACHE_DIR=str(cache),
        PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}",
        OMP_NUM_THREADS="1",
        PYTHONUNBUFFERED="1",
    )
    return env


def _shell(cmd: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    proc = subprocess.Popen(
        ["bash", "-eu", "-c", cmd],
        cwd=cwd,
        env=env,
        text=True,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    _GROUPS.append(proc.pid)
    out, _ = proc.communicate(timeout=300)
    return subprocess.CompletedProcess(cmd, proc.returncode, out)


def _in_terminal(cmd: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """Run ``cmd`` with stdout and stderr on a pseudo-terminal, so that it prints what a user
    at a terminal sees (progress bars redraw in place), and return that text."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))  # 80 columns
    try:
        # As typed at an interactive prompt: no -e, no pipefail (`... | head -3` is fine).
        proc = subprocess.Popen(
            ["bash", "-c", cmd],
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=slave,
            stderr=slave,
            start_new_session=True,
        )
        _GROUPS.append(proc.pid)
    finally:
        os.close(slave)
    chunks: list[bytes] = []
    try:
        while True:
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: every writer of the terminal has gone
                break
            if not data:
                break
            chunks.append(data)
    finally:
        os.close(master)
    code = proc.wait(timeout=300)
    return subprocess.CompletedProcess(cmd, code, b"".join(chunks).decode("utf-8", "replace"))


def _run_shell(block: Block, cwd: Path, env: dict[str, str]) -> None:
    commands = transcript(block)
    if commands is None:
        result = _shell(block.text, cwd, env)
        assert result.returncode == 0, (
            f"{block.where}: the script exited {result.returncode}:\n{result.stdout[-4000:]}"
        )
        return
    for c in commands:
        result = _in_terminal(c.cmd, cwd, env)
        where = f"{block.where.rsplit(':', 1)[0]}:{c.line}"
        assert "Traceback" not in result.stdout, f"{where}: `{c.cmd}`:\n{result.stdout[-4000:]}"
        if not any("error" in line for line in c.expected):
            assert result.returncode == 0, (
                f"{where}: `{c.cmd}` exited {result.returncode}:\n{result.stdout[-4000:]}"
            )
        actual = [normalise(ln, cwd) for ln in terminal(result.stdout)]
        expected = [normalise(ln) for ln in c.expected]
        if not matches(expected, actual):
            diff = "\n".join(
                difflib.unified_diff(expected, actual, "shown in the doc", "printed", lineterm="")
            )
            pytest.fail(
                f"{where}: `{c.cmd}` printed something else than the doc shows "
                f"(after normalising timings, rates, ports, paths):\n{diff}"
            )


def _run_python(blocks: list[Block], cwd: Path, env: dict[str, str]) -> None:
    spec = cwd.parent / f"blocks-{blocks[0].line}.json"
    spec.write_text(json.dumps([{"where": b.where, "code": b.text} for b in blocks]))
    result = subprocess.run(
        [sys.executable, str(RUNNER), str(spec)],
        cwd=cwd,
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-6000:]


def test_every_block_runs_or_says_why_not() -> None:
    problems: list[str] = []
    runnable = 0
    for page in PAGES:
        blocks, bad = collect(page)
        problems += bad
        runnable += sum(b.runs for b in blocks)
    assert not problems, "\n".join(problems)
    assert runnable >= 20  # the collector finds the examples at all


# The first page that runs builds the full demo slice (~25 s on an idle 2-core machine, a few
# minutes when the machine is shared), and README.md's loader starts up to 8 workers.
@pytest.mark.timeout(900)
@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(REPO)) for p in PAGES])
def test_examples_of_the_page_run(page: Path, request: pytest.FixtureRequest) -> None:
    blocks, problems = collect(page)
    assert not problems, "\n".join(problems)
    if not any(b.runs for b in blocks):
        return  # nothing to run: no server needed
    cwd, env = request.getfixturevalue("page_env")
    pending: list[Block] = []  # consecutive Python blocks share one interpreter
    for block in [b for b in blocks if b.runs]:
        if block.lang in ("python", "pycon", "py"):
            pending.append(block)
            continue
        if pending:
            _run_python(pending, cwd, env)
            pending = []
        _run_shell(block, cwd, env)
    if pending:
        _run_python(pending, cwd, env)


@pytest.mark.timeout(900)
def test_a_changed_output_fails(page_env: tuple[Path, dict[str, str]]) -> None:
    """The comparison is not vacuous: a doc that shows a stale number fails."""
    cwd, env = page_env
    block = Block(
        REPO / "docs" / "stale.md",
        1,
        "console",
        f"$ rayform slices ls\n{DEMO_SLICE}  1b446bd59659  demo\n",
        None,
    )
    with pytest.raises(pytest.fail.Exception, match="printed something else"):
        _run_shell(block, cwd, env)


def test_markers_need_a_reason_and_a_fence(tmp_path: Path) -> None:
    page = REPO / "docs" / "_scratch_not_a_page.md"  # never written: collect() gets the text
    text = (
        "<!-- not-run -->\n```sh\nfalse\n```\n\n"
        "<!-- not-run: needs a GPU -->\n\nsome prose\n\n"
        "<!-- not-run: needs a cluster -->\n```python\nimport nothing\n```\n"
        "```console\n$ echo hi\nhi\n```\n"
    )
    scratch = tmp_path / "page.md"
    scratch.write_text(text)
    blocks, problems = collect(scratch, rel=page.relative_to(REPO))
    assert problems == [
        "docs/_scratch_not_a_page.md:1: a not-run marker needs a reason: <!-- not-run: <reason> -->",
        "docs/_scratch_not_a_page.md:6: a not-run marker must be on the line right before a "
        "block's opening fence",
    ]
    assert [(b.lang, b.runs, b.not_run) for b in blocks] == [
        ("sh", False, ""),
        ("python", False, "needs a cluster"),
        ("console", True, None),
    ]


def test_transcripts_and_matching() -> None:
    block = Block(
        REPO / "README.md",
        10,
        "console",
        "$ echo a \\\n  b\na b\n$ true\n\n$ seq 5\n1\n...\n5\n",
        None,
    )
    commands = transcript(block)
    assert commands is not None
    assert [(c.line, c.cmd, c.expected) for c in commands] == [
        (11, "echo a \\\n  b", ["a b"]),  # bash -c joins the lines at the backslash
        (14, "true", []),
        (16, "seq 5", ["1", "...", "5"]),
    ]
    assert matches(["1", "...", "5"], ["1", "2", "3", "4", "5"])
    assert matches(["1", "...", "5"], ["1", "5"])
    assert not matches(["1", "...", "5"], ["1", "2"])
    assert matches(["took ... to run"], ["took 3 weeks to run"])
    assert not matches(["a"], ["a", "b"])
    assert terminal("50%\r100%\nnext\r\n\n") == ["100%", "next"]
    assert terminal("long line\rshort\n") == ["shortline"]
    assert normalise("fetched 3 (1 MiB) in 0.8 s (29.5 MiB/s) from 127.0.0.1:4567") == (
        "fetched 3 (1 MiB) in <duration> (<rate>) from <host>:<port>"
    )
    assert normalise("x: 100%|██████▌   | 1.0M/2.0M [00:01<00:02, 1.2MB/s]") == (
        "x: 100%|<bar>| 1.0M/2.0M [<elapsed<eta, rate>]"
    )


def test_a_python_block_that_prints_something_else_fails(tmp_path: Path) -> None:
    spec = tmp_path / "blocks.json"
    spec.write_text(
        json.dumps(
            [
                {"where": "docs/x.md:1", "code": "value = 41\n"},
                {"where": "docs/x.md:5", "code": ">>> value + 1\n42\n"},  # shares the namespace
                {"where": "docs/x.md:9", "code": ">>> value\n40\n"},
            ]
        )
    )
    result = subprocess.run(
        [sys.executable, str(RUNNER), str(spec)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 1
    assert "FAILED: docs/x.md:9: 1 doctest example(s) differ" in result.stdout
    assert "FAILED: docs/x.md:5" not in result.stdout
