"""Per-stream statistics over a dataset's own episodes, cached on disk.

Statistics are taken over what the model sees: every grid sample of every selected episode
(observations at the latest record at or before each grid time; the action at each grid time
with the dataset's ``action_mode``), after the ``frame=`` conversion. They are computed for
table streams (vectors); camera streams are left out (normalise images with fixed constants,
decoding every frame of a slice for a mean is rarely worth it).

Result: ``{stream: {"mean": [...], "std": [...], "min": [...], "max": [...], "q01": [...],
"q99": [...], "count": n}}`` with one value per vector component (``std`` is the population
standard deviation; ``q01``/``q99`` the 1st and 99th percentiles, linear interpolation, which
``normalize="quantile"`` uses).

Each episode's samples and moments are its *partial* (:mod:`rayform.torch._statparts`), kept
in the cache under a key of what they depend on, so any later selection of the same episodes
reads them instead of the table blobs. ``mean``/``std`` merge the moments; ``min``, ``max``,
``q01`` and ``q99`` are order statistics off one sort per component, the numbers a full pass
gives. The whole result is also kept as ``CACHE_DIR/stats/<key>.json``, keyed by the BLAKE3 of
the episodes' partial keys in order and the streams' roles, written to a temporary file and
renamed, so concurrent writers are harmless and a stale file can never be read for other
inputs.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from rayform._hashing import hash_bytes
from rayform._seams import TableLoader
from rayform.cache import Cache
from rayform.client import Client
from rayform.errors import RayformError
from rayform.manifest import canonical_json
from rayform.torch._align import align_values, latest_at_or_before
from rayform.torch._conventions import convert
from rayform.torch._index import GridIndex
from rayform.torch._normalize import Normalizer
from rayform.torch._spec import DatasetSpec
from rayform.torch._statparts import Found, Partial, episode_keys, read_partials, write_partials

__all__ = [
    "compute_stats",
    "dataset_stats",
    "normalizer_of",
    "sorted_quantile",
    "stats_arrays",
    "stats_key",
]

_STATS_VERSION = 4  # 2: q01/q99 added; 3: keyed by the grid too; 4: keyed by episode partials


def stats_key(context: str, keys: np.ndarray, streams: dict[str, str]) -> str:
    """BLAKE3 hex of everything a selection's statistics depend on: its episodes' partial
    keys in dataset order and their context (:func:`~rayform.torch._statparts.episode_keys`:
    the grid, blob hashes, fps, frame, action mode) and the streams' roles.

    Args:
        context: the keys' shared part.
        keys: ``(S,)`` partial keys, one per episode.
        streams: stream name -> role (``"obs"`` or ``"action"``), table streams only.
    """
    head = canonical_json({"v": _STATS_VERSION, "context": context, "streams": streams})
    return hash_bytes(head + np.ascontiguousarray(keys).tobytes())


def _episode_samples(
    index: GridIndex,
    s: int,
    names: list[str],
    streams: dict[str, str],
    frame: str | None,
    action_mode: str,
    load_table: TableLoader,
) -> list[np.ndarray]:
    """Episode ``s``'s samples of each stream (sorted names), read from its table blobs."""
    seg = index.segments[s]
    t = index.times_ns(s, np.arange(int(index.count[s])))
    out = []
    for name in names:
        stream = seg.streams[name]
        t_rec, rec = load_table(stream)
        if streams[name] == "action":
            values = align_values(t_rec, rec, t, action_mode)
        else:
            values = rec[latest_at_or_before(t_rec, t)]
        out.append(np.asarray(convert(values, stream, frame)))
    return out


def sorted_quantile(ordered: np.ndarray, q: float) -> np.ndarray:
    """``np.quantile(x, q, axis=1)`` (its default ``linear`` method, in float64) of rows
    already sorted, ``(D, N) -> (D,)``, without numpy's partition: the same two order
    statistics and the same interpolation (numpy's ``_lerp``), so the same numbers; NaN
    where a row has one."""
    n = ordered.shape[1]
    virtual = (n - 1) * q
    below = min(int(np.floor(virtual)), n - 1)
    above = min(below + 1, n - 1)
    gamma = virtual - below
    a = ordered[:, below].astype(np.float64)  # float32 rows: their exact float64 values
    b = ordered[:, above].astype(np.float64)
    diff = b - a
    out = b - diff * (1 - gamma) if gamma >= 0.5 else a + diff * gamma
    return np.where(np.isnan(ordered[:, -1]), np.nan, out)


def _summary(blocks: list[np.ndarray], moments: np.ndarray, n: np.ndarray) -> dict[str, Any]:
    """The statistics of one stream, from its samples in ``(D, n_i)`` blocks (any order) and
    its episodes' moments ``(S, 2, D)`` (mean, M2) with their sample counts ``n (S,)``.

    ``mean`` and ``std`` merge the episodes' moments (Chan's update, summed at once: exact up
    to float64 rounding, no pass over the samples). ``min``, ``max``, ``q01`` and ``q99`` are
    order statistics: each component's samples are sorted (a vectorised sort of contiguous
    rows, cheaper than numpy's ``quantile`` along axis 0, which partitions for each call) and
    read off, the numbers a full pass gives, bit for bit.
    """
    w = n.astype(np.float64)[:, None]  # (S, 1)
    total = float(w.sum())
    mean = (w * moments[:, 0]).sum(axis=0) / total
    m2 = moments[:, 1].sum(axis=0) + (w * (moments[:, 0] - mean) ** 2).sum(axis=0)
    # float32 samples sort as float32 (exact, and far faster than float64); other dtypes
    # in float64, as a full pass counts them.
    dtype = np.float32 if all(b.dtype == np.float32 for b in blocks) else np.float64
    ordered = np.concatenate(blocks, axis=1, dtype=dtype)  # (D, N)
    ordered.sort(axis=1)  # NaNs sort last
    nan = np.isnan(ordered[:, -1])
    low, high = ordered[:, 0].astype(np.float64), ordered[:, -1].astype(np.float64)
    # A component that never moves has exactly its value and no spread (the merged sums
    # could leave a rounding residue, and a tiny std would blow up a normalisation).
    still = low == high
    return {
        "mean": np.where(nan, np.nan, np.where(still, low, mean)).tolist(),
        "std": np.where(nan, np.nan, np.where(still, 0.0, np.sqrt(m2 / total))).tolist(),
        "min": np.where(nan, np.nan, low).tolist(),
        "max": high.tolist(),
        "q01": sorted_quantile(ordered, 0.01).tolist(),
        "q99": sorted_quantile(ordered, 0.99).tolist(),
        "count": int(ordered.shape[1]),
    }


def compute_stats(
    index: GridIndex,
    streams: dict[str, str],
    frame: str | None,
    action_mode: str,
    load_table: TableLoader,
    cache_dir: Path | None,
    shared: bool | None = None,
) -> dict[str, dict[str, Any]]:
    """Statistics of the named table streams (cached under ``cache_dir/stats`` if given).

    The result of this selection is read from ``stats/<key>.json`` if there; otherwise each
    episode's samples come from its partial in the cache's packs, or, for the episodes
    without one, from its table blobs (their partials are then written for later
    selections).

    Args:
        index: the dataset's grid.
        streams: stream name -> ``"obs"`` or ``"action"`` (table streams only).
        frame: target coordinate convention.
        action_mode: how the action is aligned.
        load_table: ``load_table(stream) -> (t_ns (N,), values (N, D))``.
        cache_dir: the Rayform cache directory, or ``None`` to skip the disk cache.
        shared: the cache's mode as its client chose it (``Client(shared=...)``): a team
            cache's files are group-writable; ``None`` infers it from the directory.
    """
    names = sorted(streams)
    context, keys = episode_keys(index, streams, frame, action_mode)
    stats_file = f"stats/{stats_key(context, keys, streams)}.json"
    if cache_dir is not None:
        try:
            return json.loads((Path(cache_dir) / stats_file).read_text())
        except (OSError, ValueError):
            pass
    has_samples = index.count > 0
    found = (
        Found(np.zeros(0, dtype=np.int64), [], [])
        if cache_dir is None
        else read_partials(cache_dir, context, keys, has_samples, index.count)
    )
    missing = np.flatnonzero(has_samples)
    missing = missing[~np.isin(missing, found.positions)]
    made: dict[bytes, Partial] = {}
    parts = []
    for s in missing.tolist():
        parts.append(
            Partial.of(_episode_samples(index, s, names, streams, frame, action_mode, load_table))
        )
        made[keys[s].tobytes()] = parts[-1]
    if cache_dir is not None and made:
        write_partials(cache_dir, shared, context, made)
    positions = np.concatenate([found.positions, missing])
    order = np.argsort(positions, kind="stable")  # moments merge in dataset order
    out = {}
    for j, name in enumerate(names):
        if not len(positions):
            break
        blocks = (found.samples[j] if found.samples else []) + [p.samples[j].T for p in parts]
        pieces = [found.moments[j]] if found.moments else []
        if parts:
            pieces.append(np.stack([p.moments[j] for p in parts]).astype(np.float64))
        moments = np.concatenate(pieces)
        out[name] = _summary(blocks, moments[order], index.count[positions[order]])
    if cache_dir is not None:
        with contextlib.suppress(RayformError):  # a read-only cache costs a recomputation
            Cache(cache_dir, shared=shared).put_file(
                stats_file, json.dumps(out, sort_keys=True).encode()
            )
    return out


def stats_arrays(stats: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Statistics with their per-component lists as ``(D,) float32`` arrays (``count`` kept)."""
    arrays = ("mean", "std", "min", "max", "q01", "q99")
    return {
        name: {k: np.asarray(v, dtype=np.float32) if k in arrays else v for k, v in entry.items()}
        for name, entry in stats.items()
    }


def dataset_stats(
    spec: DatasetSpec, index: GridIndex, load_table: TableLoader
) -> dict[str, dict[str, Any]]:
    """:func:`compute_stats` of a dataset's table streams (``EpisodeDataset.stats()``), cached
    under its slice's cache directory and written in the mode its client chose."""
    roles = {name: "obs" for name in spec.obs if spec.kind(name) == "table"}
    if spec.action is not None:
        roles[spec.action] = "action"
    client = getattr(spec.slice, "client", None)
    return compute_stats(
        index,
        roles,
        spec.frame,
        spec.action_mode,
        load_table,
        spec.slice.cache_dir,
        # Written like the client's other files: group-writable in a team cache.
        shared=client.cache.shared if isinstance(client, Client) else None,
    )


def normalizer_of(spec: DatasetSpec, stats: Callable[[], dict[str, dict[str, Any]]]) -> Normalizer:
    """The :class:`Normalizer` of a dataset with ``normalize=``: the given statistics, or its
    vectors' ``stats()`` (called only then) in the spec's mode."""
    if spec.normalize == "given":
        return Normalizer.from_stats("given", spec.normalize_given or {})
    by_stream = stats()
    vectors = [k for k, (dtype, _) in spec.sample_spec().items() if dtype == "float32"]
    return Normalizer.from_stats(
        str(spec.normalize), {k: by_stream[spec.names.stream_of(k)] for k in vectors}
    )
