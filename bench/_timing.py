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

__all__ = ["LOADER_KW", "child_pids", "rss_kib", "time_epoch", "time_loader", "tree_cpu_s"]

#: The DataLoader settings every loader row shares, so that rows differ only in the dataset.
LOADER_KW: dict[str, Any] = {
    "batch_size": 32,
    "num_workers": 2,
    "shuffle": True,
    "persistent_workers": True,
}


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


def tree_cpu_s(pid: int | None = None) -> dict[int, float]:
    """CPU seconds (user + system) of ``pid`` (default: this process) and of every live
    descendant, by pid, from ``/proc``: the difference of two snapshots is what a stretch of
    work cost on every CPU, whoever else loads the machine (a descendant that exits between
    the snapshots takes its seconds with it)."""
    tick = os.sysconf("SC_CLK_TCK")
    out: dict[int, float] = {}
    todo = [pid or os.getpid()]
    while todo:
        p = todo.pop()
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rpartition(")")[2].split()
            todo += child_pids(p)
        except OSError:
            continue
        out[p] = (int(fields[11]) + int(fields[12])) / tick  # utime, stime
    return out


def rss_kib(pid: int) -> tuple[int, int]:
    """``(VmRSS, VmHWM)`` of ``pid`` in KiB (current and peak resident set size)."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            fields[key] = int(value.split()[0])
    return fields["VmRSS"], fields["VmHWM"]


def _epochs(loader: Any) -> Any:
    """The loader's batches, epoch after epoch, as a training loop draws them."""
    while True:
        yield from loader


def time_loader(
    make_loader: Callable[[], Any],
    *,
    batches: int,
    runs: int,
    warmup_batches: int,
    batch_size_of: Callable[[Any], int],
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Time one loader: time to first batch, a warm-up, then ``runs`` timed windows.

    The windows are consecutive stretches of ``batches`` batches of one continuous stream of
    shuffled epochs (a new ``iter(loader)`` whenever an epoch ends, persistent workers
    reused), as a training loop draws them. Samples/s of a window = samples drawn / wall
    seconds from the end of the previous batch to the last one of the window.

    (Until the benchmark of 2026-11-29 afternoon each run was a fresh ``iter()`` abandoned
    after ``batches`` batches: the workers then first finished the up to ``prefetch_factor x
    num_workers`` batches prefetched for the abandoned epoch, which were charged to the next
    run: ~20 % of a 20-batch run for the fastest rows, never paid in a full epoch.)

    Args:
        make_loader: builds the dataset and the ``DataLoader`` (timed: part of the first batch).
        batches: batches per timed window.
        runs: timed windows (the median is reported).
        warmup_batches: batches drawn untimed after the first one.
        batch_size_of: samples in a batch.
        log: where progress lines go.

    Returns:
        ``first_batch_s`` (construction + workers start + first batch, s), ``runs``
        (samples/s of each window), ``samples_per_s`` (median), ``cpu_s_per_sample_runs`` (CPU
        seconds per sample of each window: this process and every descendant, workers and a
        forkserver included, :func:`tree_cpu_s`), ``cpu_s_per_sample`` (median), ``batches``,
        ``loader``.
    """
    t0 = time.perf_counter()
    loader = make_loader()
    stream = _epochs(loader)
    next(stream)
    first = time.perf_counter() - t0
    for _ in range(warmup_batches):
        next(stream)
    rates, cpu = [], []
    for r in range(runs):
        n = 0
        c0, t = tree_cpu_s(), time.perf_counter()
        for _ in range(batches):
            n += batch_size_of(next(stream))
        dt, c1 = time.perf_counter() - t, tree_cpu_s()
        rates.append(n / dt)
        cpu.append(sum(v - c0.get(p, 0.0) for p, v in c1.items()) / n)
        log(f"  window {r + 1}/{runs}: {n} samples in {dt:.2f} s = {n / dt:.1f} samples/s")
    stream.close()  # drops the epoch's iterator: its prefetched batches are discarded
    return {
        "first_batch_s": first,
        "runs": rates,
        "samples_per_s": statistics.median(rates),
        "cpu_s_per_sample_runs": cpu,
        "cpu_s_per_sample": statistics.median(cpu),
        "batches": batches,
        "loader": loader,
    }


def time_epoch(
    make_loader: Callable[[], Any],
    *,
    batch_size_of: Callable[[Any], int],
    exclude_cpu_s: Callable[[], float] = lambda: 0.0,
) -> dict[str, Any]:
    """Time one whole epoch of a fresh loader, the first batch apart.

    The first batch holds what differs most between loaders and least with the data: workers
    that start (a forkserver that imports torch takes seconds) and the first reads. Samples/s
    of the rest of the epoch is what a remote read path sustains.

    Args:
        make_loader: builds the dataset and the ``DataLoader`` (timed in ``first_batch_s``).
        batch_size_of: samples in a batch.
        exclude_cpu_s: CPU seconds so far of something in this process that is not the loader
            (a thread that emulates the network), subtracted from the CPU of the epoch.

    Returns:
        ``first_batch_s`` (construction, workers' start and the first batch, s), ``epoch_s``
        (the same and the rest of the epoch, s), ``samples`` (the epoch's), ``samples_per_s``
        (after the first batch), ``cpu_s_per_sample`` (after the first batch: this process and
        every descendant, :func:`tree_cpu_s`).
    """
    t0 = time.perf_counter()
    loader = make_loader()
    batches = iter(loader)
    n = batch_size_of(next(batches))
    t1, c1, x1 = time.perf_counter(), tree_cpu_s(), exclude_cpu_s()
    rest = 0
    for batch in batches:
        rest += batch_size_of(batch)
    t2, c2, x2 = time.perf_counter(), tree_cpu_s(), exclude_cpu_s()
    cpu = sum(v - c1.get(p, 0.0) for p, v in c2.items()) - (x2 - x1)
    return {
        "first_batch_s": t1 - t0,
        "epoch_s": t2 - t0,
        "samples": n + rest,
        "samples_per_s": rest / (t2 - t1),
        "cpu_s_per_sample": cpu / max(rest, 1),
    }
