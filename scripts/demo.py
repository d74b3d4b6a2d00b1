"""`make demo`: the main job, end to end, on one machine.

1. builds the demo slice into a local data root (``.demo/root``, once),
2. starts the server stub on a free loopback port with a random bearer token,
3. pulls the slice into a fresh cache with ``rayform pull`` (progress bar, verified),
4. runs the public docs' example verbatim (only the slice ID changed) and iterates a
   ``DataLoader`` over two epochs, printing what it did and how fast,
5. stops the server.
"""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

HERE = Path(__file__).resolve().parent.parent
DEMO = HERE / ".demo"
ROOT = DEMO / "root"
CACHE = DEMO / "cache"
SLICE = "slc_7c1e04aa"


def step(msg: str) -> None:
    print(f"\n== {msg}", flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> int:
    bindir = Path(sys.executable).parent
    step(f"1/4 demo slice {SLICE} in {ROOT.relative_to(HERE)}")
    if not (ROOT / "slices" / f"{SLICE}.json").exists():
        t0 = time.perf_counter()
        subprocess.run(
            [bindir / "rayform-server", "demo", "--root", ROOT, "--slice", SLICE], check=True
        )
        print(f"built in {time.perf_counter() - t0:.1f} s")
    else:
        print("already built (delete .demo/ to rebuild)")

    token = secrets.token_urlsafe(24)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    step(f"2/4 server stub on {url} (bearer token, random per run)")
    server = subprocess.Popen(
        [
            bindir / "rayform-server",
            "serve",
            "--root",
            ROOT,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            # One argument: a random token may start with "-", which argparse would take for
            # an option (1 run in 64 failed to start).
            f"--token={token}",
        ],
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(url + "/v1/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline or server.poll() is not None:
                print("server did not start", file=sys.stderr)
                return 1
            time.sleep(0.1)

        os.environ.update(RAYFORM_ENDPOINT=url, RAYFORM_TOKEN=token, RAYFORM_CACHE_DIR=str(CACHE))
        os.environ.pop("RAYFORM_OFFLINE", None)
        shutil.rmtree(CACHE, ignore_errors=True)
        step(f"3/4 rayform pull {SLICE} into a fresh cache ({CACHE.relative_to(HERE)})")
        subprocess.run(
            [
                bindir / "rayform",
                "pull",
                SLICE,
                "--streams",
                "cam0/rgb",
                "wrist/rgb",
                "joints/position",
                "joints/position_delta",
            ],
            check=True,
        )
    finally:
        server.terminate()
        server.wait(10)
    print("server stopped: training below runs offline from the cache")
    os.environ["RAYFORM_OFFLINE"] = "1"

    step("4/4 EpisodeDataset + DataLoader (the docs' example)")
    import torch
    from torch.utils.data import DataLoader

    import rayform

    torch.set_num_threads(1)
    client = rayform.Client()
    slice_ = client.slices.get(SLICE)
    print(slice_)
    dataset = rayform.torch.EpisodeDataset(
        slice_,
        obs=["cam0/rgb", "wrist/rgb", "joints/position"],
        action="joints/position_delta",
        fps=15,
        horizon=16,
        frame="ros",
    )
    workers = min(8, os.cpu_count() or 1)
    sampler = rayform.torch.EpisodeSampler(dataset, shuffle=True)
    loader = DataLoader(
        dataset,
        batch_size=64,
        num_workers=workers,
        sampler=sampler,
        persistent_workers=True,
        collate_fn=rayform.torch.collate,
    )
    print(
        f"{len(dataset)} samples at 15 Hz over {len(slice_.segments)} episodes; "
        f"DataLoader(batch_size=64, num_workers={workers}, sampler=EpisodeSampler(shuffle=True), "
        "persistent_workers=True, collate_fn=rayform.torch.collate)"
    )
    for epoch in range(2):
        dataset.set_epoch(epoch)
        t0 = time.perf_counter()
        n = 0
        first = None
        for batch in loader:
            if first is None:
                first = time.perf_counter() - t0
                shapes = {k: tuple(v.shape) for k, v in batch.items() if hasattr(v, "shape")}
            n += batch["action"].shape[0]
        dt = time.perf_counter() - t0
        print(
            f"epoch {epoch}: {n} samples in {dt:.1f} s = {n / dt:.0f} samples/s "
            f"(first batch after {first:.2f} s)"
        )
    print("batch shapes:", shapes)
    print("\ndemo done: slice served, pulled, verified, and trained on offline.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
