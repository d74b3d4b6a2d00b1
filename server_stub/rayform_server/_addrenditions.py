"""``rayform-server renditions``: add renditions to a slice that is already stored.

Every camera video of the slice's current manifest gets, for each requested height it does
not have yet (and that is below the original's), a rendition rendered from the stored
original exactly as ingest renders it (:func:`rayform_server._renditions.render`: same
keyframe interval, rate and frame count, x264 at the renditions' quality). A video stored once
and listed by many segments (``demo --share-blobs``) is rendered once. The new manifest
(the same segments, their streams listing the renditions) is committed in the old one's
format version family and the slice points at it; the old manifest stays in the store and
in the slice's history, so runs logged against it rebuild by hash (docs/protocol.md).

Originals in object storage are downloaded through a presigned URL into the root's ``tmp/``
and checked against their hash before they are decoded. ``jobs > 1`` renders in worker
processes, each opening the store itself.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
import warnings
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx

from rayform.errors import IntegrityError, InvalidArgumentError, NotFoundError
from rayform.format import new_hasher
from rayform.manifest import Manifest, Rendition, Segment, Stream
from rayform.units import human_bytes
from rayform_server._renditions import (
    RenditionSkipped,
    check_heights,
    keyframe_interval,
    render,
    rendition_sizes,
)
from rayform_server.builder import commit_segments
from rayform_server.store import Store

__all__ = ["AddReport", "add_renditions"]


@dataclass(frozen=True)
class _Task:
    """One rendition to render: of the original blob ``original`` at ``size``."""

    original: str
    original_size: int
    size: tuple[int, int]
    rate_hz: float
    gop: int | None
    count: int
    name: str


@dataclass(frozen=True)
class AddReport:
    """What :func:`add_renditions` did.

    Attributes:
        manifest: the slice's manifest hash afterwards (the old one if nothing was added).
        previous: the slice's manifest hash before.
        rendered: renditions rendered and stored (distinct videos).
        added_bytes: their bytes.
        skipped: heights at or above some camera's own height (nothing to store for it).
    """

    manifest: str
    previous: str
    rendered: int
    added_bytes: int
    skipped: tuple[str, ...]


def _local_original(store: Store, task: _Task) -> tuple[Path, bool]:
    """A local path of the original video, and whether it is a temporary copy to delete."""
    path = store.blobs.local_path(task.original)
    if path is not None:
        return path, False
    url = store.blobs.presigned_url(task.original, 3600)
    if url is None:
        raise InvalidArgumentError(
            f"{task.name}: blob {task.original[:12]}... is in {store.blobs.describe()}, "
            "which gives no download URL"
        )
    fd, name = tempfile.mkstemp(dir=store.root / "tmp", prefix="orig-", suffix=".mp4")
    h, size = new_hasher(), 0
    try:
        with os.fdopen(fd, "wb") as out, httpx.stream("GET", url, timeout=60.0) as resp:
            resp.raise_for_status()
            for chunk in resp.iter_bytes(1 << 20):
                h.update(chunk)
                out.write(chunk)
                size += len(chunk)
        if h.hexdigest() != task.original or size != task.original_size:
            raise IntegrityError(
                f"{task.name}: the object store's copy of blob {task.original[:12]}... "
                "does not match its hash: tell the store's operator"
            )
    except BaseException:
        Path(name).unlink(missing_ok=True)
        raise
    return Path(name), True


def _render(root: str, task: _Task) -> str:
    """Render ``task`` into a temporary file under the root's ``tmp/``; returns its path."""
    store = Store(root)
    original, temporary = _local_original(store, task)
    fd, out = tempfile.mkstemp(dir=store.root / "tmp", prefix="rend-", suffix=".mp4")
    os.close(fd)
    try:
        gop = task.gop if task.gop is not None else keyframe_interval(original)
        render(
            original,
            task.size,
            Path(out),
            rate_hz=task.rate_hz,
            gop=gop,
            count=task.count,
            name=task.name,
        )
    except BaseException:
        Path(out).unlink(missing_ok=True)
        raise
    finally:
        if temporary:
            original.unlink(missing_ok=True)
    return out


def _plan(segments: Sequence[Segment], heights: Sequence[int]) -> tuple[list[_Task], list[str]]:
    tasks: dict[tuple[str, tuple[int, int]], _Task] = {}
    skipped: set[str] = set()
    for seg in segments:
        for st in seg.streams.values():
            if st.kind != "video":
                continue
            have = {r.height for r in st.renditions}
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always", RenditionSkipped)
                sizes = rendition_sizes(st.shape[0], st.shape[1], heights, st.name)
            skipped.update(str(w.message) for w in caught)
            for size in sizes:
                if size[0] not in have:
                    tasks.setdefault(
                        (st.blob.hash, size),
                        _Task(
                            st.blob.hash,
                            st.blob.size,
                            size,
                            st.rate_hz,
                            st.gop,
                            st.count,
                            f"{seg.id} {st.name}",
                        ),
                    )
    return list(tasks.values()), sorted(skipped)


def _with(stream: Stream, made: dict[tuple[str, tuple[int, int]], Rendition]) -> Stream:
    if stream.kind != "video":
        return stream
    by_height = {r.height: r for r in stream.renditions}
    for (original, _), rendition in made.items():
        if original == stream.blob.hash:
            by_height.setdefault(rendition.height, rendition)
    if len(by_height) == len(stream.renditions):
        return stream
    return dataclasses.replace(stream, renditions=tuple(by_height[h] for h in sorted(by_height)))


def add_renditions(
    store: Store,
    slice_id: str,
    heights: Sequence[int],
    *,
    jobs: int = 1,
    progress: Callable[[str], None] | None = None,
) -> AddReport:
    """Render the renditions at ``heights`` that the cameras of ``slice_id`` lack, commit a new
    manifest listing them and point the slice at it.

    Args:
        store: the data root (blobs local or in object storage).
        slice_id: a slice of the root.
        heights: even heights in pixels; one at or above a camera's own height is skipped for
            it, one it already has is kept as is.
        jobs: renditions rendered in parallel (processes).
        progress: called with one line per rendered video.

    Returns:
        An :class:`AddReport`; ``manifest == previous`` when there was nothing to add.

    Raises:
        NotFoundError: no such slice in the root.
        InvalidArgumentError: bad heights or ``jobs``; a rendition that does not hold every
            frame of its original.
    """
    heights = check_heights(heights)
    if not heights:
        raise InvalidArgumentError("no rendition height given: pass e.g. --renditions 240")
    if not isinstance(jobs, int) or jobs < 1:
        raise InvalidArgumentError(f"--jobs {jobs!r}: use a positive number of processes")
    ref = store.get_slice(slice_id)
    if ref is None:
        raise NotFoundError(
            f"no slice {slice_id} in {store.root}: list them with "
            f"`rayform-server slices --root {store.root}`"
        )
    previous = ref["manifest"]
    manifest = store.load_manifest(previous)
    segments = list(manifest.segments)
    tasks, skipped = _plan(segments, heights)
    say = progress or (lambda line: None)
    if not tasks:
        return AddReport(previous, previous, 0, 0, tuple(skipped))
    say(f"{len(tasks)} video(s) to render at {', '.join(map(str, heights))} px, {jobs} process(es)")
    made: dict[tuple[str, tuple[int, int]], Rendition] = {}
    added = 0

    def store_one(k: int, task: _Task, out: str) -> None:
        nonlocal added
        ref = store.put_file(out, move=True)
        made[(task.original, task.size)] = Rendition(ref, *task.size)
        added += ref.size
        say(
            f"[{k}/{len(tasks)}] {task.name} {task.size[1]}x{task.size[0]} ({human_bytes(ref.size)})"
        )

    root = str(store.root)
    if jobs == 1:
        for k, task in enumerate(tasks, 1):
            store_one(k, task, _render(root, task))
    else:
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            futures = [pool.submit(_render, root, task) for task in tasks]
            for k, (task, fut) in enumerate(zip(tasks, futures, strict=True), 1):
                store_one(k, task, fut.result())
    new_segments = [
        dataclasses.replace(seg, streams={n: _with(st, made) for n, st in seg.streams.items()})
        for seg in segments
    ]
    version = 1 if isinstance(manifest, Manifest) else None
    digest = commit_segments(store, new_segments, manifest.description, format_version=version)
    store.set_slice(slice_id, digest, ref.get("description", ""))
    return AddReport(digest, previous, len(made), added, tuple(skipped))
