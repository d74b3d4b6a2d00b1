"""The training loop tests/ray/ runs under Ray Train's ``TorchTrainer`` (docs/ray.md's loop).

Every rank appends what it trained on, one JSON line per sample (``epoch``, ``segment``,
``t_ns``, ``rank``, ``world``), to its own file under ``config["log"]`` before the step's
checkpoint, so a test can check what was trained, missed or repeated across a kill, a restart
and a resume on another number of workers.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import time
from collections import Counter
from pathlib import Path
from typing import Any

__all__ = ["BATCH", "FPS", "epoch_samples", "loop_config", "read_log", "train_loop"]

BATCH = 8
FPS = 10.0


class _Seen(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def train_loop(config: dict[str, Any]) -> None:
    """One Ray Train worker: the loop of docs/ray.md, with the test's kill and stop points, and
    a report after every batch (docs/ray.md's reports every ``REPORT_EVERY`` batches), so that
    a restart repeats at most one batch per rank.

    ``config``: ``endpoint``, ``token``, ``cache``, ``slice``, ``segments``, ``fps``,
    ``epochs``, ``log`` (a directory), and optionally ``kill_rank``/``kill_at`` (that rank
    SIGKILLs itself once, after logging its ``kill_at``-th batch of a fresh start and Ray
    registering the reports before it (``run_dir``), before that step's report), ``stop_at``
    (every rank returns after the report that puts the sampler at this many keys per rank in
    the first epoch: a pre-emption), ``leave_node``/``leave_at`` (the rank on that Ray node,
    after logging its ``leave_at``-th batch of a fresh start and Ray registering the reports
    before it, writes ``leaving`` into the log directory and waits there, before that step's
    report, for the test to take its node away), ``check_swap`` (rank 0 also
    reads one batch through Ray's own ``prepare_data_loader`` and logs the warning it got).
    """
    import ray.train
    import ray.train.torch
    from torch.utils.data import DataLoader

    import rayform
    import rayform.ray

    client = rayform.Client(
        endpoint=config["endpoint"], token=config["token"], cache_dir=config["cache"]
    )
    slice_ = client.slices.get(config["slice"])
    dataset = rayform.torch.EpisodeDataset(
        slice_,
        obs=["joints/position"],
        action="joints/position_delta",
        fps=config["fps"],
        segments=config["segments"],
    )
    sampler = rayform.torch.EpisodeSampler(dataset)
    loader = rayform.ray.prepare_data_loader(
        DataLoader(
            dataset,
            batch_size=BATCH,
            sampler=sampler,
            num_workers=1,
            collate_fn=rayform.torch.collate,
        )
    )
    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    log_dir = Path(config["log"])
    info = {
        "rank": rank,
        "world": world,
        "shard": list(dataset.shard),
        "sampler": type(loader.sampler).__name__,
        "node": ray.get_runtime_context().get_node_id(),
    }
    if config.get("check_swap"):
        seen = _Seen()
        logging.getLogger("rayform.torch").addHandler(seen)
        swapped = ray.train.torch.prepare_data_loader(
            DataLoader(
                dataset,
                batch_size=BATCH,
                sampler=sampler,
                num_workers=0,
                collate_fn=rayform.torch.collate,
            )
        )
        next(iter(swapped))
        info["swapped_sampler"] = type(swapped.sampler).__name__
        info["warnings"] = [m for m in seen.messages if "EpisodeSampler" in m]
    (log_dir / f"info-{os.getpid()}-{rank}.json").write_text(json.dumps(info))

    start = rayform.ray.restore_sampler(sampler)
    fresh = start is None
    out = (log_dir / f"samples-{os.getpid()}-{rank}.jsonl").open("a")
    for epoch in range(start or 0, config["epochs"]):
        dataset.set_epoch(epoch)
        for step, batch in enumerate(loader):
            for seg, t in zip(batch["meta"]["segment"], batch["t_ns"].tolist(), strict=True):
                out.write(
                    json.dumps(
                        {"epoch": epoch, "segment": seg, "t_ns": t, "rank": rank, "world": world}
                    )
                    + "\n"
                )
            out.flush()
            os.fsync(out.fileno())
            if fresh and rank == config.get("kill_rank") and step + 1 == config.get("kill_at"):
                marker = log_dir / "killed"
                if not marker.exists():
                    _wait_registered(Path(config["run_dir"]), reports=step)
                    marker.write_text(str(os.getpid()))
                    os.kill(os.getpid(), signal.SIGKILL)
            if (
                fresh
                and info["node"] == config.get("leave_node")
                and step + 1 == config.get("leave_at")
            ):
                _wait_registered(Path(config["run_dir"]), reports=step)
                (log_dir / "leaving").write_text(json.dumps({"rank": rank, "pid": os.getpid()}))
                time.sleep(600)  # the node goes away under this rank
            consumed = (step + 1) * BATCH
            rayform.ray.report({"epoch": epoch, "step": step}, sampler, consumed=consumed)
            position = sampler.state_dict(consumed=consumed)["history"][-1][1]
            if epoch == 0 and position == config.get("stop_at"):
                out.close()
                return
    out.close()


def _wait_registered(run_dir: Path, reports: int, timeout: float = 120.0) -> None:
    """Wait until Ray's controller has registered ``reports`` checkpoints of the run.

    Ray Train registers a report when its controller next polls the workers (every
    ``RAY_TRAIN_HEALTH_CHECK_INTERVAL_S``); a worker killed before that restarts from the one
    before. The test kills after the registration, so what it checks is the resume itself.
    """
    deadline = time.monotonic() + timeout
    snapshot = run_dir / "checkpoint_manager_snapshot.json"
    while time.monotonic() < deadline:
        try:
            if len(json.loads(snapshot.read_text())["checkpoint_results"]) >= reports:
                return
        except (OSError, ValueError, KeyError):
            pass
        time.sleep(0.2)
    raise TimeoutError(f"Ray did not register {reports} checkpoints of {run_dir} in {timeout} s")


def loop_config(endpoint: str, tmp_path: Path, **extra: Any) -> dict[str, Any]:
    """:func:`train_loop`'s config over the first 4 episodes of the demo slice served at
    ``endpoint``, one epoch, logging under ``tmp_path / "log"``; ``extra`` adds or overrides."""
    from support import DEMO_SLICE, TOKEN, make_client

    client = make_client(endpoint, tmp_path / "cache")
    segments = client.slices.get(DEMO_SLICE).segments.ids().to_pylist()[:4]
    log = tmp_path / "log"
    log.mkdir(exist_ok=True)
    return {
        "endpoint": endpoint,
        "token": TOKEN,
        "cache": str(tmp_path / "cache"),
        "slice": DEMO_SLICE,
        "segments": segments,
        "fps": FPS,
        "epochs": 1,
        "log": str(log),
        **extra,
    }


def epoch_samples(config: dict[str, Any]) -> Counter[tuple[str, int]]:
    """Every sample of the epoch :func:`train_loop` runs, as (segment, t_ns), from the dataset."""
    import rayform
    from support import make_client

    client = make_client(config["endpoint"], Path(config["cache"]))
    ds = rayform.torch.EpisodeDataset(
        client.slices.get(config["slice"]),
        obs=["joints/position"],
        action="joints/position_delta",
        fps=config["fps"],
        segments=config["segments"],
        shard=None,
    )
    return Counter((s["meta"]["segment"], int(s["t_ns"])) for s in ds.__getitems__(range(len(ds))))


def read_log(log_dir: Path) -> list[dict[str, Any]]:
    """Every sample line the ranks of every run and attempt logged under ``log_dir``."""
    rows: list[dict[str, Any]] = []
    for path in sorted(log_dir.glob("samples-*.jsonl")):
        rows.extend(json.loads(line) for line in path.read_text().splitlines() if line)
    return rows
