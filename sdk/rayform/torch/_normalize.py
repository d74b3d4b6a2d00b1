"""Normalising a dataset's vectors with its own statistics, and undoing it for deployment.

``EpisodeDataset(..., normalize=MODE)`` gives every vector of a sample (table observations and
the action chunk) as ``(x - center) / scale``, per component:

* ``"mean_std"``: ``center = mean``, ``scale = std`` (population std over every grid sample);
* ``"quantile"``: ``center = (q01 + q99) / 2``, ``scale = (q99 - q01) / 2``, so the central
  98 % of the data falls in ``[-1, 1]`` (pi0's normalisation; values outside are not clipped);
* a dict of statistics ``{sample key: {"mean": [...], "std": [...]}}`` or ``{sample key:
  {"q01": [...], "q99": [...]}}`` for every vector key: the given numbers (a validation set
  normalised with its training set's, from ``train.normalization()``).

A component whose scale is 0 (it never changes; the demo's right gripper) is only centred:
dividing would make every value inf or nan, and a constant carries no information to scale.
Statistics are the dataset's own (``stats()``: computed once, cached on disk), keyed by
sample key, so each robot of a mixture is normalised with its own numbers, and
:func:`unnormalize` with the same numbers turns a policy's output back into robot units.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from rayform.errors import InvalidArgumentError

__all__ = [
    "NORMALIZE_MODES",
    "Normalizer",
    "check_normalize",
    "format_normalize",
    "parse_normalize",
    "unnormalize",
]

#: Values of ``normalize=`` besides a dict of given statistics.
NORMALIZE_MODES = ("mean_std", "quantile")
_FIELDS = {"mean_std": ("mean", "std"), "quantile": ("q01", "q99")}

#: What :func:`unnormalize` takes: a ``(..., D)`` tensor, an array, or nested lists of numbers.
Values = torch.Tensor | np.ndarray | Sequence[Any]


def check_normalize(
    value: object,
    vector_keys: Mapping[str, int],
) -> tuple[str | None, dict[str, dict[str, list[float]]] | None]:
    """``(mode, given statistics)`` of a ``normalize=`` argument.

    Args:
        value: ``None``, ``"mean_std"``, ``"quantile"`` or a dict of statistics.
        vector_keys: sample key -> width ``D`` of every vector of the dataset.

    Returns:
        ``(None, None)``, ``(mode, None)``, or ``("given", stats)`` with the statistics as plain
        lists of floats, sorted by key (their canonical form, which the URI holds).

    Raises:
        InvalidArgumentError: another value, or statistics that miss a vector key, name a key
            that is no vector, mix both kinds in one entry or have the wrong width.
    """
    if value is None or (isinstance(value, str) and value in NORMALIZE_MODES):
        return value, None
    if not isinstance(value, Mapping):
        raise InvalidArgumentError(
            f"normalize={value!r}: use None, 'mean_std', 'quantile' or a dict of statistics "
            "{sample key: {'mean': [...], 'std': [...]}} (e.g. train_dataset.normalization())"
        )
    extra = sorted(set(value) - set(vector_keys))
    missing = sorted(set(vector_keys) - set(value))
    if extra or missing:
        raise InvalidArgumentError(
            f"normalize= statistics must name exactly the dataset's vectors ({', '.join(vector_keys) or 'none'}); "
            + (
                f"unknown: {', '.join(map(str, extra))}"
                if extra
                else f"missing: {', '.join(missing)}"
            )
        )
    given: dict[str, dict[str, list[float]]] = {}
    for key in sorted(vector_keys):
        entry = value[key]
        kinds = [
            mode
            for mode, fields in _FIELDS.items()
            if isinstance(entry, Mapping) and all(f in entry for f in fields)
        ]
        if len(kinds) != 1:
            raise InvalidArgumentError(
                f"normalize= statistics of {key!r}: give either 'mean' and 'std' or 'q01' and 'q99' (one pair)"
            )
        given[key] = {}
        for field in _FIELDS[kinds[0]]:
            try:
                arr = np.asarray(entry[field], dtype=np.float64).reshape(-1)
            except (TypeError, ValueError):
                arr = np.full(1, np.nan)  # not numbers: refused below
            if arr.shape != (vector_keys[key],) or not np.all(np.isfinite(arr)):
                raise InvalidArgumentError(
                    f"normalize= statistics {key!r}.{field}: {vector_keys[key]} finite numbers expected, "
                    f"got {entry[field]!r:.80}"
                )
            given[key][field] = [float(x) for x in arr]
        # A negative spread would flip the values' sign; 0 means "only centred" (a fixed joint).
        stats = given[key]
        if "std" in stats:
            what, spread = "std", np.asarray(stats["std"])
        else:
            what, spread = "q99 - q01", np.asarray(stats["q99"]) - np.asarray(stats["q01"])
        if np.any(spread < 0):
            raise InvalidArgumentError(
                f"normalize= statistics {key!r}: {what} is negative in component "
                f"{int(np.flatnonzero(spread < 0)[0])}; a spread is >= 0 (0: only centred)"
            )
    return "given", given


def format_normalize(mode: str, given: Mapping[str, Any] | None) -> str:
    """The URI text of ``normalize=``: the mode, or the given statistics as compact JSON."""
    if mode != "given":
        return mode
    return json.dumps(given, sort_keys=True, separators=(",", ":"))


def parse_normalize(text: str) -> str | dict[str, Any]:
    """Inverse of :func:`format_normalize`: a mode or a dict of statistics."""
    if text in NORMALIZE_MODES:
        return text
    try:
        doc = json.loads(text)
    except ValueError:
        doc = None
    if not isinstance(doc, dict):
        raise InvalidArgumentError(
            f"dataset URI: normalize={text[:40]!r}; expected {', '.join(NORMALIZE_MODES)} or JSON statistics"
        )
    return doc


def _center_scale(entry: Mapping[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """``(center (D,), scale (D,))`` float32 of one key's statistics; scale 0 becomes 1 (only
    centred)."""
    if "q01" in entry and "q99" in entry and not ("mean" in entry and "std" in entry):
        lo, hi = np.asarray(entry["q01"], np.float64), np.asarray(entry["q99"], np.float64)
        center, scale = (lo + hi) / 2, (hi - lo) / 2
    elif "mean" in entry and "std" in entry:
        center, scale = np.asarray(entry["mean"], np.float64), np.asarray(entry["std"], np.float64)
    else:
        raise InvalidArgumentError("statistics: give either 'mean' and 'std' or 'q01' and 'q99'")
    scale = np.where(scale > 0, scale, 1.0)
    return center.astype(np.float32), scale.astype(np.float32)


@dataclass(frozen=True)
class Normalizer:
    """What normalising one dataset's samples needs: per vector key, ``center`` and ``scale``
    (``(D,) float32``, scale never 0) and the statistics they came from.

    Attributes:
        stats: sample key -> ``{"mean", "std"}`` or ``{"q01", "q99"}`` (lists of floats).
    """

    stats: dict[str, dict[str, list[float]]]
    #: key -> ``(center, scale)`` as arrays, derived from ``stats`` once.
    _arrays: dict[str, tuple[np.ndarray, np.ndarray]] = dataclasses.field(
        init=False, repr=False, compare=False, default_factory=dict
    )

    @classmethod
    def from_stats(cls, mode: str, stats: Mapping[str, Mapping[str, Any]]) -> Normalizer:
        """Keep the fields of ``mode`` (``"mean_std"``, ``"quantile"``, ``"given"``) of each key."""
        out: dict[str, dict[str, list[float]]] = {}
        for key, entry in stats.items():
            fields = (
                _FIELDS[mode]
                if mode in _FIELDS
                else tuple(f for f in ("mean", "std", "q01", "q99") if f in entry)
            )
            out[key] = {f: [float(x) for x in entry[f]] for f in fields}
        return cls(out)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_arrays", {k: _center_scale(v) for k, v in self.stats.items()})

    def arrays(self, key: str) -> tuple[torch.Tensor, torch.Tensor]:
        """``(center (D,), scale (D,))`` float32 tensors of ``key``."""
        center, scale = self._arrays[key]
        return torch.from_numpy(center), torch.from_numpy(scale)

    def apply(self, sample: dict[str, Any]) -> dict[str, Any]:
        """Normalise the sample's vectors in place of their values (new tensors; ``(..., D)``
        broadcasts over a history or chunk axis); returns the sample."""
        for key in self.stats:
            center, scale = self.arrays(key)
            sample[key] = (sample[key] - center) / scale
        return sample


def unnormalize(values: Values, stats: Mapping[str, Sequence[float]]) -> torch.Tensor | np.ndarray:
    """A normalised vector back in robot units: ``values * scale + center``.

    Args:
        values: ``(..., D)`` tensor or array (e.g. a policy's action chunk ``(horizon, D)``),
            normalised as a dataset with ``normalize=`` gives it.
        stats: the key's statistics, ``{"mean": [...], "std": [...]}`` or ``{"q01": [...],
            "q99": [...]}`` with ``D`` numbers each (an entry of ``dataset.normalization()``).

    Returns:
        The same type as ``values``, float32 for a tensor.

    Raises:
        InvalidArgumentError: the last axis is not ``D`` wide.
    """
    center, scale = _center_scale(stats)
    width = values.shape[-1] if hasattr(values, "shape") and len(values.shape) else None
    if width != center.shape[0]:
        raise InvalidArgumentError(
            f"unnormalize: values have {width} components on their last axis; the statistics {center.shape[0]}"
        )
    if isinstance(values, torch.Tensor):
        c = torch.from_numpy(center).to(values.device)
        s = torch.from_numpy(scale).to(values.device)
        return values.to(torch.float32) * s + c
    restored: np.ndarray = np.asarray(values, dtype=np.float32) * scale + center
    return restored
