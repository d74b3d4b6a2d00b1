"""Loader timing shared by every benchmark row, in both environments.

Imports only the standard library and torch, so the LeRobot row can load this file by path
inside the peer venv (``importlib.util.spec_from_file_location``) and measure exactly the
same way as the rayform rows.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["LOADER_KW", "child_pids", "rss_kib", "time_loader"]

#: The DataLoader settings of every loader row (issue 6).
LOADER_KW: dict[str, Any] = {"batch_size": 32, "num_workers": 2, "shuffle": True,
                             "persistent_workers": True}


def child_pids(pid: int | None = None) -> list[int]:
    """Direct children of ``pid`` (default: this process), from ``/proc``."""
    pid = pid or os.getpid()
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            out += [int(p) for p in (task / "children").read_text().split()]
        except OSError:
            pass
    return sorted(out)


def rss_kib(pid: int) -> tuple[int, int]:
    """``(VmRSS, VmHWM)`` of ``pid`` in KiB (current and peak resident set size)."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            fields[key] = int(value.split()[0])
    return fields["VmRSS"], fields["VmHWM"]


def time_loader(
    make_loader: Callable[[], Any],
    *,
    batches: int,
    runs: int,
    warmup_batches: int,
    batch_size_of: Callable[[Any], int],
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Time one loader: time to first batch, a warm-up, then ``runs`` timed runs.

    Each run is a fresh ``iter(loader)`` (a new shuffled epoch; persistent workers are
    reused) drawing ``batches`` batches. Samples/s of a run = samples drawn / wall seconds,
    from ``iter()`` to the last batch.

    Args:
        make_loader: builds the dataset and the ``DataLoader`` (timed: part of the first batch).
        batches: batches per timed run.
        runs: timed runs (the median is reported).
        warmup_batches: batches drawn untimed after the first one.
        batch_size_of: samples in a batch.
        log: where progress lines go.

    Returns:
        ``first_batch_s`` (construction + workers start + first batch, s), ``runs``
        (samples/s of each run), ``samples_per_s`` (median), ``batches``.
    """
    t0 = time.perf_counter()
    loader = make_loader()
    batches = min(batches, len(loader))
    it = iter(loader)
    next(it)
    first = time.perf_counter() - t0
    for _ in range(warmup_batches):
        next(it)
    del it
    rates = []
    for r in range(runs):
        n = 0
        t = time.perf_counter()
        it = iter(loader)
        for _ in range(batches):
            n += batch_size_of(next(it))
        dt = time.perf_counter() - t
        del it
        rates.append(n / dt)
        log(f"  run {r + 1}/{runs}: {n} samples in {dt:.2f} s = {n / dt:.1f} samples/s")
    return {"first_batch_s": first, "runs": rates, "samples_per_s": statistics.median(rates),
            "batches": batches, "loader": loader}
