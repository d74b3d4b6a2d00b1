"""Streaming from a cold cache: read-ahead, a bounded cache, and what all-intra video costs.

The stub serves the demo slice from SeaweedFS (``weed mini``) on loopback; every byte the SDK
receives, from the stub and from the object store its 307s point at, crosses one throttled
"link" (``bench/_throttle.py``: a shared token bucket plus a latency per request). For each
link speed the same loader (2 workers, ``EpisodeSampler``, ``rayform.torch.collate``, batch
32, two cameras + joints) runs one epoch on a warm cache and one on a cold cache; samples/s
are counted after the first 5 % of the epoch (worker start-up and the first fetches).

    python -m bench.streaming            # a few minutes; writes bench/results/streaming.json

Rows: unthrottled, 100 MB/s + 5 ms, 30 MB/s + 5 ms (GOP 1, the ingest default); read-ahead
off at 100 MB/s; a cache limit at 25 % of the streams' bytes for two epochs beside no limit,
shuffled over the whole slice (``window=None``), within windows of episodes
(``EpisodeSampler(window=W)``, ``W`` episodes filling at most half the limit), and with no
window argument (``window="auto"``, the default, which picks ``W`` the same way); the same at
GOP 10 (a keyframe every 10 frames, about 3x fewer bytes). ``--limit-only`` runs only the cache-limit rows (GOP 1);
``--blob-path-row`` adds the automatic-window limit row with download URLs never asked for in
batches (``POST .../blob-urls``): every blob takes the stub's 307, then the store.

``--sshfs`` (root, ``/dev/fuse``, sshfs and sshd: ``tests/support/sshnodes.py``) runs, instead,
the cache on an sshfs mount of a local directory, as a cluster node would: a warm epoch (the
slice pulled, no limit) beside two epochs at a 25 % limit with the automatic window, on the
same mount, interleaved ``--repeats`` times (unthrottled link: what is measured is the cache's
cost on a network filesystem).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import secrets
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))

from bench._throttle import Link  # noqa: E402

SLICE = "slc_7c1e04aa"
OBS = ["cam0/rgb", "wrist/rgb", "joints/position"]
ACTION = "joints/position_delta"
MB = 10**6


def _root(gop: int) -> Path:
    """The full demo slice encoded with keyframes every ``gop`` frames (built once)."""
    root = HERE.parent / ".bench" / f"stream-root-gop{gop}"
    if (root / "slices").is_dir():
        return root
    from rayform_server import demo

    t0 = time.perf_counter()
    defaults = demo.build_episode.__defaults__
    # In-process build (jobs=1) at this GOP; the other defaults (renditions) as they are.
    demo.build_episode.__defaults__ = (gop, *(defaults or (None,))[1:])
    try:
        demo.build_demo(root, slice_id=SLICE, small=False, jobs=1)
    finally:
        demo.build_episode.__defaults__ = defaults
    print(f"built {root.name} in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    return root


class Setup:
    """SeaweedFS + the stub on an S3 copy of ``root``, both behind one throttled link."""

    def __init__(self, root: Path, work: Path) -> None:
        from support.seaweed import SeaweedS3

        from bench.bench_pull import s3_root_copy, start_server

        self.token = secrets.token_urlsafe(16)
        self.link = Link(None, 0.0)
        for attempt in range(3):  # weed mini sometimes draws a port it reserves for gRPC
            try:
                self.weed = SeaweedS3(work / f"weed{attempt}")
                break
            except RuntimeError:
                if attempt == 2:
                    raise
        try:
            s3_port = int(self.weed.endpoint.rsplit(":", 1)[1])
            store_port = self.link.forward(s3_port)
            s3_root = s3_root_copy(root, work, f"http://127.0.0.1:{store_port}", self.weed.env)
            self.proc, url = start_server(s3_root, self.token, env=self.weed.env)
        except BaseException:  # no SeaweedFS left running behind a failed start
            self.link.close()
            self.weed.stop()
            raise
        self.url = f"http://127.0.0.1:{self.link.forward(int(url.rsplit(':', 1)[1]))}"

    def cpu_s(self) -> dict[str, float]:
        """CPU seconds used so far: ``loader`` (this process, the link's thread excepted, and
        its reaped children: the DataLoader's workers) and ``store`` (the stub, SeaweedFS and
        the link, which share this machine's cores with the loader)."""
        me, tick = os.times(), os.sysconf("SC_CLK_TCK")
        link = self.link_cpu_s()
        store = link
        for pid in (self.proc.pid, *(p.pid for p in self.weed.procs.values())):
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            store += (int(fields[11]) + int(fields[12])) / tick
        loader = me.user + me.system + me.children_user + me.children_system - link
        return {"loader": loader, "store": store}

    def link_cpu_s(self) -> float:
        """CPU seconds so far of the link's thread (in this process, but not the loader's)."""
        return time.clock_gettime(time.pthread_getcpuclockid(self.link.thread_id))

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)
        self.link.close()
        self.weed.stop()


def _dataset(setup: Setup, cache: Path, **kw: Any) -> Any:
    import rayform
    from rayform.torch import EpisodeDataset

    limit = kw.pop("cache_limit", None)
    client = rayform.Client(
        endpoint=setup.url, token=setup.token, cache_dir=cache, cache_limit=limit
    )
    return EpisodeDataset(
        client.slices.get(SLICE), obs=OBS, action=ACTION, fps=15, horizon=16, **kw
    )


def _epoch(
    ds: Any,
    epoch: int,
    workers: int,
    window: int | str | None = None,
    setup: Setup | None = None,
) -> dict[str, float]:
    """Samples/s after the first 5 % of batches, and the whole epoch's wall time; with
    ``setup``, also the CPU seconds the loader and the store used in the epoch."""
    from torch.utils.data import DataLoader

    import rayform
    from rayform.torch import EpisodeSampler

    ds.set_epoch(epoch)
    loader = DataLoader(
        ds,
        sampler=EpisodeSampler(ds, window=window),
        batch_size=32,
        num_workers=workers,
        collate_fn=rayform.torch.collate,
    )
    skip = max(1, math.ceil(0.05 * len(loader)))
    cpu0 = setup.cpu_s() if setup is not None else None
    t0 = time.perf_counter()
    t_start, counted = t0, 0
    for i, batch in enumerate(loader):
        if i == skip - 1:
            t_start = time.perf_counter()
        elif i >= skip:
            counted += len(batch["t_ns"])
    end = time.perf_counter()
    row = {"samples_per_s": round(counted / (end - t_start), 1), "epoch_s": round(end - t0, 2)}
    if setup is not None and cpu0 is not None:
        del loader  # its workers exit and are reaped, so their CPU time is counted
        cpu1 = setup.cpu_s()
        row |= {f"{k}_cpu_s": round(cpu1[k] - cpu0[k], 2) for k in cpu0}
    return row


@contextlib.contextmanager
def _blob_urls_off(off: bool) -> Iterator[None]:
    """With ``off``, no download URLs asked for in batches (``POST .../blob-urls``) in this
    process and the workers it forks meanwhile: every blob takes the stub's 307."""
    import rayform

    expect = rayform.Client.expect_blobs
    if off:  # nothing announced: nothing to ask for together
        rayform.Client.expect_blobs = lambda self, slice_id, refs: None  # type: ignore[method-assign]
    try:
        yield
    finally:
        rayform.Client.expect_blobs = expect  # type: ignore[method-assign]


def _streams_bytes(ds: Any) -> int:
    return sum(r.size for r in ds.slice.manifest.blobs([*OBS, ACTION]).values())


def _median_row(rows: list[dict[str, float]]) -> dict[str, Any]:
    out: dict[str, Any] = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
    out["runs"] = rows
    return out


def run(
    gop: int,
    rates: list[float | None],
    workers: int,
    limit_rows: bool,
    work: Path,
    repeats: int,
    cold_rows: bool = True,
    latency_ms: float = 5.0,
    full_shuffle_row: bool = True,
    limit_repeats: int = 1,
    blob_path_row: bool = False,
) -> dict[str, Any]:
    setup = Setup(_root(gop), work / f"gop{gop}")
    out: dict[str, Any] = {"gop": gop, "rows": {}}
    try:
        warm_cache = work / f"warm{gop}"
        warm = _dataset(setup, warm_cache)
        out["bytes"] = _streams_bytes(warm)
        episodes = len(warm.slice.segments)
        if cold_rows:
            warm.slice.client.pull(SLICE, streams=[*OBS, ACTION])
        cases: list[tuple[str, float | None, dict[str, Any]]] = (
            [("warm", None, {})] if cold_rows else []
        )
        cases += [
            ("cold_" + ("unthrottled" if r is None else f"{r / MB:g}MBps_{latency_ms:g}ms"), r, {})
            for r in rates
        ]
        if gop == 1 and cold_rows:
            cases.append(
                (f"cold_100MBps_{latency_ms:g}ms_readahead_off", 100 * MB, {"readahead_bytes": 0})
            )
        runs: dict[str, list[dict[str, float]]] = {name: [] for name, _, _ in cases}
        for rep in range(repeats):  # interleaved, so every row sees the same machine load
            for name, rate, kw in cases:
                setup.link.set_rate(rate)
                setup.link.latency_s = 0.0 if rate is None else latency_ms / 1000
                cache = warm_cache if name == "warm" else work / f"cold{gop}-{name}-{rep}"
                before = setup.link.bytes_down
                row = _epoch(_dataset(setup, cache, **kw), 0, workers)
                row["bytes_down"] = setup.link.bytes_down - before
                runs[name].append(row)
                if name != "warm":
                    shutil.rmtree(cache, ignore_errors=True)
        for name in runs:
            out["rows"][name] = _median_row(runs[name])
        for row in out["rows"].values():
            warm_row = out["rows"]["warm"]
            row["warm_epoch_over_epoch"] = round(warm_row["epoch_s"] / row["epoch_s"], 3)
            row["after5pct_over_warm"] = round(row["samples_per_s"] / warm_row["samples_per_s"], 3)
        if limit_rows:
            from rayform.torch import EpisodeSampler

            setup.link.set_rate(100 * MB)
            setup.link.latency_s = latency_ms / 1000
            limit = out["bytes"] // 4
            # Episodes whose blobs fill at most half the limit (the rest: read-ahead, pins).
            window = max(1, int(limit / 2 / (out["bytes"] / episodes)))
            cases_2: list[tuple[str, int | None, int | str | None]] = [
                ("unlimited", None, None),
                ("limit_25pct", limit, None),
                ("limit_25pct_window", limit, window),
                ("limit_25pct_auto", limit, "auto"),  # EpisodeSampler(ds): no window argument
            ]
            if not full_shuffle_row:
                cases_2 = [c for c in cases_2 if c[0] != "limit_25pct"]
            if blob_path_row:  # the same, with every blob asked for by its own 307
                cases_2.append(("limit_25pct_auto_blob_path", limit, "auto"))
            runs_2: dict[str, list[list[dict[str, float]]]] = {c[0]: [] for c in cases_2}
            for rep in range(limit_repeats):  # interleaved, as the rows above
                for label, cap, w in cases_2:
                    ds = _dataset(setup, work / f"two-{label}-{rep}", cache_limit=cap)
                    epochs = []
                    for e in range(2):
                        before = setup.link.bytes_down
                        with _blob_urls_off(label.endswith("_blob_path")):
                            row = _epoch(ds, e, workers, w, setup)
                        row["bytes_down"] = setup.link.bytes_down - before
                        epochs.append(row)
                    runs_2[label].append(epochs)
                    shutil.rmtree(work / f"two-{label}-{rep}", ignore_errors=True)
            for label, cap, w in cases_2:
                chosen = EpisodeSampler(_dataset(setup, work / "probe", cache_limit=cap), window=w)
                out["rows"][f"two_epochs_{label}"] = {
                    "cache_limit": cap,
                    "window": w,
                    "window_chosen": chosen.window if w == "auto" else w,
                    "epochs": [_median_row([r[e] for r in runs_2[label]]) for e in range(2)],
                }
            # The unlimited run's second epoch reads a warm cache: each epoch's rate after its
            # first 5 % against it, in the same round (the median of the rounds' ratios).
            # Beside it, whole epochs (warm epoch time over this one's) and the loader's CPU
            # per epoch against warm's: a cold epoch here also pays the store's CPU, on the
            # same cores.
            warm_runs = [r[1] for r in runs_2["unlimited"]]
            for label, _, _ in cases_2:
                for e, row in enumerate(out["rows"][f"two_epochs_{label}"]["epochs"]):
                    pairs = list(zip(runs_2[label], warm_runs, strict=True))
                    for key, ratio in (
                        (
                            "after5pct_over_warm",
                            lambda r, w: r["samples_per_s"] / w["samples_per_s"],
                        ),
                        ("epoch_over_warm", lambda r, w: w["epoch_s"] / r["epoch_s"]),
                        (
                            "warm_cpu_over_loader_cpu",
                            lambda r, w: w["loader_cpu_s"] / r["loader_cpu_s"],
                        ),
                    ):
                        row[key] = round(statistics.median(ratio(r[e], w) for r, w in pairs), 3)
    finally:
        setup.close()
    return out


def run_sshfs(workers: int, work: Path, repeats: int) -> dict[str, Any]:
    """Warm epochs and two epochs at a 25 % limit (automatic window), caches on sshfs."""
    from support.sshnodes import SshNodes, missing

    why = missing()
    if why is not None:
        raise SystemExit(f"--sshfs: {why}")
    setup = Setup(_root(1), work / "gop1")
    out: dict[str, Any] = {"gop": 1, "cache_on": "sshfs", "rows": {}}
    try:
        with SshNodes() as nodes:
            mount = nodes.mount("node")
            warm = _dataset(setup, mount / "warm")
            out["bytes"] = _streams_bytes(warm)
            warm.slice.client.pull(SLICE, streams=[*OBS, ACTION])
            limit = out["bytes"] // 4
            rows: dict[str, list[dict[str, float]]] = {"warm": [], "limit_25pct_auto": []}
            per_epoch: list[list[dict[str, float]]] = []  # each repeat's two limit epochs
            for rep in range(repeats):  # interleaved: both see the same machine load
                rows["warm"].append(_epoch(warm, rep, workers))
                ds = _dataset(setup, mount / f"limit{rep}", cache_limit=limit)
                epochs = [_epoch(ds, e, workers, "auto") for e in range(2)]
                rows["limit_25pct_auto"].append(
                    {
                        "samples_per_s": round(
                            statistics.mean(e["samples_per_s"] for e in epochs), 1
                        ),
                        "epoch_s": round(statistics.mean(e["epoch_s"] for e in epochs), 2),
                    }
                )
                per_epoch.append(epochs)
            for name, runs in rows.items():
                out["rows"][name] = _median_row(runs)
            warm_row = out["rows"]["warm"]
            out["rows"]["limit_25pct_auto"]["over_warm"] = round(
                out["rows"]["limit_25pct_auto"]["samples_per_s"] / warm_row["samples_per_s"], 3
            )
            out["rows"]["limit_25pct_auto"]["epochs_per_run"] = per_epoch
            out["cache_limit"] = limit
    finally:
        setup.close()
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--repeats", type=int, default=2, help="interleaved runs per row (median kept)")
    p.add_argument("--no-limit", action="store_true", help="skip the two-epoch cache-limit rows")
    p.add_argument(
        "--limit-only", action="store_true", help="only the two-epoch cache-limit rows (GOP 1)"
    )
    p.add_argument(
        "--gops",
        type=int,
        nargs="+",
        default=[1, 10],
        help="encodings to run: 1 (all-intra, full rows) and/or 10 (cold rows only)",
    )
    p.add_argument(
        "--sshfs",
        action="store_true",
        help="only a warm epoch beside a 25 %% limit, caches on an sshfs mount (needs root)",
    )
    p.add_argument(
        "--latency-ms",
        type=float,
        default=5.0,
        help="latency added to every request of the throttled rows, in ms (default 5)",
    )
    p.add_argument(
        "--no-full-shuffle",
        action="store_true",
        help="skip the limit row with a full shuffle (minutes per epoch: it re-fetches each batch)",
    )
    p.add_argument(
        "--limit-repeats", type=int, default=1, help="interleaved runs of the cache-limit rows"
    )
    p.add_argument(
        "--blob-path-row",
        action="store_true",
        help="also the 25 %% limit row with no batch of download URLs (a 307 per blob)",
    )
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    default_name = "streaming_sshfs.json" if args.sshfs else "streaming.json"
    args.out = args.out or HERE / "results" / default_name
    with tempfile.TemporaryDirectory(prefix="rayform-bench-stream-") as tmp:
        work = Path(tmp)
        results = []
        if args.sshfs:
            results.append(run_sshfs(args.workers, work, args.repeats))
        elif args.limit_only:
            results.append(
                run(
                    1,
                    [],
                    args.workers,
                    True,
                    work,
                    args.repeats,
                    False,
                    args.latency_ms,
                    not args.no_full_shuffle,
                    args.limit_repeats,
                    args.blob_path_row,
                )
            )
        elif 1 in args.gops:
            results.append(
                run(
                    1,
                    [None, 100 * MB, 30 * MB],
                    args.workers,
                    not args.no_limit,
                    work,
                    args.repeats,
                    latency_ms=args.latency_ms,
                    full_shuffle_row=not args.no_full_shuffle,
                    limit_repeats=args.limit_repeats,
                )
            )
        if 10 in args.gops and not args.limit_only and not args.sshfs:
            results.append(
                run(
                    10,
                    [100 * MB, 30 * MB],
                    args.workers,
                    False,
                    work,
                    args.repeats,
                    latency_ms=args.latency_ms,
                )
            )
    doc = {
        "benchmark": "streaming",
        "slice": SLICE,
        "obs": OBS,
        "action": ACTION,
        "loader": f"batch 32, {args.workers} workers, EpisodeSampler, rayform.torch.collate",
        "latency_ms": args.latency_ms,
        "results": results,
        "cpus": os.cpu_count(),
        "load_avg_1m_at_end": round(os.getloadavg()[0], 2),
        "python": platform.python_version(),
    }
    args.out.write_text(json.dumps(doc, indent=2) + "\n")
    print(json.dumps(doc, indent=2))


if __name__ == "__main__":
    main()
