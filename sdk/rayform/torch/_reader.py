"""Reading samples: from (segment, grid step) pairs to sample dicts.

A batch is grouped by segment; for each segment every stream is read once: tables are
aligned with one vectorised ``searchsorted``, and video frames for all samples of the
segment are fetched in one sorted, de-duplicated ``get_frames_at`` call. With a training
resolution (``targets``), those calls come after every segment's tables: each camera's
frames for the whole batch are decoded into one buffer and resized in one call (a call per
segment and camera, each with its own buffers, cost more). With ``decode_threads > 0`` the
decode calls run in a thread pool (the decoders release the GIL), and a batch's resize is
split between its threads; samples are assembled when all are done. The pool lives for one
``read`` call only: no thread outlives it, so a DataLoader may fork workers at any time
(forking a process with running threads is unsafe, and Python 3.12+ warns about it).

Blobs are reached only through ``slice_.blob_path(ref)`` (which fetches a missing blob into
the shared cache, or raises :class:`~rayform.errors.OfflineError` in offline mode), always
from the calling thread. All per-process state (open decoders, loaded tables, resolved paths)
is one :class:`~rayform._process.PerProcess` value: created lazily, fresh in a forked worker,
dropped when the dataset is pickled into a spawned one.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch

from rayform._process import PerProcess
from rayform._resolution import Target, choose_rendition, format_image_size
from rayform.cache import Pins
from rayform.errors import IntegrityError, OfflineError
from rayform.manifest import BlobRef, Stream
from rayform.torch._align import align_values, latest_at_or_before
from rayform.torch._blobs import reader_pins
from rayform.torch._collate import batch_tensor
from rayform.torch._conventions import convert
from rayform.torch._decoding import DecoderCache, TableCache, resize_frames
from rayform.torch._index import GridIndex, grid_offsets_ns
from rayform.torch._spec import DatasetSpec

__all__ = ["BatchPlan", "SampleReader", "run_plans"]


#: Fetches of one blob a read tries while other processes keep evicting it before its pin.
_PIN_TRIES = 5


class _ProcessState:
    """What one process of a reader holds: open decoders, loaded tables, resolved blob paths."""

    __slots__ = ("decoders", "paths", "pins", "refs", "scratch", "tables")

    def __init__(
        self,
        decoder_cache_size: int,
        decoder_backend: str | None,
        pins: Pins | None,
        refetch: Callable[[str], Path],
    ) -> None:
        # A blob removed from the cache while it is read is fetched again (refetch), never
        # an error: rayform.cache.read_blob.
        self.decoders = DecoderCache(decoder_cache_size, decoder_backend, refetch)
        self.tables = TableCache(refetch=refetch)
        self.paths: dict[str, Path] = {}
        self.refs: dict[str, BlobRef] = {}  # the blobs resolved here, by hash (to refetch)
        self.pins = pins  # the blobs being read, which a bounded cache must not evict
        self.scratch = _Scratch()


class SampleReader:
    """Reads samples of one dataset; cheap to construct, opens nothing until used.

    Args:
        spec: the dataset's checked arguments (streams, alignment, decoding, training
            resolution); blobs come through ``spec.slice.blob_path``.
        index: the dataset's grid.
    """

    def __init__(self, spec: DatasetSpec, index: GridIndex) -> None:
        self.spec = spec
        self.slice = spec.slice
        self.index = index
        self.obs = spec.obs
        self.action = spec.action
        self.obs_steps = spec.obs_steps
        self.targets = dict(spec.targets or {})
        # Decoders inherited through fork share FFmpeg state with the parent: they are kept,
        # unused, for good. Freeing one runs FFmpeg's cleanup on state that belongs to the
        # parent's threads (swscale's thread pool then waits forever in the child).
        self._state = PerProcess(self._new_state, keep_inherited=True)

    # -- per-process state -----------------------------------------------------------------
    def _new_state(self) -> _ProcessState:
        pins = reader_pins(self.slice, self.index.segments, self.spec.streams)
        return _ProcessState(
            self.spec.decoder_cache_size, self.spec.decoder_backend, pins, self._refetch
        )

    def _refetch(self, digest: str) -> Path:
        """The path of a blob read here, after fetching it again if it is gone (it vanished
        while being read)."""
        state = self._state.get()
        state.paths.pop(digest, None)
        return self._path(state.refs[digest], state)

    def open_backends(self) -> list[str]:
        """This process's open video decoders, least recently used first, by backend
        (``"intra"``, ``"torchcodec"``, ``"pyav"``); empty before the first read here."""
        state = self._state.peek()
        return state.decoders.open_backends() if state is not None else []

    def _path(self, ref: BlobRef, state: _ProcessState) -> Path:
        path = state.paths.get(ref.hash)
        state.refs[ref.hash] = ref
        for _ in range(_PIN_TRIES):
            # Evicted, or removed by a `rayform cache prune` meanwhile: fetch it again (a stat).
            if path is None or not path.is_file():
                path = Path(self.slice.blob_path(ref))
                state.paths[ref.hash] = path
            # In use: no bounded cache may evict it. Another process may evict it between our
            # fetch and our pin; then fetch it again.
            if state.pins is None or state.pins.pin(path):
                return path
            path = None
        return Path(self.slice.blob_path(ref))  # evicted as often as fetched: read it unpinned

    def _sized_path(self, ref: BlobRef, state: _ProcessState, stream: Stream, what: str) -> Path:
        """:meth:`_path` of the video a camera is read from at its training resolution (``what``:
        ``"rendition"``, or ``"original"`` where no rendition covers the target); offline and
        not cached, an OfflineError naming the pull that fetches what this dataset reads at
        that resolution (a rendition is never replaced by the original)."""
        try:
            return self._path(ref, state)
        except OfflineError:
            # --streams: a per-camera size names only this dataset's cameras, and a pull
            # without it would need a size for every camera of the slice.
            cmd = (
                f"rayform pull {self.slice.id} --image-size {format_image_size(self.image_sizes())} "
                f"--resize {self.targets[stream.name].mode} --streams {' '.join(self.spec.streams)}"
            )
            # "from None": the cache's own error names a plain pull of the originals, which
            # would not fetch what this dataset reads.
            where = f" {self.slice.cache_dir}" if self.slice.cache_dir is not None else ""
            raise OfflineError(
                f"the {stream.name} {what} this dataset reads ({ref.hash[:12]}...) is not in the "
                f"cache{where} and offline mode is on (RAYFORM_OFFLINE=1); with network access "
                f"run `{cmd}`"
            ) from None

    def image_sizes(self) -> dict[str, tuple[int, int]]:
        """Camera key -> ``(H, W)`` of the dataset's training resolution (empty without)."""
        return {k: (t.height, t.width) for k, t in self.targets.items()}

    def table(self, stream: Stream) -> tuple[np.ndarray, np.ndarray]:
        """``(t_ns (N,), values (N, D))`` of a table stream (fetched on demand)."""
        state = self._state.get()
        t_ns, values = state.tables.table(stream.blob.hash, self._path(stream.blob, state))
        if values.dtype.kind not in "biuf" or tuple(values.shape[1:]) != tuple(stream.shape[-1:]):
            # The bytes match their hash, so the server published a table its manifest misdescribes.
            raise IntegrityError(
                f"table blob {stream.blob.hash} of stream {stream.name} holds {values.dtype} records of "
                f"shape {values.shape[1:]}, its manifest says {stream.dtype} {tuple(stream.shape)}; "
                "the data on the server is broken: report it to the data owners"
            )
        return t_ns, values

    # -- reading ---------------------------------------------------------------------------
    def read(
        self, seg_pos: np.ndarray, steps: np.ndarray, batched: bool = False
    ) -> list[dict[str, Any]]:
        """Samples for parallel arrays of segment positions and grid steps, in that order
        (``batched``: as in :meth:`plan`)."""
        if self.spec.decode_threads > 0:
            # Starting 2 threads costs ~0.1 ms against ~60 ms of decoding per batch of 32.
            # Leaving the block waits for every decode, even on error.
            with ThreadPoolExecutor(
                self.spec.decode_threads, thread_name_prefix="rayform-decode"
            ) as pool:
                return self._read(seg_pos, steps, pool, batched)
        return self._read(seg_pos, steps, None, batched)

    def _read(
        self,
        seg_pos: np.ndarray,
        steps: np.ndarray,
        pool: ThreadPoolExecutor | None,
        batched: bool,
    ) -> list[dict[str, Any]]:
        with contextlib.ExitStack() as stack:
            plan = self.plan(seg_pos, steps, stack, pool, batched)
            run_plans([plan], pool, max(1, self.spec.decode_threads))
            return plan.finish()

    def plan(
        self,
        seg_pos: np.ndarray,
        steps: np.ndarray,
        stack: contextlib.ExitStack,
        pool: ThreadPoolExecutor | None = None,
        batched: bool = False,
    ) -> BatchPlan:
        """A batch's read up to its decodes at a training resolution: tables aligned, paths
        resolved, other decodes started (in ``pool``, when there is one). :func:`run_plans`
        decodes and resizes the frames of one or many plans (a mixture's sources) together,
        then ``plan.finish()`` builds the samples. Under a bounded cache, the batch's blobs
        stay pinned until ``stack`` closes.

        With ``batched`` (the samples are collated in this order, untransformed), a camera
        read at a training resolution with one observation step is resized straight into one
        ``(B, 3, H, W)`` tensor (:func:`~rayform.torch._collate.batch_tensor`: in a worker, the
        batch's shared memory), sample ``i`` holding row ``i``: ``collate`` keeps it in place."""
        state = self._state.get()
        placed: dict[str, torch.Tensor] = {}
        if batched and self.obs_steps == 1:
            segments = self.index.segments
            for name in self.obs:
                target = self.targets.get(name)
                if target is not None:
                    size = {(target.height, target.width)}
                else:  # full resolution: one batch tensor where every episode has one size
                    streams = [segments[int(s)].streams[name] for s in np.unique(seg_pos)]
                    if any(st.kind != "video" for st in streams):
                        continue
                    size = {(int(st.shape[0]), int(st.shape[1])) for st in streams}
                if len(size) == 1:
                    placed[name] = batch_tensor((len(seg_pos), 3, *size.pop()))
        # Frames read at a training resolution are only requested here, then decoded into
        # one buffer and resized in one call per camera for the whole batch.
        pending = [(np.flatnonzero(seg_pos == s), s) for s in np.unique(seg_pos)]
        jobs: list[_ResizeJob] = []
        if state.pins is not None and (self.targets or pool is not None):
            # Under a bounded cache, every segment of the batch stays pinned until its
            # frames are decoded: those decodes run after all the segments are resolved
            # (or alongside), and a segment's pins alone would let an earlier segment's
            # video be evicted first. The cache may exceed its limit by what the batch
            # reads, and gets back under at the next fetch once it is done.
            stack.enter_context(state.pins.holding(len(pending) * state.pins.max_pins))
        finishers = [
            (where, self._read_segment(state, int(s), steps[where], pool, jobs, placed, where))
            for where, s in pending
        ]

        def finish() -> list[dict[str, Any]]:
            out: list[dict[str, Any] | None] = [None] * len(seg_pos)
            for where, segment_samples in finishers:
                for i, sample in zip(where, segment_samples(), strict=True):
                    out[int(i)] = sample
            return cast("list[dict[str, Any]]", out)  # every position was filled

        return BatchPlan(jobs, finish, state.scratch)

    def _read_segment(
        self,
        state: _ProcessState,
        s: int,
        steps: np.ndarray,
        pool: ThreadPoolExecutor | None,
        jobs: list[_ResizeJob],
        placed: dict[str, torch.Tensor],
        where: np.ndarray,
    ) -> Callable[[], list[dict[str, Any]]]:
        """Starts the segment's video decodes and reads its tables; the returned function
        waits for the frames and builds the samples (``where``: their rows in the batch, in
        ``placed``' tensors)."""
        index = self.index
        seg = index.segments[s]
        n = int(index.count[s])
        t = index.times_ns(s, steps)  # (B,)
        # Observation steps k-n+1..k; those before the grid start are padded with step 0.
        back = np.arange(-self.obs_steps + 1, 1)
        obs_steps = steps[:, None] + back[None, :]  # (B, n)
        obs_pad = torch.from_numpy(obs_steps < 0)
        obs_t = index.times_ns(s, np.maximum(obs_steps, 0))  # (B, n)
        tables: dict[str, torch.Tensor] = {}  # (B, n, D)
        # frames (None: placed in the batch), inverse (B, n)
        videos: dict[str, tuple[Future[torch.Tensor | None], np.ndarray]] = {}
        for name in self.obs:
            stream = seg.streams[name]
            if stream.kind == "video":
                rows = placed.get(name)
                dest = None if rows is None else [rows[i] for i in where.tolist()]
                videos[name] = self._video(
                    state, stream, obs_t, pool, self.targets.get(name), jobs, dest
                )
            else:
                t_rec, rec = self.table(stream)
                values = convert(rec[latest_at_or_before(t_rec, obs_t)], stream, self.spec.frame)
                tables[name] = torch.from_numpy(values.astype(np.float32))
        action: tuple[torch.Tensor, torch.Tensor] | None = None  # (B, horizon, D), (B, horizon)
        if self.action is not None:
            stream = seg.streams[self.action]
            chunk = steps[:, None] + np.arange(self.spec.horizon)[None, :]  # (B, horizon)
            chunk_t = index.start_ns[s] + grid_offsets_ns(np.minimum(chunk, n - 1), index.fps)
            t_rec, rec = self.table(stream)
            flat = align_values(t_rec, rec, chunk_t.reshape(-1), self.spec.action_mode)
            act = convert(flat, stream, self.spec.frame).reshape(*chunk.shape, -1)
            action = (
                torch.from_numpy(np.ascontiguousarray(act, dtype=np.float32)),
                torch.from_numpy(chunk >= n),
            )
        meta = {
            "slice": self.slice.id,
            "segment": seg.id,
            "segment_version": seg.version,
            "site": seg.site,
        }
        return lambda: self._assemble(
            steps, t, obs_pad, tables, videos, action, meta, placed, where
        )

    def _assemble(
        self,
        steps: np.ndarray,
        t: np.ndarray,
        obs_pad: torch.Tensor,
        tables: dict[str, torch.Tensor],
        videos: dict[str, tuple[Future[torch.Tensor | None], np.ndarray]],
        action: tuple[torch.Tensor, torch.Tensor] | None,
        meta: dict[str, Any],
        placed: dict[str, torch.Tensor],
        where: np.ndarray,
    ) -> list[dict[str, Any]]:
        # Per-sample values are views cut by one ``unbind`` per tensor: one call per key, not
        # one indexing call per sample and key (it counts where a batch holds many samples of
        # a segment, as a windowed sampler's do).
        # One step: a view of a decoded frame (collate copies it once into the batch). A
        # history: a small gather of n frames.
        columns: dict[str, Sequence[torch.Tensor]] = {}
        for name in self.obs:
            if name in videos:
                future, inverse = videos[name]
                frames = future.result()
                if frames is None:  # resized straight into the batch: its rows, in order
                    columns[name] = [placed[name][i] for i in where.tolist()]
                elif self.obs_steps > 1:
                    gather = torch.from_numpy(inverse)
                    columns[name] = [frames[gather[b]] for b in range(len(steps))]
                else:
                    views = frames.unbind(0)
                    columns[name] = [views[i] for i in inverse[:, 0].tolist()]
            else:
                columns[name] = (
                    tables[name].unbind(0) if self.obs_steps > 1 else tables[name][:, 0].unbind(0)
                )
            if self.obs_steps > 1:
                columns[f"{name}_is_pad"] = obs_pad.unbind(0)
        if action is not None:
            columns["action"] = action[0].unbind(0)
            columns["action_is_pad"] = action[1].unbind(0)
        columns["t_ns"] = torch.from_numpy(np.asarray(t, dtype=np.int64)).unbind(0)
        keys = list(columns)
        return [
            {**dict(zip(keys, values, strict=True)), "meta": dict(meta)}
            for values in zip(*columns.values(), strict=True)
        ]

    def _video(
        self,
        state: _ProcessState,
        stream: Stream,
        t_query: np.ndarray,
        pool: ThreadPoolExecutor | None,
        target: Target | None,
        jobs: list[_ResizeJob],
        dest: list[torch.Tensor] | None = None,
    ) -> tuple[Future[torch.Tensor | None], np.ndarray]:
        """Frames at the latest frame time <= each query ``t_query (B, n)``, resized to
        ``target`` when there is one (then only requested: appended to ``jobs``), and with
        ``dest`` (one ``(3, H, W)`` row per query, ``n == 1``) written there (the future then
        gets ``None``).

        Returns:
            ``frames``, a future of ``uint8 (U, 3, H, W)``: the unique frames decoded in one
            sorted pass (already done when there is no thread pool); and ``inverse int64
            (B, n)``: query ``[b, k]`` is ``frames[inverse[b, k]]``. Not gathering here saves
            a full copy of every frame per batch.
        """
        assert stream.timestamps is not None
        frame_t = state.tables.timestamps(
            stream.timestamps.hash, self._path(stream.timestamps, state)
        )
        idx = latest_at_or_before(frame_t, t_query)
        unique, inverse = _unique_inverse(idx.reshape(-1))
        # Paths are resolved here, in the calling thread: a missing blob is fetched (or
        # OfflineError raised) before any decoding starts.
        rendition = choose_rendition(stream, target)  # None: the original
        if rendition is None:
            blob, size = stream.blob, (int(stream.shape[0]), int(stream.shape[1]))
        else:
            blob, size = rendition.blob, (rendition.height, rendition.width)
        if target is None:
            path = self._path(blob, state)
        else:  # the original too, where no rendition covers the target
            path = self._sized_path(
                blob, state, stream, "original" if rendition is None else "rendition"
            )
        args = (blob.hash, path, unique, stream.rate_hz, stream.name)
        inverse = inverse.reshape(t_query.shape)
        done: Future[torch.Tensor | None] = Future()
        rows: list[list[torch.Tensor]] | None = None  # per unique frame, its batch rows
        if dest is not None:
            rows = [[] for _ in range(len(unique))]
            for row, u in zip(dest, inverse[:, 0].tolist(), strict=True):
                rows[u].append(row)
        if target is not None:
            jobs.append(_ResizeJob(done, state.decoders, args, target, size, rows))
            return done, inverse
        if rows is not None:  # decoded straight into the batch rows
            if pool is not None:
                return pool.submit(_decode_into, state.decoders, args, rows), inverse
            done.set_result(_decode_into(state.decoders, args, rows))
            return done, inverse
        if pool is not None:
            return cast(
                "Future[torch.Tensor | None]",
                pool.submit(_decode_contiguous, state.decoders, *args),
            ), inverse
        done.set_result(state.decoders.get_frames(*args))
        return done, inverse


def _unique_inverse(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(values, return_inverse=True)`` of 1-D integers, ``inverse`` as int64.

    A segment's frame indices for a shuffled batch are one to a few dozen numbers, where
    numpy's general function spends ~21 us on dispatch; plain Python sets take ~3 us there
    (2.5 % of a DataLoader worker's time at 224 px)."""
    if len(values) > 64:
        unique, inverse = np.unique(values, return_inverse=True)
        return unique, inverse.astype(np.int64)
    items = values.tolist()
    ordered = sorted(set(items))
    if ordered == items:  # already sorted and distinct: the common case
        return values, np.arange(len(items), dtype=np.int64)
    position = {x: i for i, x in enumerate(ordered)}
    return (
        np.array(ordered, dtype=values.dtype),
        np.array([position[x] for x in items], dtype=np.int64),
    )


def _decode_contiguous(
    decoders: DecoderCache, key: str, path: Path, indices: np.ndarray, rate_hz: float, stream: str
) -> torch.Tensor:
    # In a pool thread: make the frames contiguous here, in parallel, so that
    # default_collate's copy in the calling thread is a plain memcpy, not a transpose.
    return decoders.get_frames(key, path, indices, rate_hz, stream).contiguous()


def _decode_into(
    decoders: DecoderCache,
    args: tuple[str, Path, np.ndarray, float, str],
    rows: list[list[torch.Tensor]],
) -> torch.Tensor | None:
    """Decode the frames of ``args`` (``get_frames``') into their batch ``rows``; ``None``."""
    decoders.get_frames(*args, rows=rows)
    return None


@dataclasses.dataclass(frozen=True)
class _ResizeJob:
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


#: Decoded (or scaled, when larger) frames held at once per resize call (bytes): bounds each
#: of the two buffers a thread keeps (6 RGBA frames of 480x640, 27 of 240x320); a larger one
#: saves little more in calls.
_BUFFER_BYTES = 8 << 20
#: Channels of the decode buffer: RGBA, which torch's resize kernel reads without widening
#: each pixel first (a third less time than RGB, measured at 240x320 and 480x640 to 168x224;
#: the same RGB bits), and which FFmpeg converts to as fast as RGB.
_CHANNELS = 4


@dataclasses.dataclass(frozen=True)
class BatchPlan:
    """One reader's part of a batch, planned (:meth:`SampleReader.plan`): the decodes and
    resizes it still needs, and ``finish()``, which builds its samples once they are done."""

    jobs: list[_ResizeJob]
    finish: Callable[[], list[dict[str, Any]]]
    scratch: _Scratch


def run_plans(
    plans: Sequence[BatchPlan], pool: ThreadPoolExecutor | None = None, threads: int = 1
) -> None:
    """Decode and resize the frames of every plan in one pass: frames of the same decoded
    size and target share buffers and resize calls whichever reader (a mixture's source) they
    come from."""
    jobs = [job for plan in plans for job in plan.jobs]
    if jobs:
        _run_resize_jobs(jobs, pool, threads, plans[0].scratch)


def _run_resize_jobs(
    jobs: list[_ResizeJob],
    pool: ThreadPoolExecutor | None,
    threads: int,
    scratch: _Scratch,
) -> None:
    """Decode and resize ``jobs``: per (target, decoded size), the frames of consecutive jobs
    (up to ``_BUFFER_BYTES``) into one channels-last RGBA buffer, then one resize into one output
    (in ``pool``, decodes are spread over its ``threads`` threads and the resize is split
    between them). Each job's future gets its slice of the output.

    Batching replaces a resize call per segment and camera (with its buffers) by one per
    camera and batch: the same bits, since each frame is resized on its own. The decoded and
    the scaled frames pass through ``scratch`` (the calling thread's buffers), kept between
    batches; only the resized output is new memory.
    """
    groups: dict[tuple[Target, tuple[int, int]], list[_ResizeJob]] = {}
    for job in jobs:
        groups.setdefault((job.target, job.size), []).append(job)
    for (target, (h, w)), group in groups.items():
        # Bounded by the larger of the decoded and the scaled frame: both buffers are kept.
        # (One segment's frames are never split: more than that bound is new memory.)
        sh, sw = target.plan(h, w).scaled
        per_buffer = max(1, _BUFFER_BYTES // (max(h * w, sh * sw) * _CHANNELS))
        chunk: list[_ResizeJob] = []
        held = 0
        for job in group:
            if chunk and held + job.count > per_buffer:
                _decode_and_resize(chunk, target, (h, w), sh * sw, pool, threads, scratch)
                chunk, held = [], 0
            chunk.append(job)
            held += job.count
        _decode_and_resize(chunk, target, (h, w), sh * sw, pool, threads, scratch)


def _decode_and_resize(
    jobs: list[_ResizeJob],
    target: Target,
    size: tuple[int, int],
    scaled_pixels: int,
    pool: ThreadPoolExecutor | None,
    threads: int,
    scratch: _Scratch,
) -> None:
    bounds = np.cumsum([0, *(job.count for job in jobs)])
    total = int(bounds[-1])
    shape = (total, *size, _CHANNELS)
    buffer = scratch.get("decoded", int(np.prod(shape))).numpy().reshape(shape)
    decodes = [
        functools.partial(job.decoders.get_frames, *job.args, out=buffer[lo:hi])
        for job, lo, hi in zip(jobs, bounds[:-1], bounds[1:], strict=True)
    ]
    _run_all(decodes, pool)
    frames = torch.from_numpy(buffer).permute(0, 3, 1, 2)
    per_frame = scaled_pixels * _CHANNELS  # bytes of one scaled frame
    scaled = scratch.get("scaled", total * per_frame)
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
            scaled[lo * per_frame :],
            rows[lo:hi] if rows is not None else None,
        )
        for lo, hi in zip(cuts[:-1], cuts[1:], strict=True)
        if hi > lo
    ]
    _run_all(resizes, pool)
    for job, lo, hi in zip(jobs, bounds[:-1], bounds[1:], strict=True):
        if out is not None:
            job.done.set_result(out[int(lo) : int(hi)])
        elif job.rows is not None:
            job.done.set_result(None)


class _Scratch(threading.local):
    """One thread's buffers for decoded and scaled frames, kept between batches and grown on
    demand up to ``_BUFFER_BYTES`` each (a larger request gets new memory, not kept): reused
    memory is not page-faulted and zeroed again each batch, which fresh buffers were whenever
    the allocator had given the last batch's back to the kernel (5-10 % of a worker's time at
    224 px)."""

    def __init__(self) -> None:
        self._buffers: dict[str, torch.Tensor] = {}

    def get(self, name: str, nbytes: int) -> torch.Tensor:
        """A flat ``uint8`` tensor of ``nbytes`` bytes: the same memory as the last ``name``
        asked for when that was as large, new memory above ``_BUFFER_BYTES``."""
        if nbytes > _BUFFER_BYTES:
            return torch.empty(nbytes, dtype=torch.uint8)
        buffer = self._buffers.get(name)
        if buffer is None or buffer.numel() < nbytes:
            buffer = self._buffers[name] = torch.empty(nbytes, dtype=torch.uint8)
        return buffer[:nbytes]


def _run_all(calls: Sequence[Callable[[], Any]], pool: ThreadPoolExecutor | None) -> None:
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
