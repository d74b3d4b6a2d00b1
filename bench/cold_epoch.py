"""A cold first epoch against a warm one, straight from ``rayform-server serve`` on loopback.

The README's loader (``EpisodeSampler``, batch 32, 2 workers, ``rayform.torch.collate``, both
cameras, the state and a 16-step action chunk at 15 Hz) reads the full demo slice (20
episodes, 120 blobs: videos of ~0.6 MB and timestamp and table blobs of ~2 kB) twice per round:
from an empty cache (cold, read-ahead on, as by default) and again from the cache that epoch
filled (warm). No object store and no throttle: the stub serves its own blobs, so what a cold
epoch adds is the fetch path itself (requests, hashing, writes). Rounds alternate between the
servers given, so each sees the same machine load.

Beside the epochs, one thread downloads every blob of the slice in turn over one kept-alive
connection (the time to the first byte of a small blob is the latency each fetch pays), and
``Client.pull`` fetches them into an empty cache as ``rayform pull`` does.

    python -m bench.cold_epoch                              # this checkout's server
    python -m bench.cold_epoch --server before=/path/to/server_stub   # and another's, beside it

``--server NAME=DIR`` serves from the ``rayform_server`` package in ``DIR`` (e.g. a
``git worktree`` of an earlier commit's ``server_stub``); the SDK is this checkout's.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from bench import streaming
from bench._serve import serving
from bench.streaming import ACTION, OBS, SLICE, _root

HERE = Path(__file__).resolve().parent


def _epoch(url: str, token: str, cache: Path, workers: int) -> dict[str, float]:
    """Samples/s of one epoch of the loader after its first 5 % of batches, and the whole
    epoch in s."""
    import rayform
    from rayform.torch import EpisodeDataset

    client = rayform.Client(endpoint=url, token=token, cache_dir=cache)
    ds = EpisodeDataset(client.slices.get(SLICE), obs=OBS, action=ACTION, fps=15, horizon=16)
    return streaming._epoch(ds, 0, workers)


def _one_by_one(url: str, token: str, hashes: list[tuple[str, int]]) -> dict[str, float]:
    """Every blob downloaded in turn over one kept-alive connection: total seconds and the
    median time to the first byte of the blobs under 64 kB, in ms."""
    small: list[float] = []
    t0 = time.perf_counter()
    headers = {"Authorization": f"Bearer {token}"}
    with httpx.Client(base_url=url, headers=headers, timeout=60) as client:
        for digest, size in hashes:
            t1 = time.perf_counter()
            with client.stream("GET", f"/v1/slices/{SLICE}/blobs/{digest}") as r:
                r.raise_for_status()
                chunks = r.iter_raw()
                next(chunks, b"")
                if size < 64_000:
                    small.append(time.perf_counter() - t1)
                for _ in chunks:
                    pass
    return {
        "all_blobs_s": round(time.perf_counter() - t0, 3),
        "small_first_byte_ms": round(1000 * statistics.median(small), 2) if small else 0.0,
        "small_blobs": len(small),
    }


def _pull_s(url: str, token: str, cache: Path) -> float:
    """Seconds for ``Client.pull`` of the loader's streams into an empty cache (what
    ``rayform pull`` does: 8 downloads at a time)."""
    import rayform

    client = rayform.Client(endpoint=url, token=token, cache_dir=cache)
    t0 = time.perf_counter()
    client.pull(SLICE, streams=[*OBS, ACTION])
    return round(time.perf_counter() - t0, 3)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3, help="cold + warm epochs per server")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument(
        "--server",
        action="append",
        default=[],
        metavar="NAME=DIR",
        help="also serve from the rayform_server package in DIR (repeatable)",
    )
    ap.add_argument("--out", type=Path, default=HERE / "results" / "cold_epoch.json")
    args = ap.parse_args()

    import rayform

    servers: list[tuple[str, str | None]] = [("this checkout", None)]
    for spec in args.server:
        name, sep, path = spec.partition("=")
        if not sep or not Path(path, "rayform_server").is_dir():
            ap.error(f"--server {spec!r}: use NAME=DIR, DIR holding a rayform_server package")
        servers.append((name, str(Path(path).resolve())))
    root = _root(1)
    rows: dict[str, dict[str, list[Any]]] = {name: {"cold": [], "warm": []} for name, _ in servers}
    latency: dict[str, list[dict[str, float]]] = {name: [] for name, _ in servers}
    with contextlib.ExitStack() as stack:
        urls = {name: stack.enter_context(serving(root, server_dir=path)) for name, path in servers}
        with tempfile.TemporaryDirectory() as tmp:
            url, token = urls["this checkout"]
            client = rayform.Client(endpoint=url, token=token, cache_dir=Path(tmp, "list"))
            refs = client.slices.get(SLICE).manifest.blobs([*OBS, ACTION]).values()
            hashes = [(r.hash, r.size) for r in refs]
            for rnd in range(args.rounds):
                for name, _ in servers:  # interleaved: every server sees the same load
                    url, token = urls[name]
                    cache = Path(tmp, f"{rnd}-{name.replace(' ', '_')}")
                    rows[name]["cold"].append(_epoch(url, token, cache, args.workers))
                    rows[name]["warm"].append(_epoch(url, token, cache, args.workers))
                    latency[name].append(_one_by_one(url, token, hashes))
                    latency[name][-1]["pull_s"] = _pull_s(url, token, Path(f"{cache}-pull"))
                    print(f"round {rnd} {name}: {rows[name]} {latency[name][-1]}", file=sys.stderr)
    out: dict[str, Any] = {"blobs": len(hashes), "bytes": sum(s for _, s in hashes), "servers": {}}
    for name, _ in servers:
        cold, warm = rows[name]["cold"], rows[name]["warm"]
        out["servers"][name] = {
            "cold": cold,
            "warm": warm,
            "cold_over_warm_after5pct": statistics.median(
                c["samples_per_s"] / w["samples_per_s"] for c, w in zip(cold, warm, strict=True)
            ),
            "warm_epoch_over_cold_epoch": statistics.median(
                w["epoch_s"] / c["epoch_s"] for c, w in zip(cold, warm, strict=True)
            ),
            "one_by_one": latency[name],
        }
    out["cpus"] = os.cpu_count()
    out["load_avg_1m_at_end"] = round(os.getloadavg()[0], 2)
    out["python"] = platform.python_version()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    for name, row in out["servers"].items():
        lat = statistics.median(r["small_first_byte_ms"] for r in row["one_by_one"])
        whole = statistics.median(r["all_blobs_s"] for r in row["one_by_one"])
        pull = statistics.median(r["pull_s"] for r in row["one_by_one"])
        print(
            f"{name}: cold/warm {row['cold_over_warm_after5pct']:.2f} after 5 %, "
            f"{row['warm_epoch_over_cold_epoch']:.2f} whole epoch; small blob first byte "
            f"{lat:.1f} ms, all {len(hashes)} blobs one by one {whole:.2f} s, pull {pull:.2f} s"
        )


if __name__ == "__main__":
    main()
