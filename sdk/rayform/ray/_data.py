"""Ray Data: a slice read into a ``ray.data.Dataset``, one row per sample or per episode.

:func:`read_slice` builds the :class:`~rayform.torch.EpisodeDataset` on the driver (it reads
the manifest only) and hands Ray a :class:`SliceDatasource`. Each read task holds a run of
consecutive samples, a whole number of blocks (:func:`group_rows`; by default at least four),
so each video is decoded in one forward pass per task; with two or more cameras a task decodes
them in two threads and asks Ray for two CPUs. Each Ray worker process rebuilds the dataset
from its URI (``EpisodeDataset.from_uri``) once, with the driver's client (its cache directory,
shared mode, offline mode and limits travel with it), and keeps it for its next tasks and
later reads of the same dataset, client and options; a task reads its rows with
``__getitems__`` in time order and yields blocks sized to pass Ray's block shaping whole
(:func:`rows_per_block`): a consumer's batches of 32 rows are then views of one block, not
copies of pieces of several. The rows
are the dataset's samples, exactly: the same tensors as ``dataset[index]`` (``meta``
flattened into ``meta/...`` columns, plus ``meta/index``).
"""

from __future__ import annotations

import hashlib
import os
import secrets
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import ray.data
import torch
from ray import cloudpickle
from ray.data.block import BlockAccessor, BlockMetadata
from ray.data.datasource import Datasource, ReadTask

from rayform.errors import InvalidArgumentError
from rayform.slice import Slice
from rayform.torch import EpisodeDataset

__all__ = [
    "ROWS",
    "SliceDatasource",
    "group_episodes",
    "group_rows",
    "read_slice",
    "rows_per_block",
]

#: What a row is: one ``EpisodeDataset`` sample, or one episode (metadata and blob references).
ROWS = ("samples", "episodes")
#: Decode threads (and CPUs) a read task takes by default, one per camera up to this many.
TASK_THREADS = 2
#: Blocks a read task holds at least by default, where the cluster has tasks enough for every
#: CPU without smaller ones: Ray Data spends ~20 ms around each task (its logging set up, the
#: task's arguments read, the scheduler's turn), an eighth of a 96-row block's decode on two
#: CPUs (one-block tasks read 615-637 rows/s where runs of four read 650-670).
TASK_BLOCKS = 4
#: Task options ``ray.data.read_datasource`` takes by name (the rest go in ray_remote_args).
_NAMED_REMOTE_ARGS = frozenset(
    {
        "num_cpus",
        "num_gpus",
        "memory",
        "resources",
        "accelerator_type",
        "runtime_env",
        "label_selector",
        "fallback_strategy",
        "max_calls",
    }
)
#: Default bound on a block's bytes.
MAX_BLOCK_BYTES = 256 << 20
#: Options of ``EpisodeDataset.from_uri`` that a read task passes on (never sample-changing).
_TASK_OPTIONS = ("transform", "decoder_cache_size", "decoder_backend", "decode_threads")
#: Datasets a worker process keeps for its next read tasks (by URI and datasource).
_DATASETS: dict[tuple[str, str], EpisodeDataset] = {}
_KEEP = 2


def read_slice(
    source: Slice | EpisodeDataset,
    obs: Sequence[str] | Mapping[str, str] | None = None,
    action: str | Mapping[str, str] | None = None,
    fps: float | None = None,
    *,
    rows: str = "samples",
    override_num_blocks: int | None = None,
    max_block_bytes: int = MAX_BLOCK_BYTES,
    ray_remote_args: dict[str, Any] | None = None,
    **dataset_kwargs: Any,
) -> ray.data.Dataset:
    """A slice (or an ``EpisodeDataset``) as a ``ray.data.Dataset``.

    Args:
        source: a :class:`~rayform.Slice` (or a ``select()`` view of one), with the
            ``EpisodeDataset`` arguments that follow; or an ``EpisodeDataset`` as built.
        obs: as ``EpisodeDataset``'s (with a slice and ``rows="samples"``).
        action: as ``EpisodeDataset``'s (required with a slice and ``rows="samples"``; pass
            ``None`` for no action stream).
        fps: as ``EpisodeDataset``'s.
        rows: ``"samples"``: one row per dataset sample, the same tensors as
            ``dataset[index]`` (cameras ``(3, H, W) uint8``, vectors, ``action``, masks,
            ``t_ns``) plus ``meta/index`` (the dataset index) and ``meta/slice``,
            ``meta/segment``, ``meta/segment_version``, ``meta/site``. ``"episodes"``: one row
            per episode: ``segment``, ``segment_version``, ``site``, ``start_ns``, ``end_ns``,
            ``slice``, ``manifest_hash``, ``samples`` (with a dataset) and for each stream read
            (every stream, for a bare slice) ``blob/<stream>`` (BLAKE3 hash) and
            ``nbytes/<stream>``.
        override_num_blocks: read tasks to make (default for sample rows: runs of at least
            four blocks, more where the cluster's CPUs would otherwise lack tasks
            (:meth:`SliceDatasource.default_num_blocks`); for episode rows one per episode; at
            most ``DataContext.read_op_min_num_blocks``, 200); at most one per block.
        max_block_bytes: bound on the bytes of one block (default 256 MiB); by default a
            block is what Ray's block shaping hands on whole (:func:`rows_per_block`).
        ray_remote_args: the read tasks' Ray options (``num_cpus``, ``memory``,
            ``resources``, ``runtime_env``, ...; those ``ray.data.read_datasource`` names are
            passed by name, the rest as its ``ray_remote_args``); ``num_cpus`` defaults to the
            task's decode threads (2 with two or more cameras, at most a node's CPUs).
        **dataset_kwargs: the other ``EpisodeDataset`` arguments (``horizon``,
            ``image_size``, ``resize``, ``segments``, ``obs_steps``, ``frame``, ...).

    Returns:
        A lazy ``ray.data.Dataset``.

    Raises:
        InvalidArgumentError: a bad ``rows`` or ``max_block_bytes``, or dataset arguments
            with a built dataset.
    """
    if rows not in ROWS:
        raise InvalidArgumentError(f"rows={rows!r}: use one of {', '.join(map(repr, ROWS))}")
    if isinstance(max_block_bytes, bool) or not isinstance(max_block_bytes, int):
        raise InvalidArgumentError(f"max_block_bytes={max_block_bytes!r}: use a positive integer")
    if max_block_bytes < 1:
        raise InvalidArgumentError(f"max_block_bytes={max_block_bytes!r}: use a positive integer")
    if isinstance(source, EpisodeDataset):
        if obs is not None or fps is not None or dataset_kwargs:
            raise InvalidArgumentError(
                "read_slice(dataset) takes the dataset as built: pass the EpisodeDataset "
                "arguments with a slice instead, read_slice(slice_, obs=..., action=..., fps=...)"
            )
        datasource = SliceDatasource(source, max_block_bytes=max_block_bytes, rows=rows)
    elif isinstance(source, Slice):
        if rows == "episodes" and obs is None and fps is None and not dataset_kwargs:
            datasource = SliceDatasource(source, max_block_bytes=max_block_bytes, rows=rows)
        else:
            if obs is None or fps is None:
                raise InvalidArgumentError(
                    "read_slice(slice_, ...) needs the EpisodeDataset arguments obs=, action= and "
                    "fps= (rows='episodes' alone needs none)"
                )
            dataset = EpisodeDataset(source, obs, action, fps, shard=None, **dataset_kwargs)
            given = {k: v for k, v in dataset_kwargs.items() if k in _TASK_OPTIONS}
            datasource = SliceDatasource(
                dataset, max_block_bytes=max_block_bytes, rows=rows, options=given
            )
    else:
        raise InvalidArgumentError(
            "read_slice needs a rayform.Slice (client.slices.get(...)) or a "
            f"rayform.torch.EpisodeDataset, got {type(source).__name__}"
        )
    if override_num_blocks is None:
        # Ray's own default asks for more blocks than there are episodes and then splits each
        # task's blocks into pieces a consumer's batch has to copy back together.
        override_num_blocks = datasource.default_num_blocks()
    remote_args = {"num_cpus": datasource.task_cpus, **(ray_remote_args or {})}
    # Ray 2.60 takes the common task options as named parameters and deprecates them in
    # ray_remote_args (a warning on every call); what it does not name still goes there.
    named = {k: remote_args.pop(k) for k in list(remote_args) if k in _NAMED_REMOTE_ARGS}
    if remote_args:
        named["ray_remote_args"] = remote_args
    read: ray.data.Dataset = ray.data.read_datasource(
        datasource, override_num_blocks=override_num_blocks, **named
    )
    return read


def group_episodes(lengths: Sequence[int], groups: int) -> list[range]:
    """Consecutive episode ranges, at most ``groups`` of them, of about equal sample counts.

    Args:
        lengths: samples per episode, in dataset order (episodes of no sample still count).
        groups: the number of ranges wanted (>= 1); fewer when there are fewer episodes.

    Returns:
        Non-empty ranges of episode positions that cover ``range(len(lengths))`` in order.
    """
    n = len(lengths)
    groups = max(1, min(int(groups), n))
    if n == 0:
        return []
    weights = np.maximum(np.asarray(lengths, dtype=np.float64), 1.0)
    ends = np.cumsum(weights)
    cuts = np.searchsorted(ends, ends[-1] * np.arange(1, groups) / groups, side="left") + 1
    bounds = sorted({0, *(int(c) for c in cuts if 0 < c < n), n})
    return [range(a, b) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]


def rows_per_block(row_bytes: int, max_block_bytes: int, target: int | None) -> int:
    """Rows of one block of a read task.

    Ray's read operator reshapes a task's blocks to ``DataContext.target_max_block_size``
    (``target``, 128 MiB by default): it gathers blocks until their bytes pass the target,
    into columns of several chunks that a consumer's batch then copies into one (a copy of every
    row), and slices a block of 1.5 times the target or more
    at rows that a batch does not start on. A block of more than the target and less than 1.5
    times it (with a margin for the size estimate) passes through as it is; of the row counts
    that make such a block, the one with the most factors of two (96 rows of two 480x640
    cameras, a multiple of 32; 48 of four), so that a consumer's batches of 32 (or 16) rows are
    views of one block. Where no row count fits (rows of tens of MB) or
    ``max_block_bytes`` is below the target: a power of two rows within both.

    Args:
        row_bytes: bytes of one row (an estimate).
        max_block_bytes: bound on a block's bytes.
        target: Ray's ``target_max_block_size``, or None (no reshaping).
    """
    row_bytes = max(1, row_bytes)
    if target:
        low = int(1.05 * target) // row_bytes + 1
        high = int(min(1.45 * target, max_block_bytes)) // row_bytes
        if low <= high:
            step = 1 << (high.bit_length() - 1)
            while high // step * step < low:
                step //= 2  # ends at 1 at the latest: low itself
            return high // step * step
    cap = min(max_block_bytes, target or max_block_bytes)
    rows = max(1, cap // row_bytes)
    return 1 << (rows.bit_length() - 1)


def group_rows(lengths: Sequence[int], groups: int, block_rows: int) -> list[range]:
    """The sample rows of episodes of ``lengths`` cut into at most ``groups`` consecutive
    ranges of about equal numbers of whole blocks of ``block_rows`` rows.

    Every task's blocks then hold ``block_rows`` rows but the very last one: a consumer's
    batches of a power-of-two size (``<= block_rows``) are views of one block each, never
    copies of two blocks' pieces (a task that ended with a short block shifted every batch
    after it). Cuts fall where the blocks do, within an episode as well as between two: an
    episode that a cut falls in is read by the two tasks that meet there, each its own frames
    in one forward pass, and ranges of equal size keep every CPU busy to the end of the read
    (five tasks on two CPUs left one CPU idle for the fifth).

    Args:
        lengths: samples per episode, in dataset order.
        groups: the number of ranges wanted (>= 1).
        block_rows: rows of a full block (>= 1).

    Returns:
        Non-empty, consecutive row ranges covering ``range(sum(lengths))``.
    """
    total = int(sum(lengths))
    blocks = -(-total // max(1, block_rows))
    groups = max(1, min(int(groups), blocks))
    cuts = (min(total, round(blocks * k / groups) * block_rows) for k in range(1, groups))
    bounds = sorted({0, *cuts, total})
    return [range(a, b) for a, b in zip(bounds[:-1], bounds[1:], strict=True) if b > a]


class SliceDatasource(Datasource):
    """The Ray Data source behind :func:`read_slice` (Ray's ``Datasource`` API).

    Args:
        source: an ``EpisodeDataset`` (sample or episode rows) or a ``Slice`` (episode rows).
        max_block_bytes: bound on one block's bytes.
        rows: ``"samples"`` or ``"episodes"``.
        options: ``EpisodeDataset.from_uri`` options for the tasks' datasets (``transform``,
            ``decoder_backend``...; default: those the dataset shows as attributes).
    """

    def __init__(
        self,
        source: EpisodeDataset | Slice,
        *,
        max_block_bytes: int,
        rows: str = "samples",
        options: Mapping[str, Any] | None = None,
    ) -> None:
        # Ray leaves Datasource.__init__ unannotated (untyped_calls_exclude misses super()).
        super().__init__()  # type: ignore[no-untyped-call]
        self.rows = rows
        self.max_block_bytes = int(max_block_bytes)
        if isinstance(source, EpisodeDataset):
            self._slice: Any = source.slice
            self._uri = source.uri
            self._options = {k: getattr(source, k) for k in _TASK_OPTIONS if hasattr(source, k)}
            self._options.update(options or {})
            self._lengths = list(source.segment_lengths.values())
            self._streams: list[str] | None = [
                *source.obs,
                *([source.action] if source.action else []),
            ]
            spec = source.sample_spec()
            self._row_bytes = _row_bytes(spec)
            cameras = sum(1 for d, shape in spec.values() if d == "uint8" and len(shape) == 3)
            if not self._options.get("decode_threads"):
                # A task decodes its cameras' videos in parallel (one thread per camera, up to
                # TASK_THREADS) and asks Ray for as many CPUs: Ray Data admits read tasks one
                # or two at a time while its resource budget ramps up, and a task that used
                # one CPU left the others idle.
                threads = min(TASK_THREADS, cameras, _node_cpus())
                if threads > 1:
                    self._options["decode_threads"] = threads
        else:
            self._slice = source
            self._uri, self._options, self._streams = "", {}, None
            self._lengths = [1] * len(source.segments)
            self._row_bytes = 256
        #: CPUs a read task asks Ray for: its decode threads, at most a node's CPUs.
        self.task_cpus = max(1, min(int(self._options.get("decode_threads") or 1), _node_cpus()))
        # Workers keep the dataset they built by this key: a later read_slice of the same
        # dataset with the same client and options reuses it (its open decoders and tables).
        self._token = _dataset_key(self._uri, self._options, self._slice.client)
        if rows == "samples" and not self._uri:
            raise InvalidArgumentError("rows='samples' needs an EpisodeDataset")

    def estimate_inmemory_data_size(self) -> int | None:
        """Bytes of all rows: per sample (or episode) row bytes times rows."""
        rows = sum(self._lengths) if self.rows == "samples" else len(self._lengths)
        return int(self._row_bytes * rows)

    def default_num_blocks(self) -> int:
        """Read tasks when the caller names none (sample rows): runs of at least
        :data:`TASK_BLOCKS` blocks, unless that leaves fewer than two tasks per task slot of
        the cluster (its CPUs over a task's); one per block at most, and at most Ray's
        ``DataContext.read_op_min_num_blocks`` (200). Episode rows: one task per episode, at
        most that many."""
        context = ray.data.DataContext.get_current()
        floor = int(getattr(context, "read_op_min_num_blocks", 200))
        if self.rows == "samples":
            blocks = -(-sum(self._lengths) // self._block_rows(context))
            slots = max(1, _cluster_cpus() // self.task_cpus)
            tasks = max(-(-blocks // TASK_BLOCKS), 2 * slots)
            return max(1, min(tasks, blocks, floor))
        return max(1, min(len(self._lengths), floor))

    def _block_rows(self, data_context: ray.data.DataContext | None) -> int:
        target = getattr(data_context, "target_max_block_size", None)
        return rows_per_block(self._row_bytes, self.max_block_bytes, target)

    def get_read_tasks(
        self,
        parallelism: int,
        per_task_row_limit: int | None = None,
        data_context: ray.data.DataContext | None = None,
    ) -> list[ReadTask]:
        """At most ``parallelism`` tasks: equal runs of whole blocks of samples (of episodes
        for episode rows).

        Args:
            parallelism: tasks wanted.
            per_task_row_limit: rows a task reads at most (Ray's limit pushdown).
            data_context: Ray's ``DataContext`` (its ``target_max_block_size`` bounds blocks).
        """
        block_rows = self._block_rows(data_context)
        if self.rows == "samples":
            ranges = group_rows(self._lengths, parallelism, block_rows)
        else:
            ranges = group_episodes(self._lengths, parallelism)
        tasks = []
        for part in ranges:
            n = len(part)  # sample rows, or episodes
            if per_task_row_limit is not None:
                n = min(n, int(per_task_row_limit))
            if n == 0:
                continue
            meta = BlockMetadata(
                num_rows=n, size_bytes=n * self._row_bytes, input_files=None, exec_stats=None
            )
            read = _ReadPart(self, part, block_rows, n)
            tasks.append(ReadTask(read, meta, per_task_row_limit=per_task_row_limit))
        return tasks

    # -- what a read task runs (in a Ray worker) -------------------------------------------
    def read_samples(self, rows: range, block_rows: int, limit: int) -> Iterator[Any]:
        """Blocks of the samples ``rows`` (dataset indices, in time order), ``block_rows``
        each (the last one fewer): a block may span the end of one episode and the start of
        the next."""
        dataset = self._dataset()
        start = rows.start
        stop = min(rows.stop, start + max(0, limit))
        for pos in range(start, stop, block_rows):
            indices = list(range(pos, min(pos + block_rows, stop)))
            yield BlockAccessor.batch_to_block(_to_columns(dataset.__getitems__(indices), indices))

    def _dataset(self) -> EpisodeDataset:
        """The dataset, rebuilt from its URI once per worker process and datasource (a Ray
        worker runs many read tasks: they share its open decoders and resolved manifest)."""
        key = (self._uri, self._token)
        dataset = _DATASETS.get(key)
        if dataset is None:
            dataset = EpisodeDataset.from_uri(
                self._uri, client=self._slice.client, shard=None, **self._options
            )
            while len(_DATASETS) >= _KEEP:
                _DATASETS.pop(next(iter(_DATASETS)))
            _DATASETS[key] = dataset
        return dataset

    def read_episodes(self, episodes: range, block_rows: int, limit: int) -> Iterator[Any]:
        """Blocks of one row per episode of ``episodes``: metadata and blob references."""
        segments = self._slice.segments
        chosen = list(episodes)[:limit]
        for i in range(0, len(chosen), block_rows):
            columns: dict[str, list[Any]] = {}
            for e in chosen[i : i + block_rows]:
                seg = segments[e]
                row: dict[str, Any] = {
                    "segment": seg.id,
                    "segment_version": int(seg.version),
                    "site": seg.site,
                    "start_ns": int(seg.start_ns),
                    "end_ns": int(seg.end_ns),
                    "slice": self._slice.id,
                    "manifest_hash": self._slice.manifest_hash,
                }
                if self._uri:
                    row["samples"] = int(self._lengths[e])
                for name in self._streams or sorted(seg.streams):
                    blob = seg.streams[name].blob
                    row[f"blob/{name}"] = blob.hash
                    row[f"nbytes/{name}"] = int(blob.size)
                for key, value in row.items():
                    columns.setdefault(key, []).append(value)
            yield BlockAccessor.batch_to_block({k: np.asarray(v) for k, v in columns.items()})


class _ReadPart:
    """A read task's function (picklable): one part of a :class:`SliceDatasource`, a range of
    sample rows or of episodes."""

    def __init__(self, source: SliceDatasource, part: range, block_rows: int, limit: int):
        self.source, self.part, self.block_rows, self.limit = source, part, block_rows, limit

    def __call__(self) -> Iterator[Any]:
        if self.source.rows == "episodes":
            return self.source.read_episodes(self.part, self.block_rows, self.limit)
        return self.source.read_samples(self.part, self.block_rows, self.limit)


def _to_columns(samples: list[dict[str, Any]], indices: list[int]) -> dict[str, np.ndarray]:
    """Samples as columns: tensors stacked, ``meta`` flattened to ``meta/<field>``."""
    out: dict[str, np.ndarray] = {"meta/index": np.asarray(indices, dtype=np.int64)}
    for key in samples[0]:
        if key == "meta":
            for field in samples[0]["meta"]:
                out[f"meta/{field}"] = np.asarray([s["meta"][field] for s in samples])
        elif isinstance(samples[0][key], torch.Tensor):
            out[key] = _stacked([s[key] for s in samples]).numpy()
        elif isinstance(samples[0][key], list):  # a text key's events (or history): ragged
            column = np.empty(len(samples), dtype=object)
            column[:] = [s[key] for s in samples]
            out[key] = column
        else:
            out[key] = np.asarray([s[key] for s in samples])
    return out


def _stacked(rows: list[torch.Tensor]) -> torch.Tensor:
    """``torch.stack(rows)``; a view, not a copy, when the rows are consecutive rows of one
    contiguous tensor, as ``__getitems__`` returns them (each key of a batch is one
    ``(B, ...)`` tensor): a block's frames are then copied once, into Ray's object store."""
    first = rows[0]
    storage, start, step = first.untyped_storage(), first.storage_offset(), first.numel()
    consecutive = all(
        r.is_contiguous()
        and r.dtype == first.dtype
        and r.shape == first.shape
        and r.untyped_storage().data_ptr() == storage.data_ptr()
        and r.storage_offset() == start + i * step
        for i, r in enumerate(rows)
    )
    if not consecutive or step == 0:
        return torch.stack(rows)
    return torch.as_strided(first, (len(rows), *first.shape), (step, *first.stride()), start)


def _node_cpus() -> int:
    """CPUs of the largest live node of the Ray cluster (this machine's before Ray starts)."""
    cpus = _live_node_cpus()
    return max(cpus) if cpus else os.cpu_count() or 1


def _cluster_cpus() -> int:
    """CPUs of the Ray cluster's live nodes (this machine's before Ray starts)."""
    cpus = _live_node_cpus()
    return sum(cpus) if cpus else os.cpu_count() or 1


def _live_node_cpus() -> list[int]:
    """CPUs of each live node of the Ray cluster with any (none before Ray starts)."""
    if not ray.is_initialized():
        return []
    cpus = (int(n.get("Resources", {}).get("CPU", 0)) for n in ray.nodes() if n.get("Alive"))
    return [c for c in cpus if c > 0]


def _dataset_key(uri: str, options: Mapping[str, Any], client: object) -> str:
    """A digest of what a worker's dataset is built from: the URI (which pins the manifest),
    the task options and the client as it travels (endpoint, cache, modes, limits); a random
    one where they do not pickle."""
    try:
        state = cloudpickle.dumps((uri, sorted(options.items()), client))
    except Exception:  # any pickling failure: then this datasource's own dataset, as before
        return secrets.token_hex(8)
    return hashlib.sha256(state).hexdigest()[:32]


def _row_bytes(spec: dict[str, tuple[str, tuple[int, ...]]]) -> int:
    """Bytes of one sample row from ``EpisodeDataset.sample_spec()`` (plus ~128 of metadata)."""
    total = 128
    for dtype, shape in spec.values():
        # A text key (a string, a list of records) counts as a short string per step.
        size = 64 if dtype in ("str", "events") else np.dtype(dtype).itemsize
        total += int(size * int(np.prod(shape, dtype=np.int64)))
    return total
