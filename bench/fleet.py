"""Benchmark: a fleet-sized slice (columnar manifest pages) opened, indexed and fed to workers.

Builds ``rayform-server demo --small --episodes N --share-blobs`` (N segments over the small
demo's 4 rendered episodes), serves it on loopback, then measures, each step in a fresh
process so its max RSS is its own:

* **cold**: ``client.slices.get`` into an empty cache (root + pages fetched in parallel,
  every page checked against its hash); seconds and MB beside the size one JSON document of
  the same slice would have (as format version 1 was; computed exactly from the per-segment
  JSON, not built);
* **warm, offline**: ``slices.get`` seconds and the process's max RSS; ``EpisodeDataset(...)``
  construction seconds and ``len()``;
* **loader**: ``DataLoader(num_workers=2, shuffle=True)`` over the N-segment slice and over a
  1,000-segment slice, RSS and PSS of each worker after 200 batches; and the N-segment loader
  with ``sampler=EpisodeSampler(ds)`` instead of ``shuffle=True``.

Usage::

    python bench/fleet.py [--segments 1000000] [--root DIR]

Writes ``bench/results/fleet-<N>.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench._serve import serving

SLICE = "slc_7c1e04aa"
SMALL = "slc_00001000"
HERE = Path(__file__).resolve().parent

_COMMON = """
import json, os, resource, sys, time
t_start = time.perf_counter()
import rayform
def rss_mib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
"""

COLD = (
    _COMMON
    + """
client = rayform.Client(sys.argv[1], sys.argv[2], cache_dir=sys.argv[3])
t0 = time.perf_counter()
s = client.slices.get(sys.argv[4])
dt = time.perf_counter() - t0
s.pull(jobs=8)  # the blobs (the pool's 28), so the warm steps run offline
pages = s.manifest.doc["pages"]
print(json.dumps({"seconds": dt, "pages": len(pages), "page_bytes": sum(p["size"] for p in pages),
                  "root_bytes": len(s.manifest.to_bytes()), "segments": len(s.segments)}))
"""
)

WARM = (
    _COMMON
    + """
from rayform.torch import EpisodeDataset
client = rayform.Client(cache_dir=sys.argv[1], offline=True)
t0 = time.perf_counter()
s = client.slices.get(sys.argv[2])
t_get = time.perf_counter() - t0
rss_get = rss_mib()
t0 = time.perf_counter()
ds = EpisodeDataset(s, obs=["cam0/rgb", "wrist/rgb", "joints/position"], action="joints/position_delta",
                    fps=15, horizon=16, frame="ros")
t_ds = time.perf_counter() - t0
t0 = time.perf_counter()
r = repr(s)
t_repr = time.perf_counter() - t0
print(json.dumps({"get_seconds": t_get, "get_max_rss_mib": rss_get, "dataset_seconds": t_ds,
                  "len": len(ds), "segments": len(s.segments), "repr_seconds": t_repr,
                  "max_rss_mib": rss_mib()}))
"""
)

LOADER = (
    _COMMON
    + """
import torch
from torch.utils.data import DataLoader
from rayform.torch import EpisodeDataset, EpisodeSampler, collate
def mem(pid):
    # Rss: every resident page mapped; Pss: shared pages divided among their sharers; Uss
    # (Private_Clean + Private_Dirty): pages only this process has, i.e. its own copies.
    out = {"uss_mib": 0.0}
    for line in open(f"/proc/{pid}/smaps_rollup"):
        key, _, rest = line.partition(":")
        if key in ("Rss", "Pss"):
            out[key.lower() + "_mib"] = int(rest.split()[0]) / 1024
        if key in ("Private_Clean", "Private_Dirty"):
            out["uss_mib"] += int(rest.split()[0]) / 1024
    return out
client = rayform.Client(cache_dir=sys.argv[1], offline=True)
s = client.slices.get(sys.argv[2])
ds = EpisodeDataset(s, obs=["joints/position"], action="joints/position_delta", fps=15, horizon=16)
if sys.argv[3] == "sampler":
    loader = DataLoader(ds, batch_size=16, num_workers=2, sampler=EpisodeSampler(ds), collate_fn=collate)
else:  # torch's RandomSampler: its permutation is a list of every index, in the main process
    loader = DataLoader(ds, batch_size=16, num_workers=2, shuffle=True, collate_fn=collate,
                        generator=torch.Generator().manual_seed(0))
at_fork = mem(os.getpid())
it = iter(loader)
t0 = time.perf_counter()
for _ in range(200):
    next(it)
dt = time.perf_counter() - t0
workers = [mem(w.pid) for w in it._workers]
print(json.dumps({"segments": len(s.segments), "samples": len(ds), "seconds_200_batches": dt,
                  "workers": workers, "main": mem(os.getpid()), "main_at_fork": at_fork}))
del it
"""
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _py(code: str, *args: str) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        timeout=900,
    )
    if out.returncode != 0:
        raise RuntimeError(out.stderr[-3000:])
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def _demo(root: Path, slice_id: str, episodes: int) -> float:
    t0 = time.perf_counter()
    subprocess.run(
        [
            sys.executable,
            "-m",
            "rayform_server",
            "demo",
            "--root",
            str(root),
            "--small",
            "--slice",
            slice_id,
            "--episodes",
            str(episodes),
            "--share-blobs",
            "--jobs",
            "1",
        ],
        check=True,
        capture_output=True,
    )
    return time.perf_counter() - t0


def _v1_json_bytes(root: Path, slice_id: str) -> int:
    """Exact size of the v1 JSON of a shared-blob demo slice (IDs have one length, so each
    segment's JSON is as long as its pool episode's), computed without building it."""
    from rayform.manifest import FORMAT as MANIFEST_FORMAT
    from rayform.manifest import canonical_json
    from rayform_server.store import Store

    store = Store(root)
    ref = store.get_slice(slice_id)
    assert ref is not None, f"{slice_id} is not in {root}"
    m = store.load_manifest(ref["manifest"])
    n = len(m.segments)
    pool = [m.segments[i] for i in range(min(n, 4))]
    per = [len(canonical_json(s.to_json())) for s in pool]
    total = sum(per[i % len(pool)] for i in range(len(pool))) * (n // len(pool))
    total += sum(per[: n % len(pool)])
    empty = len(
        canonical_json(
            {
                "description": m.description,
                "format": MANIFEST_FORMAT,
                "format_version": 1,
                "segments": [],
            }
        )
    )
    return empty + total + (n - 1)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--segments", type=int, default=1_000_000)
    ap.add_argument("--root", type=Path, default=None, help="data root (default: a temporary one)")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="rayform-fleet-"))
    root = args.root or work / "root"
    result: dict = {"segments": args.segments}
    try:
        result["build_seconds"] = _demo(root, SLICE, args.segments)
        _demo(root, SMALL, 1000)
        with serving(root) as (url, token):
            cache = work / "cache"
            result["cold"] = _py(COLD, url, token, str(cache), SLICE)
            _py(COLD, url, token, str(cache), SMALL)
        result["cold"]["v1_json_bytes"] = _v1_json_bytes(root, SLICE)
        result["warm"] = _py(WARM, str(cache), SLICE)
        result["loader"] = _py(LOADER, str(cache), SLICE, "shuffle")
        result["loader_1000"] = _py(LOADER, str(cache), SMALL, "shuffle")
        result["loader_sampler"] = _py(LOADER, str(cache), SLICE, "sampler")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    out = HERE / "results" / f"fleet-{args.segments}.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(result, indent=2, sort_keys=True))
    print(json.dumps(result, indent=2, sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
