"""``rayform-server renditions``: add renditions to a slice that is already stored.

Every camera video of the slice's current manifest gets, for each requested height it does
not have yet (and that is below the original's), a rendition rendered from the stored
original exactly as ingest renders it (:func:`rayform_server._renditions.render`: same
keyframe interval, rate and frame count, x264 at the renditions' quality). A video stored once
and listed by many segments (``demo --share-blobs``) is rendered once. The new manifest
(the same segments, their streams listing the renditions) is committed in the old one's
format version family and the slice points at it; the old manifest stays in the store and
in the slice's history, so runs logged against it rebuild by hash (docs/protocol.md).

Every original is checked against its hash before it is decoded; one in object storage is
first downloaded through a presigned URL. A run works in one folder of its own under the
root's ``tmp/`` (downloads and renders), removed when it ends, whether it succeeded or not;
renders enter the store only once every one succeeded.
``jobs > 1`` renders in worker processes, each opening the store itself; the first failure
cancels the renders not yet started. The slice moves only if it still names the manifest the
renditions were planned from (:meth:`Store.commit_slice`), so a commit of the same slice made
meanwhile is never reverted, and a refused run writes no manifest.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile
import warnings
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import av
import httpx

from rayform.errors import IntegrityError, InvalidArgumentError, NotFoundError
from rayform.format import hash_file, new_hasher
from rayform.manifest import Rendition, Segment, Stream
from rayform.units import human_bytes
from rayform_server._renditions import (
    MAX_RENDITIONS,
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


def _unreadable(store: Store, task: _Task, why: str) -> str:
    """The message for an original that cannot be rendered from, with what to do."""
    return (
        f"blob {task.original} of {task.name} is missing or unreadable in {store.root}: {why}; "
        "nothing was committed: restore the blob (from a backup, or ingest its recording again) and run again"
    )


def _local_original(store: Store, task: _Task, workdir: Path) -> tuple[Path, bool]:
    """A local path of the original video, checked against its hash, and whether it is a
    temporary copy (in ``workdir``) to delete.

    Raises:
        NotFoundError: the blob is not in the store (or the object store cannot be reached).
        IntegrityError: its bytes do not match its hash.
    """
    path = store.blobs.local_path(task.original)
    if path is not None:
        # Checked before decoding: a truncated or altered file may decode into fewer or
        # other frames, and a rendition must be the original's, resized.
        try:
            size = path.stat().st_size
            digest = hash_file(path) if size == task.original_size else None
        except OSError as exc:
            raise NotFoundError(_unreadable(store, task, exc.strerror or str(exc))) from None
        if size != task.original_size or digest != task.original:
            raise IntegrityError(
                _unreadable(
                    store,
                    task,
                    f"the file {path} ({size} bytes, the manifest says {task.original_size}) "
                    "does not match its hash",
                )
            )
        return path, False
    url = store.blobs.presigned_url(task.original, 3600)
    if url is None:
        raise InvalidArgumentError(
            f"{task.name}: blob {task.original[:12]}... is in {store.blobs.describe()}, "
            "which gives no download URL"
        )
    fd, name = tempfile.mkstemp(dir=workdir, prefix="orig-", suffix=".mp4")
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
                _unreadable(
                    store,
                    task,
                    f"the copy in {store.blobs.describe()} does not match its hash "
                    "(tell the store's operator)",
                )
            )
    except httpx.HTTPStatusError as exc:
        Path(name).unlink(missing_ok=True)
        why = f"{store.blobs.describe()} answered {exc.response.status_code}"
        raise NotFoundError(_unreadable(store, task, why)) from None
    except httpx.HTTPError as exc:
        Path(name).unlink(missing_ok=True)
        why = f"cannot download it from {store.blobs.describe()} ({type(exc).__name__}: {exc})"
        raise NotFoundError(_unreadable(store, task, why)) from None
    except BaseException:
        Path(name).unlink(missing_ok=True)
        raise
    return Path(name), True


def _render(root: str, task: _Task, workdir: str) -> str:
    """Render ``task`` into a new file in ``workdir`` (under the root's ``tmp/``); returns its
    path."""
    store = Store(root)
    original, temporary = _local_original(store, task, Path(workdir))
    fd, out = tempfile.mkstemp(dir=workdir, prefix="rend-", suffix=".mp4")
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
    except av.error.FFmpegError as exc:
        Path(out).unlink(missing_ok=True)
        raise IntegrityError(_unreadable(store, task, f"FFmpeg cannot decode it ({exc})")) from None
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
            total = len(have | {h for h, _ in sizes})
            if total > MAX_RENDITIONS:
                raise InvalidArgumentError(
                    f"{seg.id} {st.name}: it has {len(have)} rendition(s) and would have {total} "
                    f"with these heights; a stream lists at most {MAX_RENDITIONS} (readers refuse "
                    "more): ask for fewer heights"
                )
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
        NotFoundError: no such slice in the root; an original blob missing from the store.
        IntegrityError: an original blob whose bytes do not match its hash, or do not decode.
        InvalidArgumentError: bad heights or ``jobs``; more renditions than a stream may list;
            a rendition that does not hold every frame of its original.
        SliceMovedError: the slice was moved to another manifest while rendering (nothing is
            changed: run again).
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
    rendered: list[str] = []  # in the order of tasks; stored once every render succeeded

    def done(k: int, task: _Task, out: str) -> None:
        rendered.append(out)
        size = human_bytes(os.path.getsize(out))
        say(f"[{k}/{len(tasks)}] {task.name} {task.size[1]}x{task.size[0]} ({size})")

    root = str(store.root)
    # One folder for this run's downloads and renders: whatever happens (a failed render,
    # Ctrl-C), removing it removes every file the run left, also those finished after a failure.
    workdir = tempfile.mkdtemp(dir=store.root / "tmp", prefix="rend-")
    try:
        if jobs == 1:
            for k, task in enumerate(tasks, 1):
                done(k, task, _render(root, task, workdir))
        else:
            with ProcessPoolExecutor(max_workers=jobs) as pool:
                futures = [pool.submit(_render, root, task, workdir) for task in tasks]
                try:
                    for k, (task, fut) in enumerate(zip(tasks, futures, strict=True), 1):
                        done(k, task, fut.result())
                except BaseException:
                    # Start nothing more; wait for the running renders so that their output
                    # is written before the folder is removed.
                    pool.shutdown(wait=True, cancel_futures=True)
                    raise
        # Only now into the store: a failed render leaves no blob that no manifest names.
        for task, out in zip(tasks, rendered, strict=True):
            made[(task.original, task.size)] = Rendition(store.put_file(out, move=True), *task.size)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    added = sum(r.blob.size for r in made.values())
    new_segments = [
        dataclasses.replace(seg, streams={n: _with(st, made) for n, st in seg.streams.items()})
        for seg in segments
    ]
    # Written and moved to only if the slice still names the manifest the renditions were
    # planned from: a refused run leaves no manifest that no slice names.
    digest = store.commit_slice(
        slice_id,
        lambda: commit_segments(store, new_segments, manifest.description),
        ref.get("description", ""),
        expect=previous,
    )
    return AddReport(digest, previous, len(made), added, tuple(skipped))
