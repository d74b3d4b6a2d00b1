"""Benchmark: a warm, offline open of a fleet-sized slice, this checkout against another.

The 1,000,000-segment demo of ``bench/fleet.py`` is built and pulled into a cache once (kept
under ``--work``, reused by later runs); then each round times, in fresh processes, this
checkout's ``client.slices.get`` and ``EpisodeDataset(...)`` (the ``bench/fleet.py`` warm
step) and the same with ``--baseline``'s SDK first on ``PYTHONPATH``, alternating, so the
load of a shared machine falls on both sides alike. Reports the medians, each side's max RSS
and the ratios ours/baseline.

The first open of each side is a warm-up, not counted (this checkout's first open checks the
pages and marks them checked, as any user's first open after a pull does).

Usage::

    python bench/fleet_open.py --baseline /work/main/sdk [--segments 1000000] [--rounds 5]

Writes ``bench/results/fleet-open-<N>.json``.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from bench._serve import serving
from bench._sides import run_side, sides_parser
from bench.fleet import COLD, SLICE, _demo, _py

HERE = Path(__file__).resolve().parent

WARM = """
import json, resource, sys, time
import rayform
from rayform.torch import EpisodeDataset
def rss_mib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
client = rayform.Client(cache_dir=sys.argv[1], offline=True)
t0 = time.perf_counter()
s = client.slices.get(sys.argv[2])
t_get = time.perf_counter() - t0
rss_get = rss_mib()
t0 = time.perf_counter()
ds = EpisodeDataset(s, obs=["cam0/rgb", "wrist/rgb", "joints/position"],
                    action="joints/position_delta", fps=15, horizon=16, frame="ros")
t_ds = time.perf_counter() - t0
print(json.dumps({"get_seconds": t_get, "get_max_rss_mib": rss_get, "dataset_seconds": t_ds,
                  "len": len(ds), "max_rss_mib": rss_mib(), "sdk": rayform.__file__}))
"""


def _side(sdk: str | None, cache: Path) -> dict:
    return run_side(WARM, [str(cache), SLICE], sdk, timeout=900)


def main() -> int:
    args = sides_parser(__doc__, 1_000_000, 5, "/tmp/rayform-fleet-open").parse_args()
    root, cache = args.work / f"root-{args.segments}", args.work / f"cache-{args.segments}"
    if not (root / "slices").is_dir():
        _demo(root, SLICE, args.segments)
    if not (cache / "refs").is_dir():
        with serving(root) as (url, token):
            _py(COLD, url, token, str(cache), SLICE)
    sides = {"ours": None, "baseline": str(Path(args.baseline).resolve())}
    runs: dict[str, list[dict]] = {k: [] for k in sides}
    for sdk in sides.values():
        _side(sdk, cache)  # warm-up: page cache, and this checkout's first open marks pages
    for _ in range(args.rounds):
        for k, sdk in sides.items():
            runs[k].append(_side(sdk, cache))
    result: dict = {"segments": args.segments, "rounds": args.rounds, "runs": runs}
    for k, rs in runs.items():
        result[k] = {
            key: statistics.median(r[key] for r in rs)
            for key in ("get_seconds", "dataset_seconds", "get_max_rss_mib", "max_rss_mib")
        } | {"sdk": rs[0]["sdk"]}
    result["ratio"] = {
        key: result["ours"][key] / result["baseline"][key]
        for key in ("get_seconds", "dataset_seconds", "get_max_rss_mib", "max_rss_mib")
    }
    out = HERE / "results" / f"fleet-open-{args.segments}.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(result, indent=2, sort_keys=True))
    print(json.dumps({k: result[k] for k in ("ours", "baseline", "ratio")}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
