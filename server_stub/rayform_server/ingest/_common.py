"""Helpers shared by the ingesters: stream specs, names, segment IDs, progress, rates, and
the commit of the segments into one slice."""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TextIO

import numpy as np

from rayform.errors import InvalidArgumentError
from rayform.format import STREAM_NAME_RE, ColumnarManifest, hash_bytes
from rayform_server.builder import SliceBuilder, TableData, TextData, VideoData
from rayform_server.store import Store

if TYPE_CHECKING:
    from rayform_server.staging import Shard

__all__ = [
    "Progress",
    "SegmentInput",
    "check_jobs",
    "commit_segments",
    "nominal_rate_hz",
    "parse_stream_specs",
    "run_jobs",
    "sanitize_stream_name",
    "segment_id_for",
]


def parse_stream_specs(specs: Iterable[str] | None, what: str) -> dict[str, str]:
    """Parse ``--stream NAME=SOURCE`` options into ``{name: source}`` (in the order given).

    Args:
        specs: the raw option values, e.g. ``["cam0/rgb=observation.images.top"]``.
        what: what SOURCE is, for error messages (``"FEATURE"`` or ``"TOPIC[:FIELD]"``).

    Raises:
        InvalidArgumentError: a spec has no ``=``, a bad stream name, or a name given twice.
    """
    out: dict[str, str] = {}
    for spec in specs or ():
        name, sep, source = spec.partition("=")
        name, source = name.strip(), source.strip()
        if not sep or not name or not source:
            raise InvalidArgumentError(
                f"--stream {spec!r}: expected NAME={what}, e.g. --stream cam0/rgb=..."
            )
        if not STREAM_NAME_RE.fullmatch(name) or ".." in name:
            raise InvalidArgumentError(
                f"--stream {spec!r}: {name!r} is not a valid stream name; use lowercase words "
                "separated by '/', e.g. 'cam0/rgb' or 'joints/position'."
            )
        if name in out:
            raise InvalidArgumentError(f"--stream: stream name {name!r} is given twice")
        out[name] = source
    return out


def sanitize_stream_name(parts: Iterable[str]) -> str:
    """Join words into a valid stream name: lowercase, other characters become ``_``.

    At most 5 ``/``-separated components are kept (the last five).
    """
    words = []
    for part in parts:
        word = re.sub(r"[^a-z0-9_.-]", "_", part.lower()).strip(".")
        word = word.replace("..", "_")
        if word:
            words.append(word if word[0] not in "-." else "_" + word)
    return "/".join(words[-5:]) or "stream"


def segment_id_for(*key: str) -> str:
    """A deterministic segment ID: ``seg_`` + the first 16 hex of BLAKE3 of the key parts."""
    return "seg_" + hash_bytes("\0".join(key).encode())[:16]


def nominal_rate_hz(t_ns: np.ndarray, fallback_hz: float = 30.0) -> float:
    """Nominal rate in Hz from timestamps (ns): 1e9 / median interval, rounded to 0.001 Hz."""
    if t_ns.size < 2:
        return float(fallback_hz)
    dt = float(np.median(np.diff(t_ns)))
    return round(1e9 / dt, 3) if dt > 0 else float(fallback_hz)


class Progress:
    """Line-oriented progress output (one line per step), quiet when ``stream`` is None, and a
    progress bar (:meth:`bar`) where ``stream`` is a terminal."""

    def __init__(self, stream: TextIO | None = sys.stderr, prefix: str = "ingest") -> None:
        self.stream = stream
        self.prefix = prefix

    def __call__(self, message: str) -> None:
        if self.stream is not None:
            print(f"[{self.prefix}] {message}", file=self.stream, flush=True)

    def bar(self, total: int, unit: str, desc: str) -> Any | None:
        """A tqdm bar over ``total`` steps on ``stream`` (``update(1)`` per step, ``close()``
        at the end) when ``stream`` is a terminal, as ``rayform pull`` draws its bar; ``None``
        when it is not (a log file, a pipe, CI: print a line per step instead) or is None.

        Args:
            total: the steps expected, e.g. the Ray tasks of an ingest.
            unit: a step's name, e.g. ``"task"``.
            desc: the label before the bar, e.g. ``"[ingest] Ray tasks done"``.
        """
        isatty = getattr(self.stream, "isatty", None)
        if self.stream is None or isatty is None or not isatty():
            return None
        from tqdm.std import tqdm  # type: ignore[import-untyped]

        try:
            columns, lines = os.get_terminal_size(self.stream.fileno())
        except (AttributeError, OSError, ValueError):
            columns = lines = 0
        # A terminal that reports no size (a pseudo-terminal nobody sized, as some container
        # and CI runners give) makes tqdm's bar 0 columns wide, or hides it below a screen of
        # no rows: 80 columns and 24 rows then.
        size: dict[str, Any] = {"dynamic_ncols": True} if columns > 0 else {"ncols": 80}
        if lines <= 0:
            size["nrows"] = 24
        return tqdm(total=total, unit=unit, desc=desc, file=self.stream, mininterval=0.2, **size)


@dataclass
class SegmentInput:
    """One recording, read and ready to store as a segment.

    Attributes:
        id: the segment ID (:func:`segment_id_for`).
        label: names the recording in errors, e.g. ``"episode 3"`` or a file path.
        streams: the segment's streams.
        done: the progress line printed once the segment is stored.
        position: its place in the ingest's order, from 0 (what a staged segment sorts by).
    """

    id: str
    label: str
    streams: Sequence[VideoData | TableData | TextData]
    done: str
    position: int = 0


def commit_segments(
    store: Store,
    slice_id: str,
    segments: Iterable[SegmentInput],
    *,
    description: str,
    site: str,
    gop: int,
    progress: Progress,
    stage: str | None = None,
    renditions: tuple[int, ...] = (),
) -> ColumnarManifest | None:
    """Store every segment's blobs, then write the manifest and point ``slice_id`` at it; or,
    with ``stage``, stage each segment in that batch and commit nothing (one worker of a
    distributed ingest: ``rayform-server commit`` makes the slice once every worker is done).

    ``segments`` may be a generator that reads each recording when asked, so only one
    recording is in memory at a time. The manifest and the slice reference are written only
    after the last segment, so a failure never leaves a half-written slice.

    Returns:
        The manifest, or ``None`` when staging.

    Raises:
        InvalidArgumentError: a segment's streams are inconsistent (the message starts with
            the segment's label), or there is no segment at all.
    """
    from rayform_server.staging import stage_segment

    builder = SliceBuilder(store, description=description, gop=gop, renditions=renditions)
    staged = 0
    for seg in segments:
        try:
            added = builder.add_segment(seg.id, site=site, streams=seg.streams)
        except InvalidArgumentError as exc:
            raise InvalidArgumentError(f"{seg.label}: {exc}") from exc
        if stage is not None:
            # Sorted by position at the commit: the slice's order is the serial ingest's.
            stage_segment(store, stage, added, order=f"{seg.position:012d}")
            staged += 1
        progress(seg.done)
    if stage is not None:
        progress(f"staged {staged} segments in batch {stage}")
        return None
    manifest = builder.commit(slice_id)
    progress(
        f"slice {slice_id} -> manifest {manifest.hash[:16]}... ({len(manifest.segments)} segments)"
    )
    return manifest


def check_jobs(jobs: int, stage: str | None) -> None:
    """``jobs`` is a positive integer, and not combined with ``stage``."""
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise InvalidArgumentError(f"jobs must be a positive integer, e.g. --jobs 4; got {jobs!r}")
    if jobs > 1 and stage is not None:
        raise InvalidArgumentError(
            "--jobs runs local workers that stage and commit by themselves; a --stage worker is "
            "one process: start one per --shard instead"
        )


def run_jobs(
    store: Store,
    slice_id: str,
    jobs: int,
    description: str,
    progress: Progress,
    worker: Callable[[str, Shard, bool], object],
) -> ColumnarManifest:
    """Ingest with ``jobs`` local processes, then commit once: the serial ingest's slice.

    Each process runs ``worker(batch, shard, verbose)``, which stages its share of the
    recordings in a private staging batch; when every one succeeded, the batch is committed
    with ``description`` (so the manifest is byte for byte the serial ingest's) and removed.
    A failure removes the batch and leaves no slice.
    """
    import multiprocessing
    import secrets
    import shutil
    from concurrent.futures import ProcessPoolExecutor

    from rayform_server.staging import Shard, commit_staged

    batch = f"jobs-{secrets.token_hex(6)}"
    progress(f"{jobs} worker processes, staging in batch {batch}")
    try:
        # spawn: each worker starts clean (no inherited threads, codec or Arrow state).
        with ProcessPoolExecutor(
            max_workers=jobs, mp_context=multiprocessing.get_context("spawn")
        ) as pool:
            futures = [
                pool.submit(worker, batch, Shard(k, jobs), progress.stream is not None)
                for k in range(jobs)
            ]
            for future in futures:
                future.result()
        digest = commit_staged(store, batch, slice_id, description)
    finally:
        shutil.rmtree(store.root / "staging" / batch, ignore_errors=True)
    manifest = store.load_manifest(digest)
    progress(
        f"slice {slice_id} -> manifest {manifest.hash[:16]}... ({len(manifest.segments)} segments)"
    )
    return manifest
