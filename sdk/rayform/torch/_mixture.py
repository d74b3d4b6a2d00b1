"""``MixtureDataset``: several ``EpisodeDataset`` s drawn from with weights, one epoch at a time.

An epoch is ``num_samples`` draws (default: the sources' samples added up). Source ``k`` gets
exactly ``round(num_samples * w_k / sum(w))`` of them (largest remainders, so they add up), and
the draws are placed by a seeded permutation of the epoch, so every stretch of the epoch holds
the sources in about their proportions. Without replacement (default) the draws of source
``k`` are passes over all its samples (draws ``0 .. n_k - 1`` hold each sample once, the next
``n_k`` each once more, every pass shuffled), so within an epoch every sample of a source is
drawn equally often, give or take one; with ``replacement=True`` each draw is an independent
uniform choice. Everything derives from
``(seed, epoch, position)`` (``_perm.py``), so :class:`~rayform.torch.EpisodeSampler` shards,
resumes and jumps over a mixture as over one dataset.

The mixture's index space is the epoch's draws: key ``(i, epoch)`` is draw ``i`` of that epoch
(draws ``0 .. n_0 - 1`` are source 0's, and so on), and the sampler only orders them. So the
mixture knows which pass of a source a draw belongs to, and a sample drawn twice in one epoch
gets two transform seeds (two different augmentations), its first draw the seed it has alone.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence, Sized
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import torch
from torch.utils.data import Dataset

from rayform._checks import (
    check_int,
    check_non_negative_int,
    check_positive_int,
    check_positive_number,
    is_int,
)
from rayform.errors import InvalidArgumentError
from rayform.torch._layout import Layout, SourcePlan, Spec, check_same_keys
from rayform.torch._lineage import mixture_arguments, mixture_uri
from rayform.torch._normalize import Values
from rayform.torch._sampling import (
    IndexStream,
    PassPermutations,
    Permutation,
    SamplerDataset,
    SharedEpoch,
    derive_key,
    mix64,
)
from rayform.torch.dataset import EpisodeDataset, read_together

if TYPE_CHECKING:
    from rayform.client import Client
    from rayform.uri import MixtureURI

__all__ = ["MixtureDataset"]


class MixtureDataset(Dataset[dict[str, Any]]):
    """Samples of several datasets, each source drawn with its weight.

    Iterate it with ``DataLoader(mixture, sampler=EpisodeSampler(mixture), ...)``: the
    sampler draws the epoch; a plain or ``DistributedSampler`` would ignore the weights and
    is refused. Each sample's ``meta`` gains ``source`` (the position of its dataset in
    ``sources``) and ``source_name``; its ``slice`` already names the slice.

    Args:
        sources: ``[(dataset, weight), ...]`` or ``[(dataset, weight, name), ...]``:
            :class:`~rayform.torch.EpisodeDataset` s, weights > 0 (normalised to sum to 1),
            names unique (letters, digits, ``_ . -``; default: the slice ID, with ``-K`` for
            the K-th source where one slice is used twice). Without ``layout`` the sources
            have the same sample keys and shapes.
        num_samples: draws per epoch (default: the sources' sample counts added up).
        replacement: draw each sample independently (``True``) or draw every sample of a
            source equally often within an epoch, give or take one (``False``, default).
        seed: seed of the mixture's order.
        layout: ``None`` (the sources' samples as they are), ``"union"`` (every key any source
            has, vectors at their largest width) or ``{key: shape}``: every sample then has the
            layout's keys, vectors zero-padded with ``<key>_dim_is_pad``, missing cameras zero
            with ``<key>_is_missing`` (docs/mixtures.md).

    Raises:
        InvalidArgumentError: a weight, count or source is not allowed, or the sources differ
            in a sample key or shape (the message names it).
    """

    sources: tuple[EpisodeDataset, ...]
    weights: tuple[float, ...]
    quotas: np.ndarray
    num_samples: int
    replacement: bool
    seed: int
    _epoch: SharedEpoch

    def __init__(
        self,
        sources: Sequence[tuple[Any, float] | tuple[Any, float, str]],
        *,
        num_samples: int | None = None,
        replacement: bool = False,
        seed: int = 0,
        layout: str | Mapping[str, Any] | None = None,
    ) -> None:
        if isinstance(sources, (str, bytes)) or not isinstance(sources, Sequence) or not sources:
            raise InvalidArgumentError(
                f"sources={sources!r}: pass a non-empty list of (EpisodeDataset, weight) pairs"
            )
        datasets: list[Any] = []
        weights: list[float] = []
        names: list[str | None] = []
        for item in sources:
            if not (
                isinstance(item, tuple)
                and len(item) in (2, 3)
                and isinstance(item[0], SamplerDataset)
            ):
                raise InvalidArgumentError(
                    f"sources entry {item!r}: use (EpisodeDataset, weight) or (EpisodeDataset, weight, name)"
                )
            names.append(_check_name(item[2]) if len(item) == 3 else None)
            w = check_positive_number("weight", item[1], "0.7")
            if len(cast(Sized, item[0])) == 0:
                raise InvalidArgumentError(f"source {len(datasets)} ({item[0]!r}) has no samples")
            datasets.append(item[0])
            weights.append(float(w))
        self.explicit_names: tuple[str, ...] | None = (
            None  # the names as given (the URI's), or None
        )
        self.source_names = _source_names(datasets, names)
        if any(n is not None for n in names):
            self.explicit_names = self.source_names
        self.layout: Layout | None = None
        self._plans: list[SourcePlan] | None = None
        if layout is None:
            check_same_keys(datasets)
        else:
            specs: list[Spec] = [ds.sample_spec() for ds in datasets]
            self.layout = Layout(layout, specs, [ds.action_key for ds in datasets])
            self._plans = [self.layout.plan(spec) for spec in specs]
        shards = {ds.shard for ds in datasets}
        if len(shards) != 1:
            raise InvalidArgumentError(
                f"the sources are sharded differently ({sorted(shards)}): build them with the same shard="
            )
        self.sources = tuple(datasets)
        self.given_weights = tuple(weights)  # as passed: the URI rebuilds exactly these
        total = sum(weights)
        self.weights = tuple(w / total for w in weights)
        self._sizes = np.array([len(ds) for ds in datasets], dtype=np.int64)
        if num_samples is None:
            num_samples = int(self._sizes.sum())
        self.num_samples = check_positive_int("num_samples", num_samples)
        self.replacement = bool(replacement)
        self.seed = check_int("seed", seed)
        self.quotas = _quotas(self.num_samples, self.weights)
        # Draws 0 .. num_samples - 1 of an epoch: source k's are bounds[k] .. bounds[k+1] - 1.
        self._bounds: np.ndarray = np.concatenate([[0], np.cumsum(self.quotas)]).astype(np.int64)
        self._shard_auto: bool = any(ds.shard_auto for ds in datasets)
        self._epoch = SharedEpoch(0)

    # -- size, epochs, sharding ------------------------------------------------------------
    def __len__(self) -> int:
        """Draws per epoch (``num_samples``): key ``(i, epoch)`` is draw ``i`` of that epoch."""
        return self.num_samples

    @property
    def epoch(self) -> int:
        """The epoch set by :meth:`set_epoch` (starts at 0)."""
        return self._epoch.get()

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch: same seed and epoch give the same draws in the same order."""
        self._epoch.set(check_non_negative_int("epoch", epoch))

    @property
    def shard(self) -> tuple[int, int]:
        """``(rank, world_size)`` of the sources."""
        shard: tuple[int, int] = self.sources[0].shard
        return shard

    def locate(
        self, indices: np.ndarray, epoch: int | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """``(source (N,), index in that source (N,))`` of mixture indices ``(N,)`` (draws of
        ``epoch``; default: the current one)."""
        src, local, _ = self._draws(indices, self.epoch if epoch is None else int(epoch))
        return src, local

    def _draws(self, draws: np.ndarray, epoch: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(source, index in the source, repeat)`` of draws ``(N,)``; ``repeat`` tells the
        draws of one sample in one epoch apart (its pass; with replacement the draw itself),
        so that each gets its own transform seed."""
        u = np.asarray(draws, dtype=np.int64)
        src = np.searchsorted(self._bounds, u, side="right") - 1
        j = u - self._bounds[src]
        local = np.empty(len(u), dtype=np.int64)
        repeat = np.empty(len(u), dtype=np.int64)
        for k in np.unique(src).tolist():
            mask = src == k
            n, jk = int(self._sizes[k]), j[mask]
            if self.replacement:
                key = np.uint64(derive_key("draw", self.seed, epoch, k))
                local[mask] = (mix64(jk.astype(np.uint64) ^ key) % np.uint64(n)).astype(np.int64)
                repeat[mask] = jk
            else:  # pass j // n of source k is its own shuffled order of all its samples
                local[mask] = self._passes(k, epoch)(jk)
                repeat[mask] = jk // n
        return src, local, repeat

    def _passes(self, k: int, epoch: int) -> PassPermutations:
        """Source ``k``'s passes in ``epoch``, kept for the last few (source, epoch) pairs
        asked: batches come epoch by epoch, and each builds its small tables once."""
        cache: dict[tuple[int, int], PassPermutations] = self.__dict__.setdefault("_pass_cache", {})
        passes = cache.get((k, epoch))
        if passes is None:
            if len(cache) >= 2 * len(self.sources):
                del cache[next(iter(cache))]
            key = derive_key("source", self.seed, epoch, k)
            passes = cache[(k, epoch)] = PassPermutations(int(self._sizes[k]), key)
        return passes

    def __getstate__(self) -> dict[str, Any]:
        # The pass tables are a cache (up to 8 MB a source): a worker builds its own.
        return {k: v for k, v in self.__dict__.items() if k != "_pass_cache"}

    @property
    def shard_auto(self) -> bool:
        """Whether a source found its shard from ``torch.distributed`` (``shard="auto"``)."""
        return self._shard_auto

    @property
    def accepts_window(self) -> bool:
        """``False``: a mixture draws across its sources, not episode by episode."""
        return False

    def cache_footprint(self) -> None:
        """``None``: the automatic shuffle window does not apply to a mixture."""
        return None

    def follow_order(self, shuffle: bool, window: int | None) -> None:
        """Nothing to follow: the sources' read-ahead sees the mixture's keys as they come."""

    def order_streams(
        self, world: int, epoch: int, shuffle: bool, window: int | None = None
    ) -> list[IndexStream]:
        if window is not None:
            raise InvalidArgumentError(
                "EpisodeSampler(window=...) orders the episodes of one EpisodeDataset; a "
                "MixtureDataset draws across its sources: use window=None"
            )
        return [_MixtureStream(self, epoch, shuffle)]

    def order_fingerprint(self) -> dict[str, Any]:
        return {
            "samples": self._sizes.tolist(),
            "weights": list(self.weights),
            "num_samples": self.num_samples,
            "replacement": self.replacement,
        }

    # -- samples ---------------------------------------------------------------------------
    def __getitem__(self, key: tuple[int, int]) -> dict[str, Any]:
        """One sample for a key ``(index, epoch)`` from :class:`~rayform.torch.EpisodeSampler`."""
        return self._read([key])[0]

    def __getitems__(self, keys: Sequence[tuple[int, int]]) -> list[dict[str, Any]]:
        """Samples for many keys, every source's share read in one pass
        (:func:`read_draws`)."""
        return self._read(keys)

    def _read(self, keys: Sequence[tuple[int, int]]) -> list[dict[str, Any]]:
        flat = np.empty(len(keys), dtype=np.int64)
        epochs = np.empty(len(keys), dtype=np.int64)
        for j, key in enumerate(keys):
            if not isinstance(key, tuple):
                raise InvalidArgumentError(
                    f"MixtureDataset got the plain index {key!r}: its draws come from "
                    "rayform.torch.EpisodeSampler(mixture), which applies the weights (a plain or "
                    "DistributedSampler would not); use DataLoader(mixture, sampler=EpisodeSampler(mixture))"
                )
            flat[j], epochs[j] = int(key[0]), int(key[1])
            if not 0 <= flat[j] < len(self):
                raise IndexError(f"draw {key!r} out of range for a mixture of {len(self)} draws")
        src, local, repeat = (np.empty(len(keys), dtype=np.int64) for _ in range(3))
        for e in np.unique(epochs).tolist():
            at = epochs == e
            src[at], local[at], repeat[at] = self._draws(flat[at], e)
        draws = list(zip(local.tolist(), epochs.tolist(), repeat.tolist(), strict=True))
        apply = None if self._plans is None else self._apply_plan
        return read_draws(self.sources, self.source_names, src, draws, apply)

    def _apply_plan(self, k: int, sample: dict[str, Any]) -> dict[str, Any]:
        assert self._plans is not None
        try:
            return self._plans[k].apply(sample)
        except InvalidArgumentError as exc:
            raise InvalidArgumentError(f"source {self.source_names[k]!r}: {exc}") from None

    # -- metadata --------------------------------------------------------------------------
    @property
    def uri(self) -> str:
        """The mixture as trained, one canonical string (``rayform:///mix?v=2&mix=W:URI&...``;
        ``v=3`` with a layout or source names):
        every source's dataset URI with its weight as given, ``num_samples``, ``replacement``
        and ``seed``; :meth:`from_uri` rebuilds it. See ``docs/tracking.md``."""
        nested = [k for k, ds in enumerate(self.sources) if not isinstance(ds, EpisodeDataset)]
        if nested:
            raise InvalidArgumentError(
                f"source {nested[0]} of the mixture is not an EpisodeDataset, so the mixture has no URI: "
                "build one mixture of EpisodeDatasets with the weights multiplied out"
            )
        return str(
            mixture_uri(
                [(w, ds.spec) for w, ds in zip(self.given_weights, self.sources, strict=True)],
                num_samples=self.num_samples,
                replacement=self.replacement,
                seed=self.seed,
                layout=None if self.layout is None else self.layout.arg,
                names=self.explicit_names,
            )
        )

    @classmethod
    def from_uri(
        cls, uri: str | MixtureURI, client: Client | None = None, **options: Any
    ) -> MixtureDataset:
        """Rebuild the mixture ``uri`` names: each source as ``EpisodeDataset.from_uri`` would
        (``client`` and ``options`` go to every source), the same weights and draws.

        Raises:
            InvalidArgumentError: not a mixture URI, or an option that is fixed by it.
            SliceChangedError: a source's slice no longer resolves to its pinned manifest.
            OfflineError: offline and a pinned manifest is not cached.
        """
        sources, kwargs = mixture_arguments(uri, client)
        built: list[Any] = []
        for source, own, weight, name in sources:
            ds = EpisodeDataset.from_uri(source, own, **options)
            built.append((ds, weight) if name is None else (ds, weight, name))
        return cls(built, **kwargs)

    def sample_spec(self) -> dict[str, tuple[str, tuple[int, ...]]]:
        """``{key: (dtype, shape)}`` of every sample: the layout's (with its masks), or without
        a layout the first source's (they are all the same)."""
        if self.layout is not None:
            return self.layout.spec()
        spec: dict[str, tuple[str, tuple[int, ...]]] = self.sources[0].sample_spec()
        return spec

    def source_index(self, source: int | str) -> int:
        """The position of a source given by position or name.

        Raises:
            InvalidArgumentError: no such source.
        """
        if isinstance(source, str) and source in self.source_names:
            return self.source_names.index(source)
        if is_int(source) and 0 <= int(source) < len(self.sources):
            return int(source)
        raise InvalidArgumentError(
            f"source={source!r}: use a position 0-{len(self.sources) - 1} or a name "
            f"({', '.join(self.source_names)})"
        )

    def unnormalize(self, values: Values, source: int | str, key: str | None = None) -> Values:
        """A policy's output for ``source`` back in that robot's units: the layout's padded
        components are cut off (``(..., D_layout)`` becomes ``(..., D_source)``) and the
        source's own statistics undo its ``normalize=`` (``key``: default the action key).

        Raises:
            InvalidArgumentError: an unknown source or key.
        """
        ds = self.sources[self.source_index(source)]
        key = ds.action_key if key is None else key
        width = {
            k: shape[-1] for k, (dtype, shape) in ds.sample_spec().items() if dtype == "float32"
        }
        if key not in width:
            raise InvalidArgumentError(
                f"unnormalize: source {source!r} has no vector {key!r} ({', '.join(width)})"
            )
        if not isinstance(values, (torch.Tensor, np.ndarray)):  # a list, as unnormalize() takes
            values = np.asarray(values, dtype=np.float32)
        return ds.unnormalize(values[..., : width[key]], key=key)

    def describe(self) -> dict[str, Any]:
        """A JSON-able summary for trackers: every source's ``describe()`` with its weight."""
        return {
            **({"layout": _layout_doc(self.layout.arg)} if self.layout is not None else {}),
            "type": "MixtureDataset",
            "uri": self.uri,
            "seed": self.seed,
            "epoch": self.epoch,
            "num_samples": self.num_samples,
            "replacement": self.replacement,
            "sources": [
                {"weight": w, "draws_per_epoch": int(q), "name": n, **ds.describe()}
                for ds, w, q, n in zip(
                    self.sources, self.weights, self.quotas, self.source_names, strict=True
                )
            ],
        }

    def stats(self) -> dict[str, Any]:
        """``{"sources": [stats per source], "combined": {stream: stats}}``.

        ``combined`` is the distribution the mixture draws from: each source's statistics
        weighted by its weight (``mean``/``std`` of the mixture), ``min``/``max`` over all
        sources and ``count`` the sources' counts added up. Streams are keyed by their name in
        the first source (the action as ``"action"`` when names differ).
        """
        per = [ds.stats() for ds in self.sources]
        combined: dict[str, dict[str, Any]] = {}
        for name in per[0]:
            found = [
                _by_role(ds.action, p, self.sources[0].action, name)
                for ds, p in zip(self.sources, per, strict=True)
            ]
            rows = [r for r in found if r is not None]
            if len(rows) < len(found) or len({len(r["mean"]) for r in rows}) != 1:
                continue  # a stream some source lacks, or of other widths (a layout pads them)
            w = np.array(self.weights)[:, None]
            mean = np.array([r["mean"] for r in rows])
            std = np.array([r["std"] for r in rows])
            mix_mean = (w * mean).sum(0)
            var = (w * (std**2 + mean**2)).sum(0) - mix_mean**2
            combined[name] = {
                "mean": mix_mean.tolist(),
                "std": np.sqrt(np.maximum(var, 0.0)).tolist(),
                "min": np.min([r["min"] for r in rows], axis=0).tolist(),
                "max": np.max([r["max"] for r in rows], axis=0).tolist(),
                "count": int(sum(r["count"] for r in rows)),
            }
        return {"sources": per, "combined": combined}

    def __repr__(self) -> str:
        parts = ", ".join(
            f"{ds.slice.id}:{w:.3g}" for ds, w in zip(self.sources, self.weights, strict=True)
        )
        return f"<MixtureDataset [{parts}] num_samples={self.num_samples} replacement={self.replacement}>"


class _MixtureStream:
    """The epoch's order of draws: slot ``j`` reads draw ``order(j)`` (shuffled or in order)."""

    def __init__(self, mix: MixtureDataset, epoch: int, shuffle: bool) -> None:
        self.length = mix.num_samples
        self._order = Permutation(self.length, derive_key("mixture", mix.seed, epoch), shuffle)

    def keys(self, slots: np.ndarray) -> np.ndarray:
        return self._order(slots)


def _quotas(total: int, weights: Sequence[float]) -> np.ndarray:
    """Draws per source: ``total * w`` rounded by largest remainders (they add up to ``total``)."""
    exact = np.array(weights) * total
    base: np.ndarray = np.floor(exact).astype(np.int64)
    rest = total - int(base.sum())
    order = np.lexsort((np.arange(len(exact)), -(exact - base)))
    base[order[:rest]] += 1
    return base


_NAME_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}")


def _check_name(name: str) -> str:
    if not isinstance(name, str) or not _NAME_RE.fullmatch(name):
        raise InvalidArgumentError(
            f"source name {name!r}: use 1-64 letters, digits and _ . - e.g. 'single_arm'"
        )
    return name


def _source_names(datasets: Sequence[Any], names: Sequence[str | None]) -> tuple[str, ...]:
    """Names as given; a missing one is the slice ID (with ``-K`` where the slice repeats)."""
    slices = [
        ds.slice.id if isinstance(ds, EpisodeDataset) else f"source{k}"
        for k, ds in enumerate(datasets)
    ]
    out = [
        n if n is not None else (s if slices.count(s) == 1 else f"{s}-{k}")
        for k, (n, s) in enumerate(zip(names, slices, strict=True))
    ]
    if len(set(out)) != len(out):
        raise InvalidArgumentError(f"source names {out}: give each source its own name")
    return tuple(out)


def _layout_doc(arg: str | Mapping[str, Sequence[int]]) -> str | dict[str, list[int]]:
    return arg if isinstance(arg, str) else {k: list(v) for k, v in arg.items()}


def _by_role(
    action: str | None, stats: dict[str, dict[str, Any]], first_action: str | None, name: str
) -> dict[str, Any] | None:
    """A source's ``stats`` for the stream that plays ``name``'s role in the first source
    (``action``, ``first_action``: the two sources' action streams)."""
    if name == first_action and action is not None:
        return stats.get(action)
    return stats.get(name)


#: ``apply(k, sample)``: source ``k``'s sample in the mixture's layout.
Apply = Callable[[int, dict[str, Any]], dict[str, Any]]


def read_draws(
    sources: Sequence[Any],
    names: Sequence[str],
    src: np.ndarray,
    keys: list[tuple[int, int, int]],
    apply: Apply | None,
) -> list[dict[str, Any]]:
    """Samples of draws ``keys`` (``(index in the source, epoch, repeat)``) of sources ``src``
    (``(N,)``), in order; ``apply`` puts a sample in the mixture's layout (``None``: none)."""
    shares = [(k, np.flatnonzero(src == k)) for k in np.unique(src).tolist()]
    parts = [(sources[k], [keys[j] for j in where.tolist()]) for k, where in shares]
    if all(isinstance(ds, EpisodeDataset) for ds, _ in parts):
        read = read_together(parts)
    else:  # a nested mixture (or a user's dataset) reads its own share
        read = [ds.__getitems__(share) for ds, share in parts]
    out: list[dict[str, Any]] = [{}] * len(src)
    for (k, where), samples in zip(shares, read, strict=True):
        for j, sample in zip(where.tolist(), samples, strict=True):
            sample["meta"] = {**sample["meta"], "source": int(k), "source_name": names[k]}
            out[j] = sample if apply is None else apply(k, sample)
    return out
