"""``rayform-server ingest ... --ray [ADDRESS]``: the shards of an ingest as Ray tasks, one commit.

Each task stages its recordings (one source file's: an MCAP bag, or the episodes of one LeRobot
data file) in a private staging batch, exactly as a ``--stage --shard`` worker does: blobs are
written to a temporary file under ``ROOT/tmp`` and renamed, staged segments likewise. A task
whose worker dies is run again by Ray (``max_retries``); the rerun replaces the staged file of
each segment it redoes, and blobs are content-addressed, so a killed attempt leaves nothing the
commit keeps. When every task is done the driver commits once (the serial ingest's manifest,
byte for byte), then sweeps what killed attempts left: the batch and the temporary files that
appeared under ``ROOT/tmp`` during the run. The data root must be a filesystem every Ray node
mounts at the same path (or an S3 blob store recorded in the root).
"""

from __future__ import annotations

import secrets
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rayform.errors import InvalidArgumentError
from rayform.manifest import ColumnarManifest
from rayform_server.ingest._common import Progress
from rayform_server.staging import Shard, commit_staged
from rayform_server.store import Store

__all__ = ["MAX_RETRIES", "FileShard", "group_by_file", "run_on_ray"]

#: Times Ray runs a task again after its worker died (a SIGKILL, a lost node).
MAX_RETRIES = 3


@dataclass(frozen=True)
class FileShard(Shard):
    """The recordings of one source file: position ``i`` is this shard's when
    ``groups[i] == index`` (``groups`` from :func:`group_by_file`)."""

    groups: tuple[int, ...] = ()

    def mine(self, position: int) -> bool:
        """Whether the recording at ``position`` comes from this shard's source file."""
        return self.groups[position] == self.index


def group_by_file(files: Sequence[Any]) -> tuple[int, ...]:
    """Each recording's group: the first-seen order of its source file (``files[i]``)."""
    seen: dict[Any, int] = {}
    return tuple(seen.setdefault(f, len(seen)) for f in files)


def run_on_ray(
    store: Store,
    slice_id: str,
    groups: tuple[int, ...],
    description: str,
    progress: Progress,
    worker: Callable[[str, Shard, bool], object],
    *,
    address: str | None,
    max_retries: int = MAX_RETRIES,
) -> ColumnarManifest:
    """Run ``worker(batch, shard, verbose)`` as one Ray task per source file, then commit once.

    Args:
        store: the shared data root.
        slice_id: the slice to create or replace.
        groups: each recording's source-file group (:func:`group_by_file`).
        description: the slice's description (the serial ingest's).
        progress: where the driver reports: a progress bar of finished tasks on a terminal,
            else a line per finished task.
        worker: a picklable function staging one shard's recordings in a batch.
        address: the Ray cluster (``ray.init(address=...)``; ``None``: ``RAY_ADDRESS`` or a
            local Ray). An already connected driver is used as it is.
        max_retries: runs of a task after its worker died.

    Raises:
        InvalidArgumentError: Ray is not installed, or a task failed (the batch is removed and
            no slice is made).
    """
    try:
        import ray
    except ImportError:
        raise InvalidArgumentError(
            "--ray needs Ray: pip install 'rayform[ray]' (and the server extra)"
        ) from None
    count = max(groups) + 1 if groups else 0
    if count == 0:
        raise InvalidArgumentError("nothing to ingest: no recordings found")
    connected = ray.is_initialized()
    if not connected:
        ray.init(address=address or None, log_to_driver=False)
    batch = f"ray-{secrets.token_hex(6)}"
    tmp = store.root / "tmp"
    before = set(tmp.iterdir()) if tmp.is_dir() else set()
    task = ray.remote(num_cpus=1, max_retries=max_retries, retry_exceptions=False)(_run_worker)
    progress(f"{count} Ray tasks (one per source file), staging in batch {batch}")
    t0 = time.perf_counter()
    bar = progress.bar(count, unit="task", desc=f"[{progress.prefix}] Ray tasks done")
    try:
        pending = [
            task.remote(worker, batch, FileShard(k, count, groups), progress.stream is not None)
            for k in range(count)
        ]
        done = 0
        while pending:
            ready, pending = ray.wait(pending, num_returns=1)
            try:
                ray.get(ready)
            except Exception as exc:
                raise InvalidArgumentError(f"an ingest task failed on Ray: {exc}") from exc
            done += 1
            if bar is not None:
                bar.update(1)
            else:
                progress(f"[{done}/{count}] tasks done in {time.perf_counter() - t0:.1f} s")
        if bar is not None:
            bar.close()
            bar = None
        digest = commit_staged(store, batch, slice_id, description)
    finally:
        if bar is not None:  # a task failed: the bar stops where it was
            bar.close()
        shutil.rmtree(store.root / "staging" / batch, ignore_errors=True)
        _sweep(tmp, before)
        if not connected:
            ray.shutdown()
    manifest = store.load_manifest(digest)
    progress(
        f"slice {slice_id} -> manifest {manifest.hash[:16]}... ({len(manifest.segments)} segments)"
    )
    return manifest


def _run_worker(
    worker: Callable[[str, Shard, bool], object], batch: str, shard: Shard, verbose: bool
) -> None:
    worker(batch, shard, verbose)


def _sweep(tmp: Path, before: set[Path]) -> None:
    """Remove the temporary files that appeared under ``tmp`` during the run: every task is
    over, so they are what killed attempts left (their reruns wrote their own)."""
    if not tmp.is_dir():
        return
    for path in set(tmp.iterdir()) - before:
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
