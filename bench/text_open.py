"""Benchmark: does a task per episode make a fleet-sized slice slower to open?

Builds two slices of ``--segments`` segments over a pool of 100 episodes (segment ``i``
reuses pool episode ``i % 100``'s blobs, as ``rayform-server demo --share-blobs`` does): one
with a table stream only, one with the same table and a ``task`` text stream (one of 100
tasks per episode). Then, in fresh processes, alternating, times opening each manifest
(``Store.load_manifest``: the root, the page checks) and building an ``EpisodeDataset`` on it
(``obs=["joints/position"]``, and for the second ``obs=["joints/position", "task"]`` too), and
reports the medians and the ratios with/without, and each process's peak RSS (``VmHWM``) after
opening (also less its peak once the imports are done: what the manifest adds) and after
building the dataset. On the slice with tasks it also times
``select(where="task == ...")`` twice in one process (cold: the blob hashes read and the task
blobs decoded; warm: the same columns again, as a second filter on the slice reads them).
Last, it serves both roots on loopback and times ``client.slices.get`` of each in fresh
processes, with its peak RSS: once with an empty cache, then warm.

Usage::

    python -m bench.text_open [--segments 1000000] [--rounds 3]

Writes ``bench/results/text-open-<N>.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from bench._serve import serving

HERE = Path(__file__).resolve().parent
POOL = 100

BUILD = """
import sys, numpy as np, pyarrow as pa
from rayform.format import segments_to_table
from rayform_server.builder import SliceBuilder, TableData, TextData, commit_table
from rayform_server.demo import segment_id
from rayform_server.store import Store
root, n, with_task = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1"
store = Store(root)
b = SliceBuilder(store)
for i in range(POOL):
    t = 10**18 + np.arange(300, dtype=np.int64) * 20_000_000 + i * 10**10
    streams = [TableData("joints/position", t, np.full((300, 14), i, np.float32), 50)]
    if with_task:
        streams.append(TextData("task", t[:1], [{"content": f"task number {i}"}], 15))
    b.add_segment(segment_id(0, i), site="lab", streams=streams)
table = segments_to_table(b.segments)
table = table.take(pa.array(np.arange(n, dtype=np.int64) % POOL))
ids = pa.array([segment_id(1, i) for i in range(n)], pa.string())
table = table.set_column(table.schema.get_field_index("id"), "id", ids)
digest = commit_table(store, table, "text-open")
store.set_slice("slc_7e470100", digest)
print(digest)
""".replace("POOL", str(POOL))

OPEN = """
import json, sys, time
from rayform.torch import EpisodeDataset
from rayform_server.store import Store
from support_slice import store_slice, peak_rss
root, digest, obs = sys.argv[1], sys.argv[2], sys.argv[3].split(",")
rss_imported = peak_rss()
t0 = time.perf_counter()
m = Store(root).load_manifest(digest)
t_open = time.perf_counter() - t0
s = store_slice("slc_7e470100", m, Store(root))
rss_open = peak_rss()
t0 = time.perf_counter()
ds = EpisodeDataset(s, obs=obs, action=None, fps=15, shard=None)
t_ds = time.perf_counter() - t0
print(json.dumps({"open_seconds": t_open, "dataset_seconds": t_ds, "len": len(ds),
                  "rss_open_bytes": rss_open, "rss_dataset_bytes": peak_rss(),
                  "rss_open_added_bytes": rss_open - rss_imported}))
"""

SELECT = """
import json, sys, time
from rayform_server.store import Store
from support_slice import store_slice
root, digest = sys.argv[1], sys.argv[2]
s = store_slice("slc_7e470100", Store(root).load_manifest(digest), Store(root))
times, kept = [], []
for task in ("task number 7", "task number 8"):
    t0 = time.perf_counter()
    kept.append(len(s.select(where=f"task == {task!r}").segments))
    times.append(time.perf_counter() - t0)
print(json.dumps({"cold_seconds": times[0], "warm_seconds": times[1], "kept": kept}))
"""

#: ``client.slices.get`` from a served root in a fresh process: its time and peak RSS (also
#: less the peak once ``rayform`` is imported: what the manifest adds).
GET = """
import json, sys, time
import rayform
from support_slice import peak_rss
client = rayform.Client(endpoint=sys.argv[1], token=sys.argv[2], cache_dir=sys.argv[3])
before = peak_rss()
t0 = time.perf_counter()
s = client.slices.get("slc_7e470100")
n = len(s.segments)
t_get = time.perf_counter() - t0
rss = peak_rss()
print(json.dumps({"get_seconds": t_get, "rss_get_bytes": rss, "rss_get_added_bytes": rss - before,
                  "segments": n}))
"""

#: A Slice over a data root without a server (what tests/support/fakes.py's store_slice does).
SUPPORT = """
from rayform.slice import Slice

class _Blobs:  # a BlobFetcher: blobs straight from the data root (tests/support/fakes.py)
    cache_dir, cache_limit = None, None
    def __init__(self, store):
        self.store = store
    def ensure_blob(self, slice_id, ref):
        return self.store.blob_path(ref.hash)
    def pull(self, slice_id, streams=None, jobs=8, progress=False):
        pass
    def would_fetch(self, ref):
        return False

def store_slice(slice_id, manifest, store):
    return Slice(slice_id, manifest.hash, manifest, _Blobs(store))

def peak_rss():
    # This process's peak resident set so far, bytes (VmHWM; ru_maxrss where no /proc).
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
"""


def _run(code: str, *args: str, cwd: Path) -> str:
    out = subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(cwd), "OMP_NUM_THREADS": "1"},
        timeout=1800,
    )
    if out.returncode != 0:
        raise RuntimeError(out.stderr[-3000:])
    return out.stdout.strip().splitlines()[-1]


def _gets(work: Path, rounds: int) -> dict:
    """``client.slices.get`` of each slice from its served root, in fresh processes: the first
    round with an empty cache (the manifest downloaded, checked, cached), then warm rounds."""
    keys = ("get_seconds", "rss_get_bytes", "rss_get_added_bytes")
    runs: dict[str, list[dict]] = {"plain": [], "task": []}
    with serving(work / "plain") as plain, serving(work / "task") as task:
        for _ in range(rounds + 1):
            for k, (url, token) in (("plain", plain), ("task", task)):
                cache = str(work / f"cache-{k}")
                runs[k].append(json.loads(_run(GET, url, token, cache, cwd=work)))
    out: dict = {}
    for k, rs in runs.items():
        out[k] = {"cold": {key: rs[0][key] for key in keys}}
        out[k]["warm"] = {key: statistics.median(r[key] for r in rs[1:]) for key in keys}
    out["ratio"] = {
        side: {key: out["task"][side][key] / out["plain"][side][key] for key in keys}
        for side in ("cold", "warm")
    }
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--segments", type=int, default=1_000_000)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="rayform-text-open-"))
    (work / "support_slice.py").write_text(SUPPORT)
    digests = {
        k: _run(BUILD, str(work / k), str(args.segments), flag, cwd=work)
        for k, flag in (("plain", "0"), ("task", "1"))
    }
    sides = {
        "plain": ("plain", "joints/position"),
        "task_slice": ("task", "joints/position"),
        "task_in_obs": ("task", "joints/position,task"),
    }
    runs: dict[str, list[dict]] = {k: [] for k in sides}
    selects = []
    for _ in range(args.rounds + 1):  # the first round warms the page cache: not counted
        for k, (root, obs) in sides.items():
            runs[k].append(json.loads(_run(OPEN, str(work / root), digests[root], obs, cwd=work)))
        selects.append(json.loads(_run(SELECT, str(work / "task"), digests["task"], cwd=work)))
    result: dict = {"segments": args.segments, "rounds": args.rounds}
    keys = (
        "open_seconds",
        "dataset_seconds",
        "rss_open_bytes",
        "rss_open_added_bytes",
        "rss_dataset_bytes",
    )
    for k, rs in runs.items():
        result[k] = {key: statistics.median(r[key] for r in rs[1:]) for key in keys}
    result["ratio"] = {
        f"{k}/plain": {key: result[k][key] / result["plain"][key] for key in keys}
        for k in ("task_slice", "task_in_obs")
    }
    result["select_task"] = {
        key: statistics.median(r[key] for r in selects[1:])
        for key in ("cold_seconds", "warm_seconds")
    }
    result["select_task"]["kept"] = selects[-1]["kept"]
    result["slices_get"] = _gets(work, args.rounds)
    assert len({r["len"] for rs in runs.values() for r in rs}) == 1  # the same grid
    out = HERE / "results" / f"text-open-{args.segments}.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(result, indent=2, sort_keys=True))
    print(json.dumps(result, indent=2, sort_keys=True))
    return 0 if np.isfinite(list(result["ratio"]["task_slice/plain"].values())).all() else 1


if __name__ == "__main__":
    raise SystemExit(main())
