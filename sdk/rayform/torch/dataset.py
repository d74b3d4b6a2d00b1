"""``EpisodeDataset``: a slice as a map-style PyTorch dataset on a fixed-rate time grid.

This module holds only the public class: a validated spec (``_spec``: every argument,
checked once) plus the grid (``_index``), a reader (``_reader``; decoding in the ``_decoding``
package, alignment in ``_align``, conventions in ``_conventions``) and read-ahead
(``_readahead``), with epochs and the sampler's hooks (the ``_sampling`` package). Statistics
are in ``_stats``, ``describe()`` and the reprs in ``_describe``, the URI in ``_lineage``.
Semantics: ``docs/dataset.md``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
from torch.utils.data import Dataset, get_worker_info

from rayform._boundary import argument_errors
from rayform._checks import check_non_negative_int
from rayform._resolution import Target, image_size_of
from rayform._seams import BlobSource
from rayform.client import Client
from rayform.curation import Labels
from rayform.errors import InvalidArgumentError
from rayform.manifest import Segments, Stream, release_pages
from rayform.torch._blobs import check_cache_fits
from rayform.torch._describe import describe_dataset, html_repr, text_repr
from rayform.torch._index import GridIndex, build_index, resolve_keys
from rayform.torch._lineage import dataset_arguments, dataset_uri
from rayform.torch._normalize import Normalizer, Values, unnormalize
from rayform.torch._readahead import ReadAhead
from rayform.torch._reader import BatchPlan, SampleReader, run_plans
from rayform.torch._sampling import (
    CacheFootprint,
    IndexStream,
    SharedEpoch,
    episode_streams,
    shard_check,
)
from rayform.torch._spans import within_index
from rayform.torch._spec import (
    DEFAULT_READAHEAD_BYTES,
    DatasetSpec,
    FromSpec,
    Tokenizer,
    Transform,
    check_spec,
)
from rayform.torch._stats import dataset_stats, normalizer_of, stats_arrays
from rayform.torch._text import tokenize
from rayform.uri import DatasetURI

__all__ = ["EpisodeDataset", "read_together"]

#: ``(episode positions (N,), grid steps (N,))`` of a batch's keys.
Located = tuple[np.ndarray, np.ndarray]
#: A part of :func:`read_together` in flight: its dataset, flat indices, transform tags, what
#: returns its samples as read, and its plan (``None`` when read already).
_Pending = tuple[
    "EpisodeDataset",
    np.ndarray,
    list[tuple[int, int]],
    Callable[[], list[dict[str, Any]]],
    BatchPlan | None,
]


class EpisodeDataset(Dataset[dict[str, Any]]):
    """Samples of a slice's episodes on a ``fps`` Hz grid.

    Each sample holds every observation stream at the grid time ``t`` (the latest record at
    or before ``t``; cameras ``(3, H, W) uint8``, vectors ``(D,) float32``), the action chunk
    ``action (horizon, D) float32`` at ``t, t + 1/fps, ...`` with ``action_is_pad
    (horizon,) bool``, ``t_ns () int64`` and ``meta`` (``slice``, ``segment``,
    ``segment_version``, ``site``). The constructor reads only the manifest: it opens no file,
    decoder or connection, so it is safe to build before DataLoader workers fork.

    Args:
        slice_: a :class:`~rayform.Slice` from ``client.slices.get(...)``.
        obs: observation stream names, e.g. ``["cam0/rgb", "joints/position"]`` (each is its
            sample key), or ``{sample key: stream name}``, e.g. ``{"image_primary":
            "cam0/rgb", "state": "joints/position"}`` (docs/mixtures.md). Keys the sample
            already uses (``meta``, ``t_ns``, ``action``, ``*_is_pad``, ``*_dim_is_pad``,
            ``*_is_missing``) are refused.
        action: action stream name (a table stream; sample key ``"action"``), a dict with one
            entry ``{sample key: stream name}`` (its mask is ``<key>_is_pad``), or ``None`` for
            no action stream: samples then have no ``action``/``action_is_pad`` keys. Required
            (no default) so that leaving out the action is a decision, not an accident.
        fps: grid rate in Hz (> 0).
        horizon: action chunk length in grid steps (>= 1).
        frame: coordinate convention for Cartesian streams: ``"ros"``, ``"opencv"`` or
            ``None`` (as stored).
        segments: IDs of the episodes to use (default: all, in manifest order); see
            :func:`~rayform.torch.split_episodes`.
        obs_steps: observation history in grid steps; with ``n > 1`` every observation gets
            a leading time axis of length ``n`` (oldest first) and a ``<key>_is_pad (n,) bool``
            mask that is true for steps before the episode start.
        action_mode: ``"hold"`` (sample-and-hold), ``"nearest"`` or ``"linear"``.
        transform: optional ``callable(sample) -> sample`` applied per sample; torch's RNG
            inside it is seeded from ``(seed, epoch, index)``.
        seed: seed of every random choice (sampler order, transform RNG).
        shard: ``"auto"`` (the ``torch.distributed`` rank and world size when it is initialised
            as the dataset is built), ``None`` (one process), or ``(rank, world_size)``. It tells
            :class:`~rayform.torch.EpisodeSampler` which shard this process reads; the dataset's
            index space (``len``) is always all ranks' samples.
        ddp_even: how ``EpisodeSampler`` cuts the shards: ``"split"`` (consecutive episodes,
            sizes equal to within one sample, at most ``world_size - 1`` episodes shared by two
            ranks), ``"pad"`` or ``"drop"`` (whole episodes; see ``docs/dataset.md``).
        decoder_cache_size: open video decoders kept per process (>= 1; each holds about
            3 MiB at 480x640). The default, 64, holds every video a shuffled batch touches on
            slices of up to 32 two-camera episodes per worker; a smaller LRU reopens decoders.
        decoder_backend: ``"torchcodec"``, ``"pyav"`` or ``None`` (per video: the all-intra
            packet decoder where it decodes the same bits, else torchcodec if it loads, else
            PyAV).
        decode_threads: threads that decode video inside each ``__getitems__`` call (>= 0;
            0, the default, decodes in the calling thread; the threads end with the call). For
            ``DataLoader(num_workers=0)``: several cores decode with no worker processes and
            no shared-memory transfer. With worker processes leave it at 0 (the workers already
            use the cores) and pass ``collate_fn=rayform.torch.collate``, which was faster in
            the benchmark (docs/benchmarks.md).
        readahead_bytes: with :class:`~rayform.torch.EpisodeSampler`, blobs that the next
            batches of this process need are fetched in the background, at most this many
            bytes in flight (default 256 MiB; 0 turns it off; see docs/dataset.md).
        image_size: the training resolution of cameras: ``None`` (the default: frames as
            stored), ``(H, W)`` in pixels for every camera, or ``{camera key: (H, W)}`` naming
            every camera. Each camera of a sample is then ``(3, H, W) uint8``, resized
            (bilinear, antialiased) in the process that decodes it, the same pixels whatever
            ``decoder_backend`` (docs/dataset.md, "Training resolution").
        resize: how a frame becomes ``(H, W)``: ``"pad"`` (keep the aspect ratio, fit inside,
            zero padding centred; pi0), ``"squash"`` (scale each axis; OpenVLA, Octo) or
            ``"crop"`` (scale the short side, crop the centre; Diffusion Policy). Used only
            with ``image_size``.
        normalize: ``None`` (values as stored), ``"mean_std"`` (``(x - mean) / std``),
            ``"quantile"`` (q01/q99 mapped to -1/1) or given statistics ``{sample key:
            {"mean": [...], "std": [...]}}`` (e.g. ``train.normalization()``): every vector
            (table observations and the action) is normalised with this dataset's own
            statistics, computed on first use and cached like :meth:`stats`; components that
            never change are only centred; applied before ``transform``. :meth:`unnormalize`
            undoes it (docs/mixtures.md).
        tokenizer: optional ``callable(list of N strings) -> {name: tensor (N, ...)}`` (e.g.
            a Hugging Face tokenizer with ``return_tensors="pt", padding="max_length"``), run
            on each batch's state text keys in the worker, before ``transform``: key ``task``
            gets ``task_<name>`` per sample (``task_input_ids (L,)``...; ``(n, L)`` with
            ``obs_steps=n``); the strings stay. Not in the URI (``from_uri`` takes it again).
        within: ``None`` (every grid time is a sample), ``"KEY"`` or ``"KEY:NAME"``: only the
            grid times inside the time ranges of spans label ``KEY`` (of that name) are samples,
            e.g. ``within="events:grasp_failed"``; each episode's grid, action chunks and
            padding stay as they are, and so do the order, the DDP shards by episode and
            :meth:`stats` (over the episodes' whole grids). Pinned in the URI.
        labels: the label set that ``within`` and ``"label:KEY"`` observations read (an
            observation that gives, at sample time ``t``, the names of the ranges of spans
            label ``KEY`` with ``t0 <= t < t1``): ``slice_.labels``, a label-set hash, or
            ``None`` for the latest. Its hash is pinned in the URI (docs/curation.md).

    Raises:
        InvalidArgumentError: a value is not allowed (the message says what is).
        NotFoundError: a stream or segment is not in the slice (the message lists what is).
    """

    @argument_errors
    def __init__(
        self,
        slice_: BlobSource,
        obs: Sequence[str] | Mapping[str, str],
        action: str | Mapping[str, str] | None,
        fps: float,
        horizon: int = 1,
        frame: str | None = None,
        *,
        segments: Sequence[str] | None = None,
        obs_steps: int = 1,
        action_mode: str = "hold",
        transform: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
        seed: int = 0,
        shard: str | tuple[int, int] | None = "auto",
        ddp_even: str = "split",
        decoder_cache_size: int = 64,
        decoder_backend: str | None = None,
        decode_threads: int = 0,
        readahead_bytes: int = DEFAULT_READAHEAD_BYTES,
        image_size: tuple[int, int] | dict[str, tuple[int, int]] | None = None,
        resize: str = "pad",
        normalize: str | Mapping[str, Any] | None = None,
        tokenizer: Tokenizer | None = None,
        within: str | None = None,
        labels: Labels | str | None = None,
    ) -> None:
        spec = check_spec(
            slice_, obs, action, fps, horizon, frame, segments=segments, obs_steps=obs_steps,
            action_mode=action_mode, transform=transform, seed=seed, shard=shard,
            ddp_even=ddp_even, decoder_cache_size=decoder_cache_size,
            decoder_backend=decoder_backend, decode_threads=decode_threads,
            readahead_bytes=readahead_bytes, image_size=image_size, resize=resize,
            normalize=normalize, tokenizer=tokenizer, within=within, labels=labels,
        )  # fmt: skip
        #: The dataset's arguments, checked (:class:`~rayform.torch.DatasetSpec`).
        self.spec: DatasetSpec = spec
        self._epoch = SharedEpoch(0)  # shared with forked (persistent) workers
        self._read_bytes = check_cache_fits(spec.slice, spec.segments, spec.streams, spec.targets)
        self._index: GridIndex = build_index(spec.segments, spec.grid_streams, spec.fps)
        if spec.within is not None:
            self._index = within_index(self._index, spec.spans[spec.within[0]], spec.within)
        # The checks and the index read columns of every segment: unmap those pages, or
        # every DataLoader worker would inherit them as its own resident memory.
        release_pages(spec.segments)
        self._reader = SampleReader(spec, self._index)
        self._readahead = ReadAhead(
            spec.slice, self._index, spec.streams, spec.targets, (spec.rank, spec.world),
            self.order_streams, max_bytes=spec.readahead_bytes, pins=self._reader.pins,
        )  # fmt: skip
        self._normalizer: Normalizer | None = None  # computed on first use (normalization())
        self._shard_check = shard_check(len(self._index))  # None outside a multi-process DDP

    slice: FromSpec[BlobSource] = FromSpec()
    obs: FromSpec[list[str]] = FromSpec()
    action: FromSpec[str | None] = FromSpec()
    fps: FromSpec[float] = FromSpec()
    horizon: FromSpec[int] = FromSpec()
    frame: FromSpec[str | None] = FromSpec()
    obs_steps: FromSpec[int] = FromSpec()
    action_mode: FromSpec[str] = FromSpec()
    transform: FromSpec[Transform | None] = FromSpec()
    seed: FromSpec[int] = FromSpec()
    ddp_even: FromSpec[str] = FromSpec()
    decoder_cache_size: FromSpec[int] = FromSpec()
    decode_threads: FromSpec[int] = FromSpec()
    resize: FromSpec[str] = FromSpec()

    # -- size and epochs -------------------------------------------------------------------
    def __len__(self) -> int:
        """Samples of the dataset's episodes, all ranks' together (one epoch of the index space).

        The index space is the same on every rank: sharding is the sampler's job
        (:class:`~rayform.torch.EpisodeSampler` by episode, ``DistributedSampler`` by sample).
        """
        return len(self._index)

    @property
    def epoch(self) -> int:
        """The epoch set by :meth:`set_epoch` (starts at 0)."""
        return self._epoch.get()

    @property
    def sharded(self) -> bool:
        """Whether :class:`~rayform.torch.EpisodeSampler` gives this rank a shard (world > 1)."""
        return self.spec.world > 1

    @property
    def shard(self) -> tuple[int, int]:
        """``(rank, world_size)`` that :class:`~rayform.torch.EpisodeSampler` shards for."""
        return self.spec.rank, self.spec.world

    @property
    def image_size(self) -> tuple[int, int] | dict[str, tuple[int, int]] | None:
        """The cameras' training resolution: ``None`` (as stored), ``(H, W)`` when every camera
        has the same, else ``{sample key: (H, W)}`` (the form ``image_size=`` takes)."""
        return image_size_of(self.spec.targets, self.spec.names.key_of)

    @property
    def targets(self) -> dict[str, Target]:
        """Camera stream name -> its training resolution (:class:`rayform._resolution.Target`); empty
        without ``image_size``. Which blob a camera reads follows from it
        (``rayform._resolution.choose_rendition``)."""
        return dict(self.spec.targets or {})

    def frame_shape(self, name: str) -> tuple[int, int, int]:
        """``(3, H, W)``: the shape of camera ``name``'s frames in samples (without the
        ``obs_steps`` axis), after ``image_size``. ``name`` is a sample key or, where it is
        none, a stream name (as ``image_size=`` reads a dict's keys).

        Raises:
            InvalidArgumentError: ``name`` is not a camera of the dataset.
        """
        name = self.spec.names.stream_of(name)
        cams = self.spec.cameras
        if name not in cams:
            raise InvalidArgumentError(
                f"{name!r} is not a camera of this dataset; its cameras: {', '.join(cams) or 'none'}"
            )
        return self.spec.frame_shape(name)

    def cache_footprint(self) -> CacheFootprint | None:
        """What an epoch asks of a bounded cache (``None`` without ``cache_limit``): the bytes of
        the blobs of the streams read, over the dataset's episodes. ``EpisodeSampler``'s
        ``window="auto"`` sizes its shuffle window from it."""
        limit = self.slice.cache_limit
        if limit is None or self._read_bytes is None:
            return None
        return CacheFootprint(int(self._read_bytes), len(self._index.segments), int(limit))

    @property
    def shard_auto(self) -> bool:
        """Whether :attr:`shard` was found from ``torch.distributed`` (``shard="auto"``)."""
        return self.spec.shard_auto

    @property
    def accepts_window(self) -> bool:
        """``True``: :class:`~rayform.torch.EpisodeSampler` may read it a window of episodes at
        a time."""
        return True

    def follow_order(self, shuffle: bool, window: int | None) -> None:
        """Told by :class:`~rayform.torch.EpisodeSampler`: read-ahead fetches in its order."""
        self._readahead.follow(shuffle, window)
        if self._shard_check is not None:  # a later plain-index batch means a swapped sampler
            self._shard_check.follow()

    def order_streams(
        self, world: int, epoch: int, shuffle: bool, window: int | None = None
    ) -> list[IndexStream]:
        """The sampler's hook: the epoch's index streams, one per rank of a first ``world``."""
        return episode_streams(
            self._index.offsets, world, self.ddp_even, self.seed, epoch, shuffle, window
        )

    def order_fingerprint(self) -> dict[str, Any]:
        """What a saved sampler position is only valid for (sizes and the DDP mode)."""
        return {
            "samples": len(self._index),
            "episodes": len(self._index.segments),
            "ddp_even": self.ddp_even,
        }

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch: same seed and epoch give the same order and samples."""
        self._epoch.set(check_non_negative_int("epoch", epoch))

    @property
    def segments(self) -> Segments:
        """The dataset's episodes (all ranks' together), in order."""
        return self._index.segments

    @property
    def segment_lengths(self) -> dict[str, int]:
        """Grid samples per episode ID."""
        segs = self._index.segments
        ids = segs.ids().to_pylist()
        return {seg_id: int(n) for seg_id, n in zip(ids, self._index.samples, strict=True)}

    # -- samples ---------------------------------------------------------------------------
    def __getitem__(self, key: int | tuple[int, ...]) -> dict[str, Any]:
        """One sample (see the class docstring); ``key`` is an index, ``(index, epoch)``, or
        ``(index, epoch, repeat)``: a :class:`~rayform.torch.MixtureDataset` that draws a
        sample more than once in an epoch numbers the repeats, and each repeat ``> 0`` gets its
        own transform seed."""
        return read_together([(self, [key])])[0][0]

    def __getitems__(self, keys: Sequence[int | tuple[int, ...]]) -> list[dict[str, Any]]:
        """Samples for many keys; frames of each episode are decoded in one batched call."""
        return read_together([(self, keys)], batched=True)[0]

    def _locate(self, keys: Sequence[Any]) -> tuple[np.ndarray, list[tuple[int, int]], Located]:
        """Flat indices, transform tags and ``(episode, step)`` of ``keys``; read-ahead and the
        shard check see the batch."""
        flat, tags = resolve_keys(keys, len(self), self._epoch.get())
        self._readahead.saw(keys)
        if self._shard_check is not None and not any(isinstance(k, tuple) for k in keys):
            info = get_worker_info()
            self._shard_check.saw(flat, self._epoch.get(), info.id if info is not None else -1)
        return flat, tags, self._index.locate(flat)

    def _finish(
        self, samples: list[dict[str, Any]], flat: np.ndarray, tags: list[tuple[int, int]]
    ) -> list[dict[str, Any]]:
        """Samples as read, with their sample keys, normalised and transformed."""
        if self.spec.names.mapped:
            samples = [self.spec.names.rename(s) for s in samples]
        if self.spec.normalize is not None:
            norm = self._normalizer or self._make_normalizer()
            samples = [norm.apply(s) for s in samples]
        if self.spec.tokenizer is not None:
            tokenize(samples, self.spec.state_text_keys, self.spec.tokenizer)
        if self.spec.transform is not None:
            samples = [
                self.spec.transformed(s, i, *t)
                for s, i, t in zip(samples, flat.tolist(), tags, strict=True)
            ]
        return samples

    # -- lineage ---------------------------------------------------------------------------
    @property
    def uri(self) -> str:
        """The dataset as trained, as a canonical URI: ``rayform://HOST/slc_...@MANIFEST?v=1&...``.

        Pins the manifest hash and every argument that changes the samples (docs/tracking.md);
        never holds the token. :meth:`from_uri` rebuilds the dataset from it.
        """
        return str(dataset_uri(self.spec))

    @classmethod
    def from_uri(
        cls, uri: str | DatasetURI, client: Client | None = None, **options: Any
    ) -> EpisodeDataset:
        """Rebuild the dataset ``uri`` (from :attr:`uri`) names: same slice version, same samples.

        Args:
            uri: a dataset URI.
            client: the :class:`~rayform.Client` to use; default one for the URI's server,
                configured from the environment (``RAYFORM_TOKEN``, ``RAYFORM_OFFLINE``, ...).
            **options: ``transform``, ``shard``, ``ddp_even``, ``decoder_cache_size``,
                ``decoder_backend``, ``decode_threads`` (not in the URI: they never change
                which samples the dataset holds).

        Raises:
            SliceChangedError: the server's slice no longer resolves to the pinned manifest.
            OfflineError: offline and the pinned manifest is not cached.
            InvalidArgumentError: not a dataset URI, or an option that the URI fixes.
        """
        slice_, kwargs = dataset_arguments(uri, client, **options)
        return cls(slice_, **kwargs)

    # -- metadata --------------------------------------------------------------------------
    def stats(self) -> dict[str, dict[str, Any]]:
        """Per-stream ``mean``/``std``/``min``/``max``/``q01``/``q99`` (lists, one per
        component) and ``count``.

        Over every grid sample of the dataset's episodes (all ranks' together), for table
        streams, after the ``frame`` conversion. Exact, and computed from each episode's
        partial kept in the client's cache directory, so another selection of the same
        episodes reads no table blob again (docs/curation.md).
        """
        return dataset_stats(self.spec, self._index, self._reader.table)

    # -- sample keys and normalisation (docs/mixtures.md) -----------------------------------
    @property
    def obs_keys(self) -> dict[str, str]:
        """Sample key -> observation stream name, in the dataset's order (keys are the stream
        names unless ``obs=`` was a dict)."""
        return dict(zip(self.spec.names.obs_keys, self.spec.names.obs_streams, strict=True))

    @property
    def action_key(self) -> str | None:
        """The action chunk's sample key (``"action"`` unless mapped), or ``None``."""
        return self.spec.names.action_key

    def sample_spec(self) -> dict[str, tuple[str, tuple[int, ...]]]:
        """``{sample key: (dtype, shape)}`` of one sample's tensors, as ``ds[i]`` returns them
        (``meta`` left out): cameras ``uint8 (3, H, W)``, vectors ``float32 (D,)`` (both with a
        leading ``obs_steps`` axis and a ``bool`` ``<key>_is_pad`` when ``obs_steps > 1``),
        the action ``float32 (horizon, D)`` with ``<key>_is_pad``, ``t_ns int64 ()``; a text
        state ``str``, and text events and ``label:KEY`` observations ``events`` (a list per
        step: records, or range names), shape ``()`` (``(n,)`` with history)."""
        return self.spec.sample_spec()

    @property
    def normalize(self) -> str | None:
        """``None``, ``"mean_std"``, ``"quantile"`` or ``"given"`` (statistics passed in)."""
        return self.spec.normalize

    def normalization(self) -> dict[str, dict[str, list[float]]] | None:
        """The statistics the samples' vectors are normalised with, keyed by sample key:
        ``{"mean": [...], "std": [...]}`` or ``{"q01": [...], "q99": [...]}`` per vector, one
        number per component; ``None`` without ``normalize=``. Computed on first use (from
        :meth:`stats`, cached on disk). Pass it as ``normalize=`` to another dataset (a
        validation split) or to :func:`rayform.torch.unnormalize` at deployment."""
        if self.spec.normalize is None:
            return None
        return (self._normalizer or self._make_normalizer()).stats

    def _make_normalizer(self) -> Normalizer:
        self._normalizer = normalizer_of(self.spec, self.stats)
        return self._normalizer

    def unnormalize(self, values: Values, key: str | None = None) -> Values:
        """A normalised vector (``(..., D)`` tensor or array, e.g. a policy's action chunk) back
        in this dataset's units, with the statistics of ``key`` (default: the action key).
        Without ``normalize=`` the values are returned as they are.

        Raises:
            InvalidArgumentError: ``key`` is not a vector of the dataset, or the width differs.
        """
        key = self.action_key if key is None else key
        stats = self.normalization()
        if stats is None:
            return values
        if key not in stats:
            raise InvalidArgumentError(
                f"unnormalize: {key!r} is not a vector of this dataset ({', '.join(stats)})"
            )
        return unnormalize(values, stats[key])

    def stats_arrays(self) -> dict[str, dict[str, Any]]:
        """:meth:`stats` with numpy arrays: ``mean``/``std``/``min``/``max`` as ``(D,)
        float32`` (the samples' dtype), ``count`` an int; ready for ``(x - mean) / std``.

        A component that never changes has ``std == 0`` (the demo has one): divide by
        ``np.where(std > 0, std, 1)``, or see docs/dataset.md for safe normalisation.
        """
        return stats_arrays(self.stats())

    def describe(self) -> dict[str, Any]:
        """A JSON-able summary for experiment trackers (``wandb.config.update(...)``)."""
        return describe_dataset(self.spec, self._index, self._epoch.get(), self.normalization())

    def open_decoders(self) -> list[str]:
        """Backends of the video decoders this process holds open, least recently used first:
        ``"intra"`` (the packet decoder), ``"torchcodec"`` or ``"pyav"``. Each process (each
        DataLoader worker) has its own; empty before this process read a frame."""
        return self._reader.open_backends()

    def stream(self, name: str) -> Stream:
        """The manifest's record of stream ``name`` (kind, rate in Hz, shape, dtype, units...),
        from the first episode that has it: every episode of the dataset has the streams it
        reads, but a text stream (an episode without events lacks it)."""
        return self.spec.stream(name)

    def __repr__(self) -> str:
        return text_repr(self.spec, self._index)

    def _repr_html_(self) -> str:
        return html_repr(self.spec, self._index)


def read_together(
    parts: Sequence[tuple[EpisodeDataset, Sequence[Any]]],
    batched: bool = False,
) -> list[list[dict[str, Any]]]:
    """The samples of several datasets' keys (a mixture's sources' shares of a batch, or one
    dataset's batch) read in one pass: every part's tables are aligned, then the frames every
    part reads at a training resolution are decoded and resized together (frames of the same
    size and target share buffers and resize calls), then each part's samples are built. A
    dataset with ``decode_threads`` reads its part alone, in its own threads. ``batched``: one
    part, a batch collated as it is read (``__getitems__``): without a transform, its frames
    are decoded or resized straight into the batch's tensors (see ``SampleReader.plan``)."""
    with contextlib.ExitStack() as stack:
        pending: list[_Pending] = []
        for ds, keys in parts:
            flat, tags, (seg, step) = ds._locate(keys)
            # One dataset's own batch, untransformed: frames go straight into the batch.
            in_place = batched and ds.spec.transform is None
            if ds.decode_threads > 0:
                done = ds._reader.read(seg, step, in_place)
                pending.append((ds, flat, tags, done.copy, None))
            else:
                plan = ds._reader.plan(seg, step, stack, batched=in_place)
                pending.append((ds, flat, tags, plan.finish, plan))
        run_plans([plan for *_, plan in pending if plan is not None])
        return [ds._finish(finish(), flat, tags) for ds, flat, tags, finish, _ in pending]
