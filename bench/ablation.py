"""Ablation: each hand-written mechanism of the read path against the library path it replaces.

Every mechanism is turned off alone, in a fresh process, and the headline rows are timed with
it off and with everything on (``baseline``), alternating in rounds so a shared machine's load
falls on every side alike:

* ``full``: the README loader at full resolution (both 480x640 cameras, the joints and a
  16-step action chunk at 15 Hz; ``DataLoader(batch_size=32, num_workers=2, shuffle=True,
  persistent_workers=True, collate_fn=rayform.torch.collate)``) over the demo scene rendered
  all-intra (``bench/resize.py``'s data);
* ``rend224``: the same at ``image_size=(224, 224), resize="pad"`` from 240x320 renditions;
* ``mixture``: ``MixtureDataset`` of the full-resolution and the rendition slices, both at
  224 (weights 0.5/0.5, ``num_samples`` 2,000, ``EpisodeSampler``);
* ``blocks``: what a Ray read task of ``read_slice`` runs, without Ray: blocks of 96 samples in
  time order through ``__getitems__`` into Arrow columns, each copied out (as Ray copies a
  block into its object store) before the next;
* ``fleet``: a warm offline ``slices.get`` of a ``--segments``-segment fleet slice and
  ``EpisodeDataset`` over it (seconds), and 2,000 shuffled table-only samples drawn from it
  in the main process (samples/s).

Mechanisms, and what replaces each when it is off:

* ``packet_decoder``: the all-intra packet decoder (``_decoding/_intra.py``) -> torchcodec;
* ``swscale``: the colour conversion through ``ctypes`` into libswscale (``_decoding/_sws.py``)
  -> PyAV's ``reformat`` and one copy;
* ``checks_on_disk``: the packet decoder's verdicts kept on disk (``_decoding/_checks.py``)
  -> each process checks again (a cost in time to the first batch, reported too);
* ``page_rows``: a manifest page's rows read from its Arrow buffers (``manifest/_pagerows.py``)
  -> pyarrow's ``slice(i, 1).to_pylist()``.

Removed after the first run, each for buying under 10 % on every row (docs/benchmarks.md): the
frames written into the worker's next shared-memory batch (``in_place_batch``), block memory
reused by reference count (``batch_memory``), a mixture's per-pass permutation tables
(``perm_tables``) and, after the second run, the decode and resize buffers kept between
batches with torch's private ``_upsample_bilinear2d_aa.out`` (``scratch``).
``--against DIR`` times another checkout's SDK (``before``) beside this one; with
``--against-root ROOT`` (a root that checkout built and pulled with its own code), it reads its
own data through its own benchmark code, for a checkout that cannot read this one's format.

Usage: ``.venv/bin/python -m bench.ablation [--episodes 4] [--rounds 3] [--batches 20]
[--segments 100000] [--rows full,rend224,mixture,blocks,fleet] [--mechanisms ...]``.
Writes ``bench/results/ablation.json`` and prints the table of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROWS = ("full", "rend224", "mixture", "blocks", "fleet")
#: Mechanism -> the rows it can change (it is timed off on those only).
MECHANISMS: dict[str, tuple[str, ...]] = {
    "packet_decoder": ("full", "rend224", "mixture", "blocks"),
    "swscale": ("full", "rend224", "mixture", "blocks"),
    "checks_on_disk": ("full", "rend224"),
    "page_rows": ("fleet",),
}
FLEET_SLICE = "slc_f1ee7001"


def _turn_off(mechanism: str) -> dict[str, Any]:
    """Turn ``mechanism`` off in this process (and the workers it forks); returns the dataset
    options that do it, if any. ``before``: nothing (another checkout's SDK, ``--against``)."""
    if mechanism == "packet_decoder":
        return {"decoder_backend": "torchcodec"}
    if mechanism == "swscale":
        from rayform.torch._decoding import _sws

        _sws.converter = lambda *a, **k: None  # type: ignore[assignment]
    elif mechanism == "checks_on_disk":
        from rayform.torch._decoding import _checks

        _checks.load = lambda *a, **k: None  # type: ignore[assignment]
        _checks.store = lambda *a, **k: None  # type: ignore[assignment]
    elif mechanism == "page_rows":
        from rayform.manifest import _pagerows

        _pagerows.PageRows.of = staticmethod(lambda *a, **k: None)  # type: ignore[method-assign]
    elif mechanism not in ("baseline", "before"):
        raise SystemExit(f"unknown mechanism {mechanism!r}; known: {', '.join(MECHANISMS)}")
    return {}


def _loader_rate(make: Any, batches: int, warmup: int) -> dict[str, float]:
    from bench.resize import time_row

    t0 = time.perf_counter()
    rate, cpu = time_row(make, batches, warmup)
    return {"samples_per_s": rate, "cpu_s_per_sample": cpu, "row_seconds": time.perf_counter() - t0}


def _first_batch(make: Any) -> float:
    t0 = time.perf_counter()
    loader = make()
    next(iter(loader))
    dt = time.perf_counter() - t0
    del loader
    return dt


def _child(row: str, mechanism: str, args: argparse.Namespace) -> dict[str, Any]:
    import torch
    from torch.utils.data import DataLoader

    import rayform
    from bench._timing import LOADER_KW
    from bench.resize import DEMO, SLICE_ID, dataset, renditions_slice_id
    from rayform.torch import EpisodeSampler, MixtureDataset, collate

    torch.set_num_threads(1)
    kw = _turn_off(mechanism)
    if row == "fleet":
        return _fleet(Path(args.fleet_cache), args)
    client = rayform.Client(cache_dir=_cache(args), offline=True)
    full = client.slices.get(SLICE_ID)
    rend = client.slices.get(renditions_slice_id(240))
    at224 = {"image_size": (224, 224), "resize": "pad", **kw}
    if row in ("full", "rend224"):
        slice_, opts = (full, kw) if row == "full" else (rend, at224)

        def make() -> DataLoader:
            return DataLoader(dataset(DEMO, slice_, **opts), **LOADER_KW, collate_fn=collate)

        out = _loader_rate(make, args.batches, args.warmup)
        if mechanism in ("baseline", "checks_on_disk"):
            out["first_batch_s"] = _first_batch(make)
        return out
    if row == "mixture":

        def make() -> DataLoader:
            sources = [(dataset(DEMO, s, **at224), 0.5, n) for s, n in ((full, "a"), (rend, "b"))]
            mix = MixtureDataset(sources, num_samples=2000)
            kwargs = {k: v for k, v in LOADER_KW.items() if k != "shuffle"}
            return DataLoader(mix, sampler=EpisodeSampler(mix), **kwargs, collate_fn=collate)

        return _loader_rate(make, args.batches, args.warmup)
    if row == "blocks":
        return _blocks(dataset(DEMO, full, **kw), args)
    raise SystemExit(f"unknown row {row!r}")


def _blocks(ds: Any, args: argparse.Namespace) -> dict[str, float]:
    """A Ray read task's blocks of 96 samples in time order (``SliceDatasource.read_samples``,
    without Ray), each copied out as Ray copies it into its object store."""
    import pyarrow as pa

    from rayform.ray import SliceDatasource

    source = SliceDatasource(ds, max_block_bytes=256 << 20)
    block_rows = 96
    rows = range(0, min(len(ds), block_rows * (args.batches + 1)))
    blocks = source.read_samples(rows, block_rows, len(rows))
    next(blocks)  # warm-up: the dataset rebuilt from its URI, the decoders opened
    n, t0, c0 = 0, time.perf_counter(), time.process_time()
    for table in blocks:
        sink = pa.BufferOutputStream()  # a copy out, as Ray's put into its object store
        with pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table)
        n += table.num_rows
        del table, sink
    cpu = time.process_time() - c0
    return {"samples_per_s": n / (time.perf_counter() - t0), "cpu_s_per_sample": cpu / n}


def _fleet(cache: Path, args: argparse.Namespace) -> dict[str, float]:
    import numpy as np

    import rayform
    from rayform.torch import EpisodeDataset

    client = rayform.Client(cache_dir=cache, offline=True)
    t0 = time.perf_counter()
    s = client.slices.get(FLEET_SLICE)
    ds = EpisodeDataset(
        s, obs=["joints/position"], action="joints/position_delta", fps=15, horizon=16
    )
    opened = time.perf_counter() - t0
    draws = np.random.default_rng(0).integers(0, len(ds), 2000).tolist()
    ds.__getitems__(draws[:32])
    t0, c0 = time.perf_counter(), time.process_time()
    for i in range(0, len(draws), 32):
        ds.__getitems__(draws[i : i + 32])
    return {
        "open_s": opened,
        "samples_per_s": len(draws) / (time.perf_counter() - t0),
        "cpu_s_per_sample": (time.process_time() - c0) / len(draws),
    }


def _cache(args: argparse.Namespace) -> Path:
    """The warm cache every loader row reads through (``rayform.Client(offline=True)``)."""
    return Path(args.root).with_name(Path(args.root).name + "-cache")


def _pull(root: Path, cache: Path, pulls: list[list[str]]) -> None:
    """``rayform pull`` with each of ``pulls`` (its arguments) from ``rayform-server serve`` on
    ``root``, once."""
    from bench._serve import serving

    if (cache / "done").exists():
        return
    with serving(root) as (url, token):
        for pull in pulls:
            subprocess.run(
                [sys.executable, "-m", "rayform", "pull", *pull],
                env={
                    **os.environ,
                    "RAYFORM_ENDPOINT": url,
                    "RAYFORM_TOKEN": token,
                    "RAYFORM_CACHE_DIR": str(cache),
                },
                check=True,
                capture_output=True,
            )
    (cache / "done").write_text("")


def _prepare(args: argparse.Namespace) -> None:
    from bench.fleet import _demo
    from bench.resize import SLICE_ID, build, renditions_slice_id

    root = Path(args.root)
    build(root, args.episodes, SLICE_ID)
    build(root, args.episodes, renditions_slice_id(240), (240,))
    rend = renditions_slice_id(240)
    _pull(root, _cache(args), [[SLICE_ID], [rend], [rend, "--image-size", "224x224"]])
    cache = Path(args.fleet_cache)
    if "fleet" in args.rows:
        fleet_root = cache.parent / f"fleet-root-{args.segments}"
        if not (fleet_root / "slices").is_dir():
            print(f"[ablation] building a {args.segments}-segment fleet slice ...", flush=True)
            _demo(fleet_root, FLEET_SLICE, args.segments)
        _pull(fleet_root, cache, [[FLEET_SLICE]])


def _run(row: str, mechanism: str, args: argparse.Namespace) -> dict[str, Any]:
    root, cwd, child = args.root, HERE.parent, mechanism
    if mechanism == "before" and args.against_root:
        # The other checkout's own data (its format), read by its own benchmark's child,
        # everything on.
        root, cwd, child = str(Path(args.against_root).resolve()), Path(args.against), "baseline"
    cmd = [sys.executable, "-m", "bench.ablation", "--child", row, child]
    cmd += ["--root", root, "--fleet-cache", args.fleet_cache]
    cmd += ["--batches", str(args.batches), "--warmup", str(args.warmup)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    if mechanism == "before":  # another checkout's SDK first on the path, everything on
        sdk = [str(Path(args.against) / d) for d in ("sdk", "server_stub")]
        env["PYTHONPATH"] = os.pathsep.join([*sdk, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=cwd)
    if out.returncode != 0:
        raise RuntimeError(f"{row}/{mechanism} failed:\n{out.stderr[-3000:]}")
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def _table(results: dict[str, dict[str, list[dict[str, Any]]]]) -> str:
    """The markdown table: per row, everything on (samples/s and CPU ms per sample, medians),
    then per mechanism off the speed it keeps: baseline CPU per sample / CPU per sample with
    it off (the rows are CPU-bound: on a shared machine CPU per sample swings far less than
    wall-clock rates), with the wall-clock ratio in brackets."""

    def med(row: str, mech: str, key: str) -> float | None:
        vals = [r[key] for r in results.get(row, {}).get(mech, []) if key in r]
        return statistics.median(vals) if vals else None

    rows = [r for r in ROWS if r in results]
    lines = ["| mechanism off | " + " | ".join(rows) + " |", "|---|" + "---:|" * len(rows)]
    cells = []
    for r in rows:
        rate, cpu = med(r, "baseline", "samples_per_s"), med(r, "baseline", "cpu_s_per_sample")
        cells.append(f"{rate:.0f}/s, {cpu * 1e3:.2f} ms" if rate and cpu else "-")
    lines.append("| none: samples/s, CPU per sample | " + " | ".join(cells) + " |")
    for mech, on in {"before": ROWS, **MECHANISMS}.items():
        cells = []
        for r in rows:
            b_cpu, m_cpu = med(r, "baseline", "cpu_s_per_sample"), med(r, mech, "cpu_s_per_sample")
            b_rate, m_rate = med(r, "baseline", "samples_per_s"), med(r, mech, "samples_per_s")
            if r in on and b_cpu and m_cpu and b_rate and m_rate:
                cells.append(f"{b_cpu / m_cpu:.2f} ({m_rate / b_rate:.2f})")
            else:
                cells.append("-")
        lines.append(f"| {mech} | " + " | ".join(cells) + " |")
    extra = []
    for key, row, what in (
        ("first_batch_s", "full", "time to the first batch, full"),
        ("first_batch_s", "rend224", "time to the first batch, rend224"),
        ("open_s", "fleet", "fleet open"),
    ):
        b = med(row, "baseline", key)
        off = {m: med(row, m, key) for m in MECHANISMS}
        shown = ", ".join(f"{m} off {v:.2f} s" for m, v in off.items() if v is not None)
        if b is not None:
            extra.append(f"* {what}: {b:.2f} s with everything on; {shown}")
    return "\n".join(lines + [""] + extra)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--child", nargs=2, metavar=("ROW", "MECHANISM"), help=argparse.SUPPRESS)
    ap.add_argument("--episodes", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batches", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--segments", type=int, default=100_000)
    ap.add_argument("--rows", default=",".join(ROWS))
    ap.add_argument(
        "--mechanisms", default=",".join(MECHANISMS), help="comma-separated; empty: none"
    )
    ap.add_argument("--root", default=None)
    ap.add_argument("--fleet-cache", default=None)
    ap.add_argument("--out", type=Path, default=HERE / "results" / "ablation.json")
    ap.add_argument(
        "--against",
        help="another checkout (e.g. a git worktree of main): its SDK is timed as 'before'",
    )
    ap.add_argument(
        "--against-root",
        help="with --against: a data root that checkout built and pulled itself (its own "
        "`python -m bench.ablation --rounds 0 --root DIR`, run in it), for a checkout that "
        "cannot read this one's manifest format; its own benchmark code times it",
    )
    ap.add_argument("--report", type=Path, help="print the table of a results file, run nothing")
    args = ap.parse_args()
    if args.report:
        print(_table(json.loads(args.report.read_text())["results"]))
        return 0
    bench_dir = HERE.parent / ".bench"
    args.root = args.root or str(bench_dir / f"resize-e{args.episodes}")
    args.fleet_cache = args.fleet_cache or str(bench_dir / f"fleet-cache-{args.segments}")
    if args.child:
        print(json.dumps(_child(args.child[0], args.child[1], args)))
        return 0
    args.rows = [r for r in args.rows.split(",") if r]
    mechanisms = [m for m in args.mechanisms.split(",") if m]
    unknown = sorted(set(mechanisms) - set(MECHANISMS))
    if unknown:
        ap.error(f"unknown mechanism {', '.join(unknown)}; known: {', '.join(MECHANISMS)}")
    _prepare(args)
    results: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for rnd in range(args.rounds):
        for row in args.rows:
            before = ["before"] if args.against else []
            for mech in ["baseline", *before, *(m for m in mechanisms if row in MECHANISMS[m])]:
                res = _run(row, mech, args)
                results.setdefault(row, {}).setdefault(mech, []).append(res)
                print(f"[ablation] round {rnd + 1} {row:8s} {mech:15s} {res}", flush=True)
    table = _table(results)
    print(table)
    args.out.parent.mkdir(exist_ok=True)
    args.out.write_text(
        json.dumps(
            {"args": vars(args) | {"out": str(args.out)}, "results": results}, indent=2, default=str
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
