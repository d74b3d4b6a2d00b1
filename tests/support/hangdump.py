"""A pytest plugin: before pytest-timeout fails a hung test, dump every thread of the test
process and of its child processes (``DataLoader`` workers, servers) into the test's report.

pytest-timeout shows only the main thread of the pytest process; a loader that waits on its
workers needs the workers' stacks. ``faulthandler`` is armed on SIGUSR1 here, at import, so
every forked child inherits the handler and writes to the inherited fd 2, which pytest
captures for the running test: the stacks appear under "Captured stderr call".
"""

from __future__ import annotations

import faulthandler
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

# Seconds before pytest-timeout's own limit; long enough for children to write their stacks.
_AHEAD_S = 20.0


def _children(root: int) -> list[int]:
    """Every live descendant of ``root`` (from /proc; empty where there is no /proc)."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            # The name in field 2 may hold spaces and parentheses: split after its last ')'.
            ppid = int(entry.joinpath("stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        parents.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [root]
    while todo:
        for child in parents.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _catches_usr1(pid: int) -> bool:
    """Whether ``pid`` handles SIGUSR1: a child that exec'd another program (a server
    subprocess) did not inherit the handler, and the signal's default action would kill it."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    caught = next((ln.split()[1] for ln in status.splitlines() if ln.startswith("SigCgt:")), "0")
    return bool(int(caught, 16) >> (signal.SIGUSR1 - 1) & 1)


def _dump() -> None:
    # One process at a time, so that the stacks do not interleave in the shared file.
    for pid in [os.getpid(), *_children(os.getpid())]:
        if pid != os.getpid() and not _catches_usr1(pid):
            continue
        print(f"\n--- hangdump: threads of pid {pid} ---", file=sys.stderr, flush=True)
        try:
            os.kill(pid, signal.SIGUSR1)
        except ProcessLookupError:
            continue
        time.sleep(1.0)


if hasattr(signal, "SIGUSR1"):
    faulthandler.register(signal.SIGUSR1, all_threads=True)


def _limit_s(item: pytest.Item) -> float:
    """pytest-timeout's limit for ``item`` in seconds (0: none, or the plugin is absent)."""
    marker = item.get_closest_marker("timeout")
    if marker and marker.args:
        return float(marker.args[0] or 0)
    try:
        return float(item.config.getoption("timeout", None) or item.config.getini("timeout") or 0)
    except ValueError:  # no such option: pytest-timeout is not installed
        return 0.0


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    # Around setup, call and teardown, as pytest-timeout's own timer (a slow fixture counts).
    limit = _limit_s(item)
    timer = None
    if limit > _AHEAD_S and hasattr(signal, "SIGUSR1"):
        timer = threading.Timer(limit - _AHEAD_S, _dump)
        timer.daemon = True
        timer.start()
    try:
        yield
    finally:
        if timer is not None:
            timer.cancel()
