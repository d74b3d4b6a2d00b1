"""Benchmark: ``dataset.stats()`` of a 10,000-episode label-filter selection, this checkout
against another (today's full pass), cold and warm, and whether the numbers agree.

Two slices of ``--segments`` episodes (default 20,000) in one data root, served on loopback,
every episode labelled ``half`` (true for every other one) in one write, so that
``select(where="half")`` keeps half of them:

* **fleet**: the fixture of ``bench/curation.py`` (``rayform-server demo --small --episodes N
  --share-blobs``: segment ``i`` reuses the blobs of the small demo's episode ``i % 4``), read
  as the README reads it (two cameras, ``joints/position``, the action, 15 Hz, ``frame="ros"``);
* **distinct**: every episode its own table blobs (2 s of 14 joints at 50 Hz and their deltas,
  random walks; no camera), built with ``SliceBuilder``: what a real fleet's tables look like
  to the statistics, one partial per episode.

Each measurement runs in a fresh process (``--baseline``'s SDK first on ``PYTHONPATH`` for the
baseline), the table blobs already in the cache, and times ``stats()`` on the selection:

* **cold**: no statistics in the cache (``stats/`` removed);
* **warm**: the statistics of the whole slice were computed before (this checkout keeps its
  episodes' partials; the baseline keeps only its whole-slice result, which this selection
  cannot use), this selection's own result file removed;
* **again**: a second ``stats()`` of the same selection in the same process (both read their
  result file).

The two sides alternate for ``--rounds`` rounds (medians reported), so a loaded machine's noise
falls on both. ``equal`` compares the sides' results: ``count``, ``min``, ``max``, ``q01`` and
``q99`` must be the same numbers, ``mean`` and ``std`` agree to the relative difference shown.

Usage (the baseline: the SDK of the commit before per-episode partials)::

    git archive 53389cf sdk | tar -x -C /tmp/stats-baseline
    python -m bench.stats --baseline /tmp/stats-baseline/sdk [--segments 20000] [--rounds 3]

Writes ``bench/results/stats-<N>.json``.
"""

from __future__ import annotations

import json
import shutil
import statistics
from pathlib import Path
from typing import Any

import numpy as np

from bench._serve import serving
from bench._sides import run_side, sides_parser
from bench.curation import SLICE, fleet_root

HERE = Path(__file__).resolve().parent
DISTINCT = "slc_d15714c7"
WRITE = "bench-write-token-0123456789"
FILTER = "half"
READS: dict[str, dict[str, Any]] = {
    SLICE: {
        "obs": ["cam0/rgb", "wrist/rgb", "joints/position"],
        "action": "joints/position_delta",
        "frame": "ros",
    },
    DISTINCT: {"obs": ["joints/position"], "action": "joints/position_delta", "frame": None},
}

SIDE = """
import json, sys, time
import rayform
from rayform.torch import EpisodeDataset
url, token, cache, slice_id, where, reads = sys.argv[1:7]
reads = json.loads(reads)
slice_ = rayform.Client(url, token, cache_dir=cache).slices.get(slice_id)
view = slice_.select(where=where) if where else slice_
ds = EpisodeDataset(view, fps=15, **reads)
t0 = time.perf_counter()
stats = ds.stats()
first = time.perf_counter() - t0
t0 = time.perf_counter()
EpisodeDataset(view, fps=15, **reads).stats()
again = time.perf_counter() - t0
print(json.dumps({"seconds": first, "again_seconds": again, "episodes": len(view),
                  "samples": len(ds), "stats": stats, "sdk": rayform.__file__}))
"""


def _distinct_root(root: Path, segments: int) -> None:
    """Slice :data:`DISTINCT`: ``segments`` episodes, each with its own two table blobs."""
    from rayform_server import SliceBuilder, TableData
    from rayform_server.store import Store

    if (root / "slices" / f"{DISTINCT}.json").exists():
        return
    rng = np.random.default_rng(0)
    builder = SliceBuilder(Store(root), "bench: distinct table blobs")
    t = 1_700_000_000_000_000_000 + np.arange(100, dtype=np.int64) * 20_000_000  # 2 s, 50 Hz
    for i in range(segments):
        position = np.cumsum(rng.normal(0, 0.01, (100, 14)), axis=0).astype(np.float32)
        delta = np.diff(position, axis=0, prepend=position[:1])
        builder.add_segment(
            f"seg_{i:016x}",
            site="lab-bench",
            streams=[
                TableData("joints/position", t, position, 50.0, units="rad"),
                TableData("joints/position_delta", t, delta, 50.0, units="rad"),
            ],
        )
    builder.commit(DISTINCT)


def _label_halves(url: str, cache: Path, slice_id: str) -> None:
    import rayform

    slice_ = rayform.Client(url, WRITE, cache_dir=cache).slices.get(slice_id)
    if len(slice_.labels):
        return
    ids = [str(i) for i in slice_.segments.ids().to_pylist()]
    slice_.label_all({e: {"half": i % 2 == 0} for i, e in enumerate(ids)})
    slice_.pull(streams=[READS[slice_id]["action"], "joints/position"], jobs=4)


def _side(sdk: str | None, url: str, cache: Path, slice_id: str, where: str) -> dict[str, Any]:
    args = [url, WRITE, str(cache), slice_id, where, json.dumps(READS[slice_id])]
    return run_side(SIDE, args, sdk, timeout=1800)


def _forget(cache: Path, partials: bool) -> None:
    """Remove the cached results (and the partials too, if ``partials``)."""
    if partials:
        shutil.rmtree(cache / "stats", ignore_errors=True)
    for f in (cache / "stats").glob("*.json"):
        f.unlink()


def _agreement(ours: dict[str, Any], base: dict[str, Any]) -> dict[str, Any]:
    exact = ("count", "min", "max", "q01", "q99")
    same = set(ours) == set(base) and all(
        np.array_equal(np.asarray(ours[s][k]), np.asarray(base[s][k])) for s in base for k in exact
    )
    rel = max(
        float(
            np.max(
                np.abs(np.subtract(ours[s][k], base[s][k])) / np.maximum(np.abs(base[s][k]), 1e-12)
            )
        )
        for s in base
        for k in ("mean", "std")
    )
    return {"order_statistics_and_counts_identical": same, "mean_std_max_relative_difference": rel}


def _measure(
    sides: dict[str, str | None], url: str, cache: Path, slice_id: str, rounds: int
) -> dict[str, Any]:
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {k: {"cold": [], "warm": []} for k in sides}
    for _ in range(rounds):
        for name, sdk in sides.items():
            _forget(cache, partials=True)
            runs[name]["cold"].append(_side(sdk, url, cache, slice_id, FILTER))
            _forget(cache, partials=False)
            _side(sdk, url, cache, slice_id, "")  # the whole slice first
            _forget(cache, partials=False)
            runs[name]["warm"].append(_side(sdk, url, cache, slice_id, FILTER))
    out: dict[str, Any] = {"slice": slice_id, "reads": READS[slice_id]}
    for name in sides:
        first = runs[name]["warm"][0]
        out[name] = {
            "episodes": first["episodes"],
            "samples": first["samples"],
            "sdk": first["sdk"],
            "cold_s": statistics.median(r["seconds"] for r in runs[name]["cold"]),
            "warm_s": statistics.median(r["seconds"] for r in runs[name]["warm"]),
            "again_s": statistics.median(r["again_seconds"] for r in runs[name]["warm"]),
        }
    out["ratio_baseline_over_ours"] = {
        k: out["baseline"][k] / out["ours"][k] for k in ("cold_s", "warm_s", "again_s")
    }
    out["equal"] = _agreement(
        runs["ours"]["warm"][0]["stats"], runs["baseline"]["warm"][0]["stats"]
    )
    out["equal_cold"] = _agreement(
        runs["ours"]["cold"][0]["stats"], runs["ours"]["warm"][0]["stats"]
    )
    return out


def main() -> int:
    args = sides_parser(__doc__, 20_000, 3, "/tmp/rayform-stats-bench").parse_args()
    root, cache = args.work / f"root-{args.segments}", args.work / f"cache-{args.segments}"
    fleet_root(root, args.segments)
    _distinct_root(root, args.segments)
    sides = {"ours": None, "baseline": str(Path(args.baseline).resolve())}
    result: dict[str, Any] = {"segments": args.segments, "rounds": args.rounds, "filter": FILTER}
    with serving(root, write_token=WRITE) as (url, _):
        for slice_id in (SLICE, DISTINCT):
            _label_halves(url, cache, slice_id)
        result["fleet"] = _measure(sides, url, cache, SLICE, args.rounds)
        result["distinct"] = _measure(sides, url, cache, DISTINCT, args.rounds)
    out = HERE / "results" / f"stats-{args.segments}.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    print(json.dumps(result, indent=2, sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
