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

The file ``CACHE_DIR/stats/<key>.json`` is keyed by the BLAKE3 of everything the numbers
depend on (each episode's ID, version and stream blob hashes, the stream names, fps, frame,
action mode and this module's format version), written to a temporary file and renamed, so
concurrent writers are harmless and a stale file can never be read for other inputs.
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

__all__ = ["compute_stats", "dataset_stats", "normalizer_of", "stats_arrays", "stats_key"]

_STATS_VERSION = 3  # 2: q01/q99 added (a version 1 file lacks them); 3: keyed by the grid too


def stats_key(
    index: GridIndex, streams: dict[str, str], frame: str | None, action_mode: str
) -> str:
    """BLAKE3 hex of everything the statistics depend on.

    Args:
        index: the dataset's grid (its segments and fps).
        streams: stream name -> role (``"obs"`` or ``"action"``), table streams only.
        frame: the ``frame=`` convention.
        action_mode: the action alignment mode.
    """
    doc = {
        "v": _STATS_VERSION,
        "fps": index.fps,
        "frame": frame,
        "action_mode": action_mode,
        "streams": streams,
        "segments": [
            [seg.id, seg.version, [seg.streams[name].blob.hash for name in sorted(streams)]]
            for seg in index.segments
        ],
        # The samples' times: the grid spans the times every stream the dataset reads covers
        # (its cameras too), so one table's statistics differ with the other streams read.
        "grid": hash_bytes(
            np.ascontiguousarray(index.start_ns, dtype=np.int64).tobytes()
            + np.ascontiguousarray(index.count, dtype=np.int64).tobytes()
        ),
    }
    return hash_bytes(canonical_json(doc))


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
    stats_file = f"stats/{stats_key(index, streams, frame, action_mode)}.json"
    if cache_dir is not None:
        try:
            return json.loads((Path(cache_dir) / stats_file).read_text())
        except (OSError, ValueError):
            pass
    acc: dict[str, list[np.ndarray]] = {name: [] for name in streams}
    for s, seg in enumerate(index.segments):
        n = int(index.count[s])
        if n == 0:
            continue
        t = index.times_ns(s, np.arange(n))
        for name, role in streams.items():
            stream = seg.streams[name]
            t_rec, rec = load_table(stream)
            if role == "action":
                values = align_values(t_rec, rec, t, action_mode)
            else:
                values = rec[latest_at_or_before(t_rec, t)]
            acc[name].append(np.asarray(convert(values, stream, frame), dtype=np.float64))
    out: dict[str, dict[str, Any]] = {}
    for name, parts in acc.items():
        if not parts:
            continue
        v = np.concatenate(parts)
        out[name] = {
            "mean": v.mean(axis=0).tolist(),
            "std": v.std(axis=0).tolist(),
            "min": v.min(axis=0).tolist(),
            "max": v.max(axis=0).tolist(),
            "q01": np.quantile(v, 0.01, axis=0).tolist(),
            "q99": np.quantile(v, 0.99, axis=0).tolist(),
            "count": int(v.shape[0]),
        }
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
