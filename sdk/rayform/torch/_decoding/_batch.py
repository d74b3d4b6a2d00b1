"""A batch's frames decoded and resized in one pass, whichever readers (a mixture's sources)
planned them.

A reader plans its part of a batch (:class:`BatchPlan`): tables aligned, paths resolved, and
for every camera read at a training resolution a :class:`ResizeJob` (its frames, its decoder,
its target, and the batch rows it goes to, if any). :func:`run_plans` then decodes the frames
of all jobs of the same decoded size and target into one RGBA buffer and resizes them in one
call, split between threads when a pool is given; ``plan.finish()`` builds the samples.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rayform._resolution import Target
from rayform.torch._decoding._resize import resize_frames
from rayform.torch._decoding._video import DecoderCache

__all__ = ["BatchPlan", "ResizeJob", "run_all", "run_plans"]


@dataclasses.dataclass(frozen=True)
class ResizeJob:
    """Frames of one segment's camera to decode and resize: ``args`` of ``get_frames`` of
    ``decoders`` (its reader's), the decoded ``size`` ``(h, w)`` the manifest gives, and
    ``done``, which receives ``uint8 (U, 3, H, W)``; or, with ``rows`` (per unique frame, the
    batch rows ``(3, H, W)`` it goes to), ``None`` once the frames are written there."""

    done: Future[torch.Tensor | None]
    decoders: DecoderCache
    args: tuple[str, Path, np.ndarray, float, str]
    target: Target
    size: tuple[int, int]
    rows: list[list[torch.Tensor]] | None = None

    @property
    def count(self) -> int:
        """Frames to decode (the unique indices in ``args``)."""
        return len(self.args[2])


#: Decoded (or scaled, when larger) frames held at once per resize call (bytes): bounds the
#: memory of one call (6 RGBA frames of 480x640, 27 of 240x320); a larger one saves little
#: more in calls.
_BUFFER_BYTES = 8 << 20
#: Channels of the decode buffer: RGBA, which torch's resize kernel reads without widening
#: each pixel first (a third less time than RGB, measured at 240x320 and 480x640 to 168x224;
#: the same RGB bits), and which FFmpeg converts to as fast as RGB.
_CHANNELS = 4


@dataclasses.dataclass(frozen=True)
class BatchPlan:
    """One reader's part of a batch, planned (:meth:`SampleReader.plan`): the decodes and
    resizes it still needs, and ``finish()``, which builds its samples once they are done."""

    jobs: list[ResizeJob]
    finish: Callable[[], list[dict[str, Any]]]


def run_plans(
    plans: Sequence[BatchPlan], pool: ThreadPoolExecutor | None = None, threads: int = 1
) -> None:
    """Decode and resize the frames of every plan in one pass: frames of the same decoded
    size and target share buffers and resize calls whichever reader (a mixture's source) they
    come from."""
    jobs = [job for plan in plans for job in plan.jobs]
    if jobs:
        _run_resize_jobs(jobs, pool, threads)


def _run_resize_jobs(jobs: list[ResizeJob], pool: ThreadPoolExecutor | None, threads: int) -> None:
    """Decode and resize ``jobs``: per (target, decoded size), the frames of consecutive jobs
    (up to ``_BUFFER_BYTES``) into one channels-last RGBA buffer, then one resize into one output
    (in ``pool``, decodes are spread over its ``threads`` threads and the resize is split
    between them). Each job's future gets its slice of the output.

    Batching replaces a resize call per segment and camera (with its buffers) by one per
    camera and batch: the same bits, since each frame is resized on its own.
    """
    groups: dict[tuple[Target, tuple[int, int]], list[ResizeJob]] = {}
    for job in jobs:
        groups.setdefault((job.target, job.size), []).append(job)
    for (target, (h, w)), group in groups.items():
        # Bounded by the larger of the decoded and the scaled frame. (One segment's frames are
        # never split: it may take more than the bound.)
        sh, sw = target.plan(h, w).scaled
        per_buffer = max(1, _BUFFER_BYTES // (max(h * w, sh * sw) * _CHANNELS))
        chunk: list[ResizeJob] = []
        held = 0
        for job in group:
            if chunk and held + job.count > per_buffer:
                _decode_and_resize(chunk, target, (h, w), pool, threads)
                chunk, held = [], 0
            chunk.append(job)
            held += job.count
        _decode_and_resize(chunk, target, (h, w), pool, threads)


def _decode_and_resize(
    jobs: list[ResizeJob],
    target: Target,
    size: tuple[int, int],
    pool: ThreadPoolExecutor | None,
    threads: int,
) -> None:
    bounds = np.cumsum([0, *(job.count for job in jobs)])
    total = int(bounds[-1])
    shape = (total, *size, _CHANNELS)
    buffer = np.empty(shape, dtype=np.uint8)
    decodes = [
        functools.partial(job.decoders.get_frames, *job.args, out=buffer[lo:hi])
        for job, lo, hi in zip(jobs, bounds[:-1], bounds[1:], strict=True)
    ]
    run_all(decodes, pool)
    frames = torch.from_numpy(buffer).permute(0, 3, 1, 2)
    cuts = np.linspace(0, total, min(threads, total) + 1).astype(int)
    out: torch.Tensor | None = None
    rows: list[list[torch.Tensor]] | None = None
    if any(job.rows is not None for job in jobs):
        # Frames written straight into their batch rows; a job without rows gets its own
        # tensor, whose rows are its frames.
        rows = []
        for job in jobs:
            if job.rows is None:
                own = torch.empty((job.count, 3, target.height, target.width), dtype=torch.uint8)
                job.done.set_result(own)
                rows.extend([row] for row in own.unbind(0))
            else:
                rows.extend(job.rows)
    else:
        out = torch.empty((total, 3, target.height, target.width), dtype=torch.uint8)
    resizes = [
        functools.partial(
            resize_frames,
            frames[lo:hi],
            target,
            out[lo:hi] if out is not None else None,
            rows[lo:hi] if rows is not None else None,
        )
        for lo, hi in zip(cuts[:-1], cuts[1:], strict=True)
        if hi > lo
    ]
    run_all(resizes, pool)
    for job, lo, hi in zip(jobs, bounds[:-1], bounds[1:], strict=True):
        if out is not None:
            job.done.set_result(out[int(lo) : int(hi)])
        elif job.rows is not None:
            job.done.set_result(None)


def run_all(calls: Sequence[Callable[[], Any]], pool: ThreadPoolExecutor | None) -> None:
    """Run ``calls`` here, or in ``pool`` and wait for all (the first error is raised after
    every call has ended, so no thread still writes into a buffer being dropped)."""
    if pool is None or len(calls) < 2:
        for call in calls:
            call()
        return
    futures = [pool.submit(call) for call in calls]
    wait(futures)
    for future in futures:
        future.result()
