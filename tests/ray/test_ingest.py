"""``rayform-server ingest mcap ... --ray ADDRESS`` on a real local 2-node Ray cluster: one task
per bag, a task whose worker is SIGKILLed mid-task is run again, the one commit on the driver
is the serial ingest's manifest, with nothing left behind, and the driver shows a progress bar
of the finished tasks on a terminal, a line per task elsewhere (docs/ray.md)."""

from __future__ import annotations

import io
import os
import pty
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from support.recordings import write_bag, write_lerobot_v21

from rayform_server.ingest import Progress, ingest_mcap
from rayform_server.store import Store

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::FutureWarning")

SLICE = "slc_0000aaaa"


def _task_pids() -> list[int]:
    """Ray workers of this test's cluster (their RAY_TMPDIR) running an ingest task now."""
    mine = f"RAY_TMPDIR={os.environ['RAY_TMPDIR']}".encode()
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            title = (entry / "cmdline").read_bytes()
            if b"ray::_run_worker" in title and mine in (entry / "environ").read_bytes():
                pids.append(int(entry.name))
        except OSError:
            continue
    return pids


def _kill_one_task(killed: list[int], stop: threading.Event) -> None:
    while not stop.is_set() and not killed:
        for pid in _task_pids():
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
            return
        time.sleep(0.02)


def _on_a_terminal(cmd: list[str], env: dict[str, str], timeout: float) -> tuple[int, str]:
    """Run ``cmd`` with stdout and stderr on a pseudo-terminal (what a user at a terminal
    sees: progress bars redraw in place); its exit code and everything it printed. The
    terminal reports no size, as some container and CI runners' do: the bar must show anyway."""
    master, slave = pty.openpty()
    try:
        proc = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=slave, stderr=slave)
    finally:
        os.close(slave)
    chunks: list[bytes] = []
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            if select.select([master], [], [], 0.5)[0]:
                try:
                    data = os.read(master, 65536)
                except OSError:  # EIO: every writer of the terminal has gone
                    break
                if not data:
                    break
                chunks.append(data)
            elif proc.poll() is not None:
                break
        else:
            proc.kill()
    finally:
        os.close(master)
    code = proc.wait(timeout=30)
    return code, b"".join(chunks).decode("utf-8", "replace")


def test_ingest_on_ray_with_a_killed_worker_is_the_serial_ingest(
    ray_cluster: Any, tmp_path: Path
) -> None:
    bags = []
    for k in range(3):
        bags.append(tmp_path / f"run_{k:03d}.mcap")
        write_bag(bags[-1], seed=k)
    serial = ingest_mcap(Store(tmp_path / "serial"), bags, SLICE, progress=Progress(None))
    assert serial is not None

    root = tmp_path / "on-ray"
    killed: list[int] = []
    stop = threading.Event()
    killer = threading.Thread(target=_kill_one_task, args=(killed, stop), daemon=True)
    killer.start()
    try:
        code, shown = _on_a_terminal(
            [
                sys.executable,
                "-m",
                "rayform_server",
                "ingest",
                "mcap",
                "--root",
                str(root),
                "--slice",
                SLICE,
                "--ray",
                ray_cluster.address,
                *map(str, bags),
            ],
            env={**os.environ, "PYTHONWARNINGS": "ignore"},
            timeout=300,
        )
    finally:
        stop.set()
        killer.join()
    assert code == 0, shown[-3000:]
    assert killed, "no ingest task was running to kill"
    # On a terminal the driver draws a bar of the finished tasks, not a line per task.
    assert "3 Ray tasks" in shown and "tasks done in" not in shown, shown[-3000:]
    assert "[ingest] Ray tasks done: 100%" in shown and "| 3/3 [" in shown, shown[-3000:]
    assert Store(root).get_slice(SLICE)["manifest"] == serial.hash  # the serial manifest
    assert not any((root / "staging").glob("*"))  # the batch is gone
    assert not any((root / "tmp").glob("*"))  # and what the killed attempt left


def test_lerobot_ingest_on_ray_is_the_serial_ingest(ray_cluster: Any, tmp_path: Path) -> None:
    """A LeRobot dataset: one task per data file (v2.1: one per episode), the serial manifest;
    progress into a stream that is not a terminal is a line per finished task."""
    from rayform_server.ingest import ingest_lerobot

    write_lerobot_v21(tmp_path / "ds", episodes=3, tasks=["a", "b"], language=True)
    serial = ingest_lerobot(
        Store(tmp_path / "serial"), tmp_path / "ds", SLICE, progress=Progress(None)
    )
    assert serial is not None and "language/vqa" in serial.segments[0].streams
    out = io.StringIO()  # not a terminal (a log, CI): a line per finished task, no bar
    on_ray = ingest_lerobot(  # the driver already connected to the cluster is used as it is
        Store(tmp_path / "on-ray"), tmp_path / "ds", SLICE, progress=Progress(out), ray=""
    )
    assert on_ray is not None and on_ray.hash == serial.hash
    assert "3 Ray tasks" in out.getvalue() and "[3/3] tasks done" in out.getvalue()
    assert "%|" not in out.getvalue()


class _Terminal(io.StringIO):
    """What a terminal receives: a stream whose ``isatty()`` is true."""

    def isatty(self) -> bool:
        return True


def test_the_progress_bar_is_drawn_only_on_a_terminal() -> None:
    assert Progress(None).bar(3, unit="task", desc="x") is None
    assert Progress(io.StringIO()).bar(3, unit="task", desc="x") is None  # a log: lines
    out = _Terminal()
    bar = Progress(out).bar(3, unit="task", desc="[ingest] Ray tasks done")
    assert bar is not None
    for _ in range(3):
        bar.update(1)
    bar.close()
    assert "[ingest] Ray tasks done: 100%" in out.getvalue() and "3/3" in out.getvalue()
