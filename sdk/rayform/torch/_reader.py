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
import functools
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
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
from rayform.torch._collate import batch_rows, batch_tensor
from rayform.torch._conventions import convert
from rayform.torch._decoding import (
    BatchPlan,
    DecoderCache,
    ResizeJob,
    TableCache,
    run_plans,
)
from rayform.torch._index import GridIndex, grid_offsets_ns
from rayform.torch._spec import DatasetSpec
from rayform.torch._text import text_values

__all__ = ["BatchPlan", "SampleReader", "run_plans"]


#: Fetches of one blob a read tries while other processes keep evicting it before its pin.
_PIN_TRIES = 5


class _ProcessState:
    """What one process of a reader holds: open decoders, loaded tables, resolved blob paths."""

    __slots__ = ("decoders", "paths", "pins", "refs", "tables")

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
        # The label observations' ranges (``label:KEY``): empty, and never consulted beyond one
        # dict lookup, for a dataset that reads no label.
        self.spans = {n: t for n in spec.obs if (t := spec.span_table(n)) is not None}
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

    def pins(self) -> Pins | None:
        """This process's pins of the blobs it reads (``None`` without a cache limit)."""
        return self._state.get().pins

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
            # Evicted, or removed by a `rayform cache prune` meanwhile: fetch it again (a stat,
            # which a video with an open decoder does not need: that reads its open file, and
            # a file gone when a decoder opens is fetched again by read_blob).
            if path is None or not (state.decoders.holds(ref.hash) or path.is_file()):
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

    def text(self, stream: Stream) -> tuple[np.ndarray, list[dict[str, Any]]]:
        """``(t_ns (N,), records)`` of a text stream (fetched on demand), times in ns."""
        state = self._state.get()
        dt_ns, records = state.tables.text(stream.blob.hash, self._path(stream.blob, state))
        if len(records) != stream.count or int(dt_ns[-1]) != stream.t1_ns - stream.t0_ns:
            raise IntegrityError(
                f"text blob {stream.blob.hash} of stream {stream.name} holds {len(records)} "
                f"records over {int(dt_ns[-1])} ns, its manifest says {stream.count} over "
                f"{stream.t1_ns - stream.t0_ns} ns; the data on the server is broken: report it "
                "to the data owners"
            )
        return dt_ns + np.int64(stream.t0_ns), list(records)

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

        Every value of the batch is written into one ``(B, ...)`` tensor per sample key (the
        segments' rows scattered there by one numpy assignment each), and each sample holds a
        row of it: the per-sample work is one ``unbind`` per key and one dict per sample.

        With ``batched`` (the samples are collated in this order, untransformed), a camera
        read with one observation step goes straight into one ``(B, 3, H, W)`` tensor
        (:func:`~rayform.torch._collate.batch_tensor`: in a worker, the batch's shared memory),
        sample ``i`` holding row ``i``: ``collate`` keeps it in place. Without ``normalize``
        (which replaces the vectors) the vectors, the action, its mask and ``t_ns`` go there
        too."""
        state = self._state.get()
        batch = self._columns(seg_pos, batched and self.obs_steps == 1)
        pending = [(np.flatnonzero(seg_pos == s), s) for s in np.unique(seg_pos).tolist()]
        jobs: list[ResizeJob] = []
        if state.pins is not None and (self.targets or pool is not None):
            # Under a bounded cache, every segment of the batch stays pinned until its
            # frames are decoded: those decodes run after all the segments are resolved
            # (or alongside), and a segment's pins alone would let an earlier segment's
            # video be evicted first. The cache may exceed its limit by what the batch
            # reads, and gets back under at the next fetch once it is done.
            stack.enter_context(state.pins.holding(len(pending) * state.pins.max_pins))
        finishers = [
            self._read_segment(state, s, steps[where], pool, jobs, batch, where)
            for where, s in pending
        ]

        def finish() -> list[dict[str, Any]]:
            for segment_done in finishers:
                segment_done()
            return batch.samples()

        return BatchPlan(jobs, finish)

    def _columns(self, seg_pos: np.ndarray, in_place: bool) -> BatchColumns:
        """The batch's values, key by key in the samples' order: ``(B, ...)`` tensors where
        every segment of the batch gives a key one shape. ``in_place``: cameras go into the
        batch's shared memory, and the rest too unless ``normalize`` replaces the vectors."""
        segments = self.index.segments
        segs = [segments[s] for s in np.unique(seg_pos).tolist()]
        shared = in_place and self.spec.normalize is None
        lead = () if self.obs_steps == 1 else (self.obs_steps,)
        batch = BatchColumns(len(seg_pos))
        for name in self.obs:
            if name in self.spec.texts or name in self.spans:
                # strings, lists of records or of range names: sample by sample
                batch.add(name, None, torch.uint8)
                if lead:
                    batch.add(f"{name}_is_pad", lead, torch.bool, shared)
                continue
            streams = [seg.streams[name] for seg in segs]
            if all(st.kind == "video" for st in streams):
                target = self.targets.get(name)
                if target is not None:
                    sizes = {(target.height, target.width)}
                else:
                    sizes = {(int(st.shape[0]), int(st.shape[1])) for st in streams}
                if in_place and len(sizes) == 1:
                    batch.add(name, (3, *sizes.pop()), torch.uint8, shared=True, written=False)
                else:
                    batch.add(name, None, torch.uint8)
            else:
                widths = {tuple(st.shape[-1:]) for st in streams if st.kind != "video"}
                one = len(widths) == 1 and len(streams) == len(segs)
                batch.add(name, (*lead, *widths.pop()) if one else None, torch.float32, shared)
            if lead:
                batch.add(f"{name}_is_pad", lead, torch.bool, shared)
        if self.action is not None:
            widths = {tuple(seg.streams[self.action].shape[-1:]) for seg in segs}
            horizon = (self.spec.horizon,)
            shape = (*horizon, *widths.pop()) if len(widths) == 1 else None
            batch.add("action", shape, torch.float32, shared)
            batch.add("action_is_pad", horizon, torch.bool, shared)
        batch.add("t_ns", (), torch.int64, shared)
        return batch

    def _read_segment(
        self,
        state: _ProcessState,
        s: int,
        steps: np.ndarray,
        pool: ThreadPoolExecutor | None,
        jobs: list[ResizeJob],
        batch: BatchColumns,
        where: np.ndarray,
    ) -> Callable[[], None]:
        """Starts the segment's video decodes and writes its tables into ``batch`` (rows
        ``where``); the returned function waits for the frames and places them."""
        index = self.index
        seg = index.segments[s]
        n = int(index.count[s])
        t = index.times_ns(s, steps)  # (B,)
        obs_pad: np.ndarray | None = None
        if self.obs_steps == 1:
            obs_t = t[:, None]
        else:  # steps k-n+1..k; those before the grid start are padded with step 0
            obs_steps = steps[:, None] + np.arange(-self.obs_steps + 1, 1)[None, :]  # (B, n)
            obs_pad = obs_steps < 0
            obs_t = index.times_ns(s, np.maximum(obs_steps, 0))  # (B, n)
        # frames (None: placed in the batch), inverse (B, n)
        videos: dict[str, tuple[Future[torch.Tensor | None], np.ndarray]] = {}
        rows = where.tolist()
        for name in self.obs:
            table = self.spans.get(name)
            if table is not None:  # a label's range names at each time (padded: step 0's)
                names = table.names_at(s, obs_t.reshape(-1))
                per = self.obs_steps
                batch.scatter(
                    name,
                    rows,
                    names
                    if per == 1
                    else [names[i * per : (i + 1) * per] for i in range(len(rows))],
                )
                if obs_pad is not None:
                    batch.put(f"{name}_is_pad", where, obs_pad)
                continue
            timing = self.spec.texts.get(name)
            if timing is not None:
                grid = functools.partial(index.times_ns, s)
                texts = text_values(seg.streams.get(name), timing, self.text, grid, steps, obs_t)
                batch.scatter(name, rows, texts)
                if obs_pad is not None:
                    batch.put(f"{name}_is_pad", where, obs_pad)
                continue
            stream = seg.streams[name]
            if stream.kind == "video":
                placed = batch.rows.get(name)
                dest = None if placed is None else [placed[i] for i in rows]
                videos[name] = self._video(
                    state, stream, obs_t, pool, self.targets.get(name), jobs, dest
                )
            else:
                t_rec, rec = self.table(stream)
                values = convert(rec[latest_at_or_before(t_rec, obs_t)], stream, self.spec.frame)
                batch.put(name, where, values if obs_pad is not None else values[:, 0])
            if obs_pad is not None:
                batch.put(f"{name}_is_pad", where, obs_pad)
        if self.action is not None:
            stream = seg.streams[self.action]
            chunk = steps[:, None] + np.arange(self.spec.horizon)[None, :]  # (B, horizon)
            chunk_t = index.start_ns[s] + grid_offsets_ns(np.minimum(chunk, n - 1), index.fps)
            t_rec, rec = self.table(stream)
            flat = align_values(t_rec, rec, chunk_t.reshape(-1), self.spec.action_mode)
            batch.put(
                "action", where, convert(flat, stream, self.spec.frame).reshape(*chunk.shape, -1)
            )
            batch.put("action_is_pad", where, chunk >= n)
        batch.put("t_ns", where, t)
        meta = {
            "slice": self.slice.id,
            "segment": seg.id,
            "segment_version": seg.version,
            "site": seg.site,
        }

        def done() -> None:
            batch.meta(rows, meta)
            for name, (future, inverse) in videos.items():
                frames = future.result()
                if frames is None:  # decoded or resized straight into the batch's rows
                    continue
                if self.obs_steps > 1:  # a small gather of n frames per sample
                    gather = torch.from_numpy(inverse)
                    batch.scatter(name, rows, [frames[gather[b]] for b in range(len(rows))])
                else:  # one step: a view of a decoded frame (collate copies it once)
                    views = frames.unbind(0)
                    batch.scatter(name, rows, [views[i] for i in inverse[:, 0].tolist()])

        return done

    def _video(
        self,
        state: _ProcessState,
        stream: Stream,
        t_query: np.ndarray,
        pool: ThreadPoolExecutor | None,
        target: Target | None,
        jobs: list[ResizeJob],
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
        stamps = stream.timestamps
        frame_t = state.tables.timestamps(stamps.hash, self._path(stamps, state))
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
            jobs.append(ResizeJob(done, state.decoders, args, target, size, rows))
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
    numpy's general function costs more in dispatch than plain Python sets do in work."""
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


_NUMPY = {
    torch.float32: np.float32,
    torch.int64: np.int64,
    torch.bool: np.bool_,
    torch.uint8: np.uint8,
}


class BatchColumns:
    """The values of a batch of ``size`` samples, by sample key, in the samples' key order."""

    def __init__(self, size: int) -> None:
        self.size = size
        #: Key -> the rows of its ``(size, ...)`` tensor (sample ``i`` holds row ``i``).
        self.rows: dict[str, Sequence[torch.Tensor]] = {}
        self._arrays: dict[str, np.ndarray] = {}  # numpy views of the tensors written by put
        self._dtypes: dict[str, torch.dtype] = {}
        self._lists: dict[str, list[Any]] = {}  # per-segment values, sample by sample
        self._keys: list[str] = []
        self._metas: list[dict[str, Any]] = [{}] * size

    def add(
        self,
        key: str,
        shape: tuple[int, ...] | None,
        dtype: torch.dtype,
        shared: bool = False,
        written: bool = True,
    ) -> None:
        """Declare ``key`` (next in the samples' key order) with one sample's ``shape``
        (``None``: per-segment values, of shapes that differ); ``shared``: in the batch's
        shared memory where it will be collated; ``written``: filled through :meth:`put`
        (else by a decoder, through :attr:`rows`)."""
        self._keys.append(key)
        self._dtypes[key] = dtype
        if shape is None:
            self._lists[key] = [None] * self.size
            return
        full = (self.size, *shape)
        tensor = batch_tensor(full, dtype) if shared else torch.empty(full, dtype=dtype)
        self.rows[key] = batch_rows(tensor)
        if written:
            self._arrays[key] = tensor.numpy()

    def put(self, key: str, where: np.ndarray, values: np.ndarray) -> None:
        """Samples ``where`` of ``key`` are ``values`` (``(len(where), ...)``, cast to the
        key's dtype as ``astype`` casts)."""
        array = self._arrays.get(key)
        if array is not None:
            array[where] = values
            return
        tensor = torch.from_numpy(np.ascontiguousarray(values, dtype=_NUMPY[self._dtypes[key]]))
        self.scatter(key, where.tolist(), tensor.unbind(0))

    def scatter(self, key: str, where: list[int], values: Sequence[Any]) -> None:
        """Samples ``where`` of the per-segment ``key`` are ``values``."""
        column = self._lists[key]
        for i, value in zip(where, values, strict=True):
            column[i] = value

    def meta(self, where: list[int], meta: dict[str, Any]) -> None:
        """Samples ``where`` have ``meta`` (each gets its own copy)."""
        for i in where:
            self._metas[i] = meta

    def samples(self) -> list[dict[str, Any]]:
        """One dict per sample: its row of every key, then ``meta``."""
        keys = self._keys
        columns = [self.rows[k] if k in self.rows else self._lists[k] for k in keys]
        out = []
        for values, meta in zip(zip(*columns, strict=True), self._metas, strict=True):
            sample = dict(zip(keys, values, strict=True))
            sample["meta"] = dict(meta)
            out.append(sample)
        return out
