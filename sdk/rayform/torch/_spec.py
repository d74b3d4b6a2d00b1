"""``DatasetSpec``: an ``EpisodeDataset``'s arguments, checked once, as one frozen value.

:func:`check_spec` is the whole validation of ``EpisodeDataset(...)``: every argument, the
streams and segments against the slice, the training resolution and the statistics given to
``normalize=``. What reads a dataset's arguments reads its spec: the reader, the URI
(``_lineage``), ``describe()``, ``from_uri``, and Ray's reader. Nothing here opens a file.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Generic, Protocol, TypeVar, cast

import numpy as np
import torch

from rayform._checks import (
    check_choice,
    check_int,
    check_non_negative_int,
    check_positive_int,
    check_positive_number,
    is_int,
)
from rayform._hashing import hash_bytes
from rayform._resolution import Target, check_image_size
from rayform._seams import BlobSource
from rayform.curation import Labels
from rayform.errors import InvalidArgumentError, NotFoundError
from rayform.manifest import Segments, Stream
from rayform.torch._align import ACTION_MODES
from rayform.torch._conventions import check_frame
from rayform.torch._decoding import BACKENDS
from rayform.torch._index import check_table_streams, select_table
from rayform.torch._layout import Spec, dataset_spec
from rayform.torch._names import Names, resolve_names
from rayform.torch._normalize import check_normalize
from rayform.torch._sampling import DDP_EVEN
from rayform.torch._spans import (
    SpanTable,
    label_key,
    parse_within,
    read_labels,
    span_table,
)

__all__ = [
    "DEFAULT_READAHEAD_BYTES",
    "DatasetSpec",
    "FromSpec",
    "Tokenizer",
    "Transform",
    "check_spec",
]

#: Default bytes read-ahead may have in flight per process.
DEFAULT_READAHEAD_BYTES = 256 << 20

T = TypeVar("T")

#: A per-sample transform: ``callable(sample) -> sample``.
Transform = Callable[[dict[str, Any]], dict[str, Any]]
#: A tokenizer: ``callable(list of N strings) -> {name: tensor (N, ...)}``.
Tokenizer = Callable[[list[str]], Mapping[str, torch.Tensor]]


@dataclasses.dataclass(frozen=True, eq=False)
class DatasetSpec:
    """The checked arguments of one :class:`~rayform.torch.EpisodeDataset` (see its docstring
    for each one's meaning), built by :func:`check_spec`.

    Attributes:
        slice: the slice (any :class:`~rayform._seams.BlobSource`).
        segments: the chosen episodes, in dataset order.
        names: sample keys and the streams they read.
        fps, horizon, frame, obs_steps, action_mode, transform, seed, ddp_even,
        decoder_cache_size, decoder_backend, decode_threads, readahead_bytes, resize: as given
            (checked).
        rank, world: the shard (``shard="auto"`` resolved from ``torch.distributed``).
        shard_auto: whether ``shard`` was ``"auto"``.
        targets: camera stream -> training resolution, or ``None`` for frames as stored.
        normalize: ``None``, ``"mean_std"``, ``"quantile"`` or ``"given"``.
        normalize_given: the given statistics (canonical form), with ``normalize="given"``.
        texts: text observation stream -> its timing (``"state"`` or ``"events"``).
        tokenizer: ``callable(list of str) -> {name: tensor (N, ...)}`` run on the state text
            keys of each batch in the worker, or ``None``.
        spans: label key -> its ranges over ``segments``, for the ``label:KEY`` observations
            and ``within`` (empty when the dataset reads no label).
        labels: the hash of the label set ``spans`` came from, or ``None``.
        within: ``(key, name or None)`` of ``within=``, or ``None``.
    """

    slice: BlobSource
    segments: Segments
    names: Names
    fps: float
    horizon: int
    frame: str | None
    obs_steps: int
    action_mode: str
    transform: Transform | None
    seed: int
    rank: int
    world: int
    shard_auto: bool
    ddp_even: str
    decoder_cache_size: int
    decoder_backend: str | None
    decode_threads: int
    readahead_bytes: int
    targets: Mapping[str, Target] | None
    resize: str
    normalize: str | None = None
    normalize_given: Mapping[str, dict[str, list[float]]] | None = None
    texts: Mapping[str, str] = dataclasses.field(default_factory=dict)
    tokenizer: Tokenizer | None = None
    spans: Mapping[str, SpanTable] = dataclasses.field(default_factory=dict)
    labels: str | None = None
    within: tuple[str, str | None] | None = None

    @property
    def within_text(self) -> str | None:
        """``within=`` in its canonical form (``"KEY"`` or ``"KEY:NAME"``), or ``None``."""
        if self.within is None:
            return None
        key, name = self.within
        return key if name is None else f"{key}:{name}"

    @property
    def state_text_keys(self) -> list[str]:
        """Sample keys of the state text streams (what ``tokenizer`` tokenizes)."""
        return [
            k
            for k, n in zip(self.names.obs_keys, self.obs, strict=True)
            if self.texts.get(n) == "state"
        ]

    @property
    def obs(self) -> list[str]:
        """Observation stream names, in the dataset's order."""
        return list(self.names.obs_streams)

    @property
    def action(self) -> str | None:
        """The action stream name, or ``None``."""
        return self.names.action_stream

    @property
    def streams(self) -> list[str]:
        """Every stream read: the observations (not the labels), then the action."""
        obs = [n for n in self.obs if label_key(n) is None]
        return [*obs, *([self.action] if self.action else [])]

    @property
    def grid_streams(self) -> list[str]:
        """The streams that bound each episode's grid: all but text (a task recorded once at
        the start holds to the end; events are sparse)."""
        return [n for n in self.streams if n not in self.texts]

    def span_table(self, name: str) -> SpanTable | None:
        """The ranges observation ``name`` reads (``"label:KEY"``), or ``None`` for a stream."""
        key = label_key(name)
        return None if key is None else self.spans[key]

    def stream(self, name: str) -> Stream:
        """The manifest's record of stream ``name``, from the first episode that has it (all
        have every stream but text streams, which an episode may lack)."""
        first = self.segments[0]
        if name in first.streams or name not in self.texts:
            return first.streams[name]
        present, _ = self.segments.stream_field(name, "t0_ns")
        return self.segments[int(np.flatnonzero(present)[0])].streams[name]

    def kind(self, name: str) -> str:
        """``"video"``, ``"table"``, ``"text"`` or ``"spans"`` (a ``label:KEY``): the kind of
        observation ``name``."""
        if label_key(name) is not None:
            return "spans"
        return "text" if name in self.texts else self.stream(name).kind

    @property
    def cameras(self) -> list[str]:
        """The observation streams that are cameras (video)."""
        return [n for n in self.obs if self.kind(n) == "video"]

    def frame_shape(self, stream: str) -> tuple[int, int, int]:
        """``(3, H, W)`` of camera ``stream``'s frames in samples, after ``image_size``."""
        if self.targets is not None:
            t = self.targets[stream]
            return 3, t.height, t.width
        h, w, c = self.stream(stream).shape
        return c, h, w

    def transformed(
        self, sample: dict[str, Any], index: int, epoch: int, repeat: int = 0
    ) -> dict[str, Any]:
        """``transform(sample)`` with torch's RNG seeded from ``(seed, epoch, index[, repeat])``
        (a repeat ``> 0`` of a sample in one epoch gets its own seed); the sample itself
        without a transform."""
        if self.transform is None:
            return sample
        tags = f"{self.seed}\0{epoch}\0{index}" + (f"\0{repeat}" if repeat else "")
        digest = hash_bytes(f"rayform-sample\0{tags}".encode())
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(int(digest[:15], 16))
            return self.transform(sample)

    def sample_spec(self) -> Spec:
        """``{sample key: (dtype, shape)}`` of one sample's tensors (``meta`` left out)."""
        obs = [
            (
                key,
                # A label's names are a list per step, as a step's events are.
                "events"
                if self.kind(name) == "spans"
                else {"state": "str", "events": "events"}.get(
                    self.texts.get(name, ""), self.kind(name)
                ),
                ()
                if self.kind(name) in ("text", "spans")
                else tuple(self.stream(name).shape[-1:])
                if self.kind(name) == "table"
                else self.frame_shape(name),
            )
            for key, name in zip(self.names.obs_keys, self.obs, strict=True)
        ]
        action = self.action
        act = (
            None
            if action is None
            else (str(self.names.action_key), int(self.stream(action).shape[-1]))
        )
        return dataset_spec(obs, act, self.obs_steps, self.horizon)


class FromSpec(Generic[T]):
    """A read-only attribute of a class whose ``spec`` is a :class:`DatasetSpec`, read from the
    spec (``EpisodeDataset.fps`` is ``ds.spec.fps``)."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, obj: HasSpec, owner: type | None = None) -> T:
        return cast(T, getattr(obj.spec, self.name))


class HasSpec(Protocol):
    """What :class:`FromSpec` reads: an object with a ``spec``."""

    @property
    def spec(self) -> DatasetSpec:
        """The object's spec."""
        ...


def check_spec(
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
    transform: Transform | None = None,
    seed: int = 0,
    shard: str | tuple[int, int] | None = "auto",
    ddp_even: str = "split",
    decoder_cache_size: int = 64,
    decoder_backend: str | None = None,
    decode_threads: int = 0,
    readahead_bytes: int = DEFAULT_READAHEAD_BYTES,
    image_size: tuple[int, int] | Mapping[str, tuple[int, int]] | None = None,
    resize: str = "pad",
    normalize: str | Mapping[str, Any] | None = None,
    tokenizer: Tokenizer | None = None,
    within: str | None = None,
    labels: Labels | str | None = None,
) -> DatasetSpec:
    """The :class:`DatasetSpec` of ``EpisodeDataset(...)``'s arguments (the same names).

    Raises:
        InvalidArgumentError: a value is not allowed (the message says what is).
        NotFoundError: a stream or segment is not in the slice (the message lists what is).
    """
    if not isinstance(slice_, BlobSource):
        raise InvalidArgumentError(
            f"slice_ must be a rayform.Slice (from client.slices.get(...)), got {type(slice_).__name__}"
        )
    checked: dict[str, Any] = {
        "fps": check_positive_number("fps", fps, "15", unit="Hz"),
        "horizon": check_positive_int("horizon", horizon),
        "obs_steps": check_positive_int("obs_steps", obs_steps),
        "decoder_cache_size": check_positive_int("decoder_cache_size", decoder_cache_size),
        "decode_threads": check_non_negative_int("decode_threads", decode_threads, "no threads"),
        "frame": check_frame(frame),
        "seed": check_int("seed", seed),
        "action_mode": check_choice("action_mode", action_mode, ACTION_MODES),
        "ddp_even": check_choice("ddp_even", ddp_even, DDP_EVEN),
        "decoder_backend": check_choice("decoder_backend", decoder_backend, (*BACKENDS, None)),
        "readahead_bytes": check_int("readahead_bytes", readahead_bytes),
        "transform": transform,
        "resize": resize,
    }
    if transform is not None and not callable(transform):
        raise InvalidArgumentError(f"transform must be callable or None, got {transform!r}")
    if tokenizer is not None and not callable(tokenizer):
        raise InvalidArgumentError(
            f"tokenizer must be callable (a list of strings -> a dict of tensors) or None, got "
            f"{tokenizer!r}"
        )
    every = slice_.segments
    chosen = every if segments is None else select_table(slice_.id, every, segments)
    names = resolve_names(obs, action)
    texts = _check_streams(slice_, chosen, list(names.obs_streams), names.action_stream)
    if isinstance(image_size, Mapping):
        # Keyed by sample key (or stream name): the reader's are streams.
        by_stream = {names.stream_of(k): v for k, v in image_size.items()}
        if len(by_stream) < len(image_size):
            raise InvalidArgumentError(
                f"image_size={dict(image_size)!r} names one camera twice (by its sample key "
                "and by its stream name): give each camera one size, keyed by sample key"
            )
        image_size = by_stream
    cameras = [
        n
        for n in names.obs_streams
        if n not in texts and label_key(n) is None and chosen[0].streams[n].kind == "video"
    ]
    spans, labels_hash, within_parts = _check_spans(
        slice_, chosen, names.obs_streams, within, labels
    )
    rank, world = _resolve_shard(shard)
    spec = DatasetSpec(
        slice=slice_,
        segments=chosen,
        names=names,
        rank=rank,
        world=world,
        shard_auto=shard == "auto",
        targets=check_image_size(image_size, resize, cameras),
        texts=texts,
        tokenizer=tokenizer,
        spans=spans,
        labels=labels_hash,
        within=within_parts,
        **checked,
    )
    if tokenizer is not None and not spec.state_text_keys:
        raise InvalidArgumentError(
            "tokenizer= tokenizes the state text streams in obs (task, language/subtask...), "
            f"and obs has none (its text streams: {sorted(texts) or 'none'}, events are not "
            f"tokenized); add one, e.g. obs=[..., 'task']; the slice's text streams: "
            f"{', '.join(n for n in every.stream_names() if every.stream_values(n, 'kind') == {'text'}) or 'none'}"
        )
    widths = {k: int(s[-1]) for k, (dt, s) in spec.sample_spec().items() if dt == "float32"}
    mode, given = check_normalize(normalize, widths)
    return dataclasses.replace(spec, normalize=mode, normalize_given=given)


def _check_streams(
    slice_: BlobSource, segments: Segments, obs: Sequence[str], action: str | None
) -> dict[str, str]:
    """Check the named streams against the segments; returns the text ones' timings."""
    if isinstance(obs, str) or not all(isinstance(o, str) for o in obs) or not obs:
        raise InvalidArgumentError(
            f"obs={obs!r}: pass a non-empty list of stream names, e.g. ['cam0/rgb']"
        )
    if len(set(obs)) != len(obs):
        raise InvalidArgumentError(f"obs={list(obs)!r} names a stream twice: list each once")
    if action is not None and not isinstance(action, str):
        raise InvalidArgumentError(f"action={action!r}: pass a stream name or None")
    if not segments:
        raise NotFoundError(
            f"slice {slice_.id} has no episodes, so there is nothing to sample; pick a slice "
            "with data (`rayform slices ls`) or ask its owners to rebuild it"
        )
    streams = [o for o in obs if label_key(o) is None]
    texts = check_table_streams(
        slice_.id, segments, [*streams, *([action] if action else [])], action
    )
    if action is not None and action in obs:
        raise InvalidArgumentError(f"{action!r} is both in obs and the action: use it once")
    if len(texts) == len(streams) and action is None:
        raise InvalidArgumentError(
            f"obs={list(obs)!r} are all text streams or labels and there is no action: a "
            "dataset's grid spans the times its camera, table or action streams cover; add one"
        )
    return texts


def _check_spans(
    slice_: BlobSource,
    segments: Segments,
    obs: Sequence[str],
    within: object,
    labels: Labels | str | None,
) -> tuple[dict[str, SpanTable], str | None, tuple[str, str | None] | None]:
    """The spans labels ``label:KEY`` observations and ``within`` read, from one label set:
    ``(key -> ranges over segments, that label set's hash, within's parts)``. Reads nothing
    when the dataset names no label."""
    keys = [k for k in (label_key(n) for n in obs) if k is not None]
    parts = None if within is None else parse_within(within)
    if not keys and parts is None:
        if labels is not None:
            raise InvalidArgumentError(
                "labels= is the label set that label observations ('label:KEY' in obs) and "
                "within= read: name one of those too"
            )
        return {}, None, None
    read = read_labels(slice_, labels)
    tables = {k: span_table(read, k, segments, f"obs 'label:{k}'") for k in keys}
    if parts is not None and parts[0] not in tables:
        tables[parts[0]] = span_table(read, parts[0], segments, f"within={within!r}")
    return tables, read.hash, parts


def _resolve_shard(shard: object) -> tuple[int, int]:
    # `object`: it checks what a caller passed (False reads as None), whatever its type.
    if shard is None or shard is False:
        return 0, 1
    if shard == "auto":
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size()
        return 0, 1
    if (
        isinstance(shard, tuple)
        and len(shard) == 2
        and all(is_int(x) for x in shard)
        and 0 <= shard[0] < shard[1]
    ):
        return int(shard[0]), int(shard[1])
    raise InvalidArgumentError(
        f"shard={shard!r}: use 'auto' (follow torch.distributed), None (no sharding) or "
        "(rank, world_size) with 0 <= rank < world_size"
    )
