"""One benchmark row: time a loader and record how busy the shared machine was meanwhile."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench._timing import time_loader

__all__ = ["loadavg", "loader_row", "log"]


def log(msg: str) -> None:
    print(msg, flush=True)


def loadavg() -> float:
    """1-minute load average (the machine is shared: record how busy it was)."""
    return float(Path("/proc/loadavg").read_text().split()[0])


def _samples(batch: dict[str, Any]) -> int:
    return int(batch["action"].shape[0])


def loader_row(
    name: str, make: Callable[[], Any], args: argparse.Namespace, batches: int | None = None
) -> dict[str, Any]:
    """Time the loader ``make()`` builds (``bench._timing.time_loader``), logging as it goes.

    Args:
        name: the row's title in the log.
        make: builds the dataset and its ``DataLoader``.
        args: the benchmark's options (``runs``, ``warmup``, ``batches``).
        batches: batches per timed window (default ``args.batches``).
    """
    log(f"[bench] {name}")
    load0 = loadavg()
    res = time_loader(
        make,
        batches=args.batches if batches is None else batches,
        runs=args.runs,
        warmup_batches=args.warmup,
        batch_size_of=_samples,
        log=log,
    )
    loader = res.pop("loader")
    del loader  # shuts the persistent workers down
    res["loadavg_1min"] = [load0, loadavg()]
    log(f"  -> {res['samples_per_s']:.1f} samples/s (first batch {res['first_batch_s']:.2f} s)")
    return res
