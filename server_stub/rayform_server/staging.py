"""Distributed ingest: many processes stage segments, one step commits the slice.

Each worker (a SLURM array task, a Kubernetes job pod, a process of a pool) builds its
episodes with :class:`~rayform_server.builder.SliceBuilder` (the blobs go into the shared blob
store as it goes) and stages each finished segment as one small JSON file::

    ROOT/staging/<batch>/<segment_id>.json     {"order": ..., "segment": <v1 segment JSON>}

written to a temporary file and renamed, so a worker killed at any instant leaves either the
whole file or none; a re-run task replaces its files. Nothing is visible to clients until
:func:`commit_staged` (one process, once every worker is done) reads the batch, checks that
every blob it names is in the store, builds one version 2 manifest (3 when cameras have
renditions, rendered by the workers) in ``order`` and points the slice at it; only then is the
batch removed. A crash before the commit leaves no slice.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rayform.errors import InvalidArgumentError
from rayform.format import segments_to_table
from rayform.manifest import Manifest, Segment, canonical_json
from rayform_server.builder import commit_table
from rayform_server.store import Store

__all__ = ["BATCH_RE", "Shard", "add_stage_arguments", "commit_staged", "stage_segment", "staged"]

#: A staging batch name: letters, digits, ``_``, ``.``, ``-`` (1 to 64).
BATCH_RE = re.compile(r"\A[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}\Z")


@dataclass(frozen=True)
class Shard:
    """One worker's share of a distributed ingest: the recordings at positions ``i`` (in the
    ingest's order, from 0) with ``i % count == index``.

    Raises:
        InvalidArgumentError: not ``0 <= index < count``.
    """

    index: int = 0
    count: int = 1

    def __post_init__(self) -> None:
        if not 0 <= self.index < self.count:
            raise InvalidArgumentError(
                f"shard {self.index}/{self.count}: use 0 <= I < N, e.g. --shard 0/4 (this worker's "
                "index and the worker count)"
            )

    @classmethod
    def parse(cls, text: str) -> Shard:
        """``"I/N"``, e.g. ``"3/8"`` (a SLURM array: ``"$SLURM_ARRAY_TASK_ID/$SLURM_ARRAY_TASK_COUNT"``)."""
        try:
            index, count = (int(x) for x in text.split("/"))
        except ValueError:
            raise InvalidArgumentError(
                f"--shard {text!r}: use I/N, e.g. --shard 0/4 (this worker's index and the worker count)"
            ) from None
        return cls(index, count)

    def mine(self, position: int) -> bool:
        """Whether this worker handles the recording at ``position``."""
        return position % self.count == self.index


def add_stage_arguments(parser: argparse.ArgumentParser, recordings: str) -> None:
    """``--stage BATCH`` and ``--shard I/N`` (default ``None``: every one of ``recordings``)
    for a command that can be one worker of a distributed build."""
    parser.add_argument(
        "--stage",
        metavar="BATCH",
        default=None,
        help=f"one worker of a distributed build: stage this worker's {recordings} in BATCH "
        "(in the shared root) instead of making the slice; then `rayform-server commit "
        "--stage BATCH` once every worker is done",
    )
    parser.add_argument(
        "--shard",
        metavar="I/N",
        default=None,
        help=f"with --stage: the {recordings} i with i %% N == I (default: all), e.g. "
        "$SLURM_ARRAY_TASK_ID/$SLURM_ARRAY_TASK_COUNT",
    )


def _batch_dir(store: Store, batch: str) -> Path:
    if not isinstance(batch, str) or not BATCH_RE.fullmatch(batch):
        raise InvalidArgumentError(
            f"staging batch {batch!r}: use 1 to 64 letters, digits, '_', '.' or '-', e.g. 'run-0412'"
        )
    return store.root / "staging" / batch


def stage_segment(store: Store, batch: str, segment: Segment, order: str | None = None) -> Path:
    """Stage ``segment`` (its blobs already in ``store``) in ``batch``; returns the file.

    Args:
        store: the shared data root.
        batch: the staging batch, shared by every worker of one ingest.
        segment: a segment returned by :meth:`SliceBuilder.add_segment`.
        order: sort key of the segment in the committed slice (default: its ID).
    """
    folder = _batch_dir(store, batch)
    folder.mkdir(parents=True, exist_ok=True)
    doc = {"order": order if order is not None else segment.id, "segment": segment.to_json()}
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".part-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(canonical_json(doc))
            f.flush()
            os.fsync(f.fileno())
        dest = folder / f"{segment.id}.json"
        os.replace(tmp, dest)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return dest


def staged(store: Store, batch: str) -> list[tuple[str, Segment]]:
    """The staged ``(order, segment)`` pairs of ``batch``, sorted by ``(order, id)``."""
    out = []
    for path in sorted(_batch_dir(store, batch).glob("seg_*.json")):
        try:
            doc: Any = json.loads(path.read_bytes())
            one = Manifest.from_json({"segments": [doc["segment"]]})
            out.append((str(doc["order"]), one.segments[0]))
        except (ValueError, KeyError, TypeError) as exc:
            raise InvalidArgumentError(
                f"staged file {path} is unreadable ({exc}): re-run the task that wrote it"
            ) from exc
    return sorted(out, key=lambda p: (p[0], p[1].id))


def commit_staged(
    store: Store, batch: str, slice_id: str, description: str = "", *, expect: int | None = None
) -> str:
    """Build one version 2 manifest from every segment staged in ``batch``, point
    ``slice_id`` at it and remove the batch. Returns the manifest hash.

    Raises:
        InvalidArgumentError: the batch is empty, holds another count than ``expect``, or names a blob
            missing from the store (a worker died between its blobs and its staging file, or
            wrote to another store).
    """
    pairs = staged(store, batch)
    if not pairs:
        raise InvalidArgumentError(
            f"staging batch {batch!r} in {store.root} holds no segment: run the workers first"
        )
    if expect is not None and len(pairs) != expect:
        raise InvalidArgumentError(
            f"staging batch {batch!r} holds {len(pairs)} segments, expected {expect}: wait for "
            "the remaining workers or re-run the failed ones, then commit again"
        )
    segments = [seg for _, seg in pairs]
    for seg in segments:
        for stream in seg.streams.values():
            for ref in [*stream.blobs(), *(r.blob for r in stream.renditions)]:
                if not store.has_blob(ref.hash):
                    raise InvalidArgumentError(
                        f"segment {seg.id} of batch {batch!r} names blob {ref.hash[:12]}... "
                        f"({stream.name}), which is not in the store: re-run the task that staged it"
                    )
    digest = commit_table(store, segments_to_table(segments), description)
    store.set_slice(slice_id, digest, description)
    shutil.rmtree(_batch_dir(store, batch), ignore_errors=True)
    return digest
