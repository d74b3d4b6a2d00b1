"""Benchmark: `rayform pull` into an empty cache versus parallel `curl` of the same blob URLs.

Both run against the same server stub on loopback, with the same number of parallel jobs, in
one run. `rayform pull` verifies every byte (BLAKE3), fsyncs and renames each blob; curl just
writes the bytes. The ratio is rayform's wall time over curl's (lower is better, 1.0 = parity).

Usage::

    python bench/bench_pull.py [--root DIR] [--jobs 8] [--repeats 3]

Without ``--root`` the full (non-small) demo is built into a temporary directory first.
Writes ``bench/results/pull.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import secrets
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

SLICE = "slc_7c1e04aa"
HERE = Path(__file__).resolve().parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_server(root: Path, token: str) -> tuple[subprocess.Popen[bytes], str]:
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen([sys.executable, "-m", "rayform_server", "serve", "--root", str(root),
                             "--host", "127.0.0.1", "--port", str(port), "--token", token],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(300):
        try:
            if httpx.get(url + "/v1/health", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            time.sleep(0.1)
    proc.kill()
    raise SystemExit("server stub did not start")


def _ensure_curl() -> str:
    curl = shutil.which("curl")
    if curl is None:
        subprocess.run(["apt-get", "install", "-y", "-q", "curl"], check=True)
        curl = shutil.which("curl")
    assert curl is not None
    return curl


def _time_rayform(url: str, token: str, jobs: int, work: Path) -> float:
    cache = work / "rayform-cache"
    shutil.rmtree(cache, ignore_errors=True)
    env = {**os.environ, "RAYFORM_TOKEN": token}
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "rayform", "pull", SLICE, "--endpoint", url,
                    "--cache-dir", str(cache), "--jobs", str(jobs), "--quiet"], env=env, check=True)
    return time.perf_counter() - t0


def _time_curl(curl: str, urls: list[str], header_file: Path, jobs: int, work: Path) -> float:
    out = work / "curl-out"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir()
    listing = work / "urls.txt"
    listing.write_text("".join(f"{u}\n" for u in urls))
    # Each curl writes one blob to a file named after its hash, like the cache does.
    cmd = (f"xargs -P {jobs} -n 1 -I{{}} sh -c '{curl} -sSf -H @{header_file} "
           f"-o {out}/$(basename {{}}) {{}}' < {listing}")
    t0 = time.perf_counter()
    subprocess.run(["bash", "-c", cmd], check=True)
    return time.perf_counter() - t0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--root", type=Path, help="an existing data root with the demo slice")
    p.add_argument("--jobs", type=int, default=8)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", type=Path, default=HERE / "results" / "pull.json")
    args = p.parse_args()

    curl = _ensure_curl()
    token = secrets.token_urlsafe(24)
    with tempfile.TemporaryDirectory(prefix="rayform-bench-") as tmp:
        work = Path(tmp)
        root = args.root
        if root is None:
            from rayform_server.demo import build_demo

            root = work / "root"
            t0 = time.perf_counter()
            build_demo(root, slice_id=SLICE, small=False, jobs=os.cpu_count() or 1)
            print(f"built demo root in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
        proc, url = _start_server(root, token)
        try:
            header_file = work / "auth-header"
            header_file.write_text(f"Authorization: Bearer {token}\n")
            header_file.chmod(0o600)
            from rayform.manifest import Manifest

            headers = {"Authorization": f"Bearer {token}"}
            data = httpx.get(f"{url}/v1/slices/{SLICE}/manifest", headers=headers).content
            blobs = Manifest.from_bytes(data).blobs()
            urls = [f"{url}/v1/slices/{SLICE}/blobs/{h}" for h in blobs]
            total = sum(b.size for b in blobs.values())
            rayform_s, curl_s = [], []
            for _ in range(args.repeats):  # interleaved so both see the same machine load
                curl_s.append(_time_curl(curl, urls, header_file, args.jobs, work))
                rayform_s.append(_time_rayform(url, token, args.jobs, work))
        finally:
            proc.terminate()
            proc.wait(10)
    r_med, c_med = statistics.median(rayform_s), statistics.median(curl_s)
    result = {
        "benchmark": "pull",
        "slice": SLICE,
        "blobs": len(urls),
        "bytes": total,
        "jobs": args.jobs,
        "repeats": args.repeats,
        "rayform_pull_s": [round(x, 3) for x in rayform_s],
        "curl_parallel_s": [round(x, 3) for x in curl_s],
        "rayform_median_s": round(r_med, 3),
        "curl_median_s": round(c_med, 3),
        "ratio_rayform_over_curl": round(r_med / c_med, 3),
        "rayform_MiB_per_s": round(total / r_med / 2**20, 2),
        "curl_MiB_per_s": round(total / c_med / 2**20, 2),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "note": "wall time incl. process start; rayform verifies BLAKE3, fsyncs and renames "
                "every blob; curl only writes bytes",
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    print(f"rayform pull / parallel curl = {result['ratio_rayform_over_curl']:.2f}x "
          f"({len(urls)} blobs, {total / 2**20:.1f} MiB, {args.jobs} jobs)")


if __name__ == "__main__":
    main()
