"""The same episodes from the same object store: Rayform's cache against Lance's ranged reads.

Lance's case for training straight from object storage is that a shuffled epoch read from S3
runs nearly as fast as one from a local disk (``lerobot-lancedb`` reports 0.95 for ALOHA).
Here both read the loader benchmark's episodes (``bench/_data.py``: 4 x 400 frames, two
480x640 cameras at 50 Hz, written by LeRobot) from one SeaweedFS (``weed mini``) behind one
throttled link (``bench/_throttle.py``, shaped like a cloud object store: 100 MB/s, 20 ms per
request; the link is shared, so the two sides never run at once):

* **Rayform**: the stub serves the ingested root with its blobs in the bucket (its 307s point
  at the store through the link); ``EpisodeDataset`` with ``EpisodeSampler``,
  ``rayform.torch.collate`` and 2 workers reads one epoch from an empty cache ("cold") and one
  from a cache that holds the slice ("warm").
* **Lance**: ``lerobot-lance-convert``'s three tables, uploaded to the same bucket;
  ``LanceDBDataset`` in the LeRobot 0.6.1 peer venv (``scripts/peer_lance.sh``), its README's
  loader (2 workers, ``lance_mp_context()``, ``shuffle=True``, default collate, uint8 frames),
  reads one epoch from ``s3://`` ("remote") and one from the local tables ("local").

Each row is one epoch of a fresh loader, timed after its first batch (``_timing.time_epoch``):
what differs most at the start (a forkserver that imports torch, the first requests) is
apart. The rows are interleaved ``--rounds`` times; the ratio of a side is its remote epoch
over its local one in the same round.

    python -m bench.remote --rounds 3 --out bench/results/remote-lance.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench._data import BENCH, SLICE_ID, Workload, peer_env, prepare
from bench._lance import convert
from bench.resize import BENCH_EPISODES
from bench.streaming import MB, Setup

REPO = Path(__file__).resolve().parent.parent

#: Where the Lance tables go in the store's bucket.
LANCE_PREFIX = "lance"


def _upload(setup: Setup, tables: Path) -> str:
    """Copy the Lance layout into the store's bucket (straight, not through the link);
    returns its ``s3://`` URI."""
    from support.seaweed import BUCKET

    s3 = setup.weed.s3_client()
    prefix = f"{LANCE_PREFIX}/{tables.name}"
    for path in sorted(tables.rglob("*")):
        if path.is_file():
            s3.upload_file(str(path), BUCKET, f"{prefix}/{path.relative_to(tables).as_posix()}")
    return f"s3://{BUCKET}/{prefix}"


def _rayform_epoch(setup: Setup, cache: Path) -> dict[str, Any]:
    from torch.utils.data import DataLoader

    import rayform
    from bench._timing import time_epoch
    from rayform.torch import EpisodeDataset, EpisodeSampler

    def make() -> DataLoader:
        client = rayform.Client(endpoint=setup.url, token=setup.token, cache_dir=cache)
        ds = EpisodeDataset(
            client.slices.get(SLICE_ID),
            obs=list(BENCH_EPISODES.obs),
            action=BENCH_EPISODES.action,
            fps=BENCH_EPISODES.fps,
            horizon=16,
        )
        return DataLoader(
            ds,
            sampler=EpisodeSampler(ds),
            batch_size=32,
            num_workers=2,
            collate_fn=rayform.torch.collate,
            persistent_workers=True,  # alive at the epoch's end, so their CPU is counted
        )

    return time_epoch(make, batch_size_of=lambda b: len(b["t_ns"]), exclude_cpu_s=setup.link_cpu_s)


def _lance_epoch(
    python: str, tables: Path, out: Path, remote: str | None, options: dict[str, str]
) -> dict[str, Any]:
    env = {**peer_env(), "LANCE_STORAGE_OPTIONS": json.dumps(options)}
    cmd = [python, str(REPO / "bench" / "_lerobot_row.py"), str(tables), str(out)]
    cmd += ["--lance", "--uint8", "--epoch", "--horizon", "16"]
    cmd += ["--remote", remote] if remote else []
    subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return dict(json.loads(out.read_text()))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds of the four rows")
    p.add_argument("--latency-ms", type=float, default=20.0, help="added to every request")
    p.add_argument("--rate-mb", type=float, default=100.0, help="the link's MB/s (10^6 B/s)")
    p.add_argument("--lance-python", default=None, help="the peer venv's python (default: built)")
    p.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "remote-lance.json")
    args = p.parse_args()

    w = Workload(4, 400)
    prepare(w, print)
    python = (
        args.lance_python
        or subprocess.run(
            ["bash", str(REPO / "scripts" / "peer_lance.sh")],
            check=True,
            capture_output=True,
            text=True,
        )
        .stdout.strip()
        .splitlines()[-1]
    )
    tables = convert(w, python)
    work = Path(tempfile.mkdtemp(prefix="remote-", dir=BENCH))
    setup = Setup(w.root, work / "setup")
    try:
        lance_uri = _upload(setup, tables)
        store_port = setup.link.forward(int(setup.weed.endpoint.rsplit(":", 1)[1]))
        options = {
            "aws_access_key_id": setup.weed.env["AWS_ACCESS_KEY_ID"],
            "aws_secret_access_key": setup.weed.env["AWS_SECRET_ACCESS_KEY"],
            "aws_region": setup.weed.env["AWS_REGION"],
            "aws_endpoint": f"http://127.0.0.1:{store_port}",
            "allow_http": "true",
        }
        setup.link.set_rate(int(args.rate_mb * MB))
        setup.link.latency_s = args.latency_ms / 1000
        warm = work / "warm-cache"
        print("[remote] filling the warm cache (one untimed epoch)", flush=True)
        _rayform_epoch(setup, warm)
        rows: dict[str, list[dict[str, Any]]] = {}
        for r in range(args.rounds):
            order = ["rayform_warm", "rayform_cold", "lance_local", "lance_remote"]
            for row in order if r % 2 == 0 else order[::-1]:
                before = setup.cpu_s()["store"]
                if row == "rayform_warm":
                    res = _rayform_epoch(setup, warm)
                elif row == "rayform_cold":
                    res = _rayform_epoch(setup, work / f"cold-{r}")
                    shutil.rmtree(work / f"cold-{r}")
                else:
                    remote = lance_uri if row == "lance_remote" else None
                    res = _lance_epoch(python, tables, work / f"{row}.json", remote, options)
                res["store_cpu_s"] = setup.cpu_s()["store"] - before
                rows.setdefault(row, []).append(res)
                print(
                    f"[remote] round {r + 1}/{args.rounds} {row}: "
                    f"{res['samples_per_s']:.1f} samples/s after the first batch "
                    f"(first batch {res['first_batch_s']:.1f} s, epoch {res['epoch_s']:.1f} s)",
                    flush=True,
                )
    finally:
        setup.close()
        shutil.rmtree(work, ignore_errors=True)

    def ratios(remote: str, local: str) -> list[float]:
        return [
            a["samples_per_s"] / b["samples_per_s"]
            for a, b in zip(rows[remote], rows[local], strict=True)
        ]

    doc = {
        "benchmark": "remote",
        "episodes": f"{w.episodes} x {w.frames} frames, 2 cameras {w.height}x{w.width}, {w.fps} Hz",
        "link": {"rate_mb_s": args.rate_mb, "latency_ms": args.latency_ms},
        "rows": rows,
        "medians": {
            row: {
                k: statistics.median(x[k] for x in runs)
                for k in ("samples_per_s", "cpu_s_per_sample", "first_batch_s", "store_cpu_s")
            }
            for row, runs in rows.items()
        },
        "rayform_cold_over_warm": ratios("rayform_cold", "rayform_warm"),
        "lance_remote_over_local": ratios("lance_remote", "lance_local"),
        "cpus": os.cpu_count(),
        "load_avg_1m_at_end": os.getloadavg()[0],
        "python": platform.python_version(),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    print(
        json.dumps(
            {k: doc[k] for k in ("medians", "rayform_cold_over_warm", "lance_remote_over_local")},
            indent=1,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
