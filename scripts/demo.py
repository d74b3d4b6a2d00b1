"""`make demo`: the main job, end to end, on one machine.

1. builds the demo slice into a local data root (``.demo/root``, once),
2. starts the server stub on a free loopback port with a random bearer token,
3. pulls the slice into a fresh cache with ``rayform pull`` (progress bar, verified),
4. stops the server, writes the README's training example to ``.demo/train.py`` (only the
   slice ID filled in) and runs it offline from the cache: a ``DataLoader`` over two epochs,
5. prints what to run next.

``--demo-dir DIR --small`` builds the small demo (4 short episodes) elsewhere, for a test.
"""

from __future__ import annotations

import argparse
import os
import secrets
import shlex
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

HERE = Path(__file__).resolve().parent.parent
SLICE = "slc_7c1e04aa"
STREAMS = ["cam0/rgb", "wrist/rgb", "joints/position", "joints/position_delta"]

#: The README's "Training with PyTorch" example, run as it is written, with a line per epoch.
TRAIN_PY = """\
\"\"\"The README's training example on the demo slice, written by `make demo`.

Offline from the demo's cache: {command}
\"\"\"

import os
import time

import rayform
from torch.utils.data import DataLoader

client = rayform.Client()                      # RAYFORM_ENDPOINT / RAYFORM_TOKEN / RAYFORM_CACHE_DIR
slice_ = client.slices.get("{slice_id}")
dataset = rayform.torch.EpisodeDataset(
    slice_,
    obs=["cam0/rgb", "wrist/rgb", "joints/position"],
    action="joints/position_delta",
    fps=15,            # samples on a 15 Hz grid, whatever the streams' own rates
    horizon=16,        # action chunk length
    frame="ros",       # convention of Cartesian quantities in the sample
)
print(dataset.uri)     # log it with the run: EpisodeDataset.from_uri(uri) rebuilds these samples
sampler = rayform.torch.EpisodeSampler(dataset, shuffle=True)  # shards by episode under torchrun
workers = min(8, os.cpu_count() or 1)  # more workers than CPUs compete (and PyTorch warns)
loader = DataLoader(dataset, batch_size=64, num_workers=workers, sampler=sampler, persistent_workers=True,
                    collate_fn=rayform.torch.collate)  # default_collate's batches, shared memory reused
print(f"{{len(dataset)}} samples at 15 Hz over {{len(slice_.segments)}} episodes, "
      f"{{workers}} DataLoader workers")
for epoch in range(2):
    dataset.set_epoch(epoch)
    t0 = time.perf_counter()
    n = 0
    for batch in loader:
        n += batch["action"].shape[0]   # your training step goes here
    dt = time.perf_counter() - t0
    print(f"epoch {{epoch}}: {{n}} samples in {{dt:.1f}} s = {{n / dt:.0f}} samples/s")
print("batch shapes:", {{k: tuple(v.shape) for k, v in batch.items() if hasattr(v, "shape")}})
"""


def shown_path(path: Path) -> str:
    """``path`` relative to the working directory where it lies below it (shorter to type)."""
    # abspath, not resolve: the venv's python is a symlink whose target is not the venv's.
    absolute = Path(os.path.abspath(path))
    try:
        return str(absolute.relative_to(os.path.abspath(Path.cwd())))
    except ValueError:
        return str(absolute)


def train_command(cache: Path, train: Path) -> str:
    """The shell command that runs ``train`` offline from ``cache`` with this interpreter."""
    python = Path(sys.executable)
    return (
        f"RAYFORM_OFFLINE=1 RAYFORM_CACHE_DIR={shlex.quote(shown_path(cache))} "
        f"{shlex.quote(shown_path(python))} {shlex.quote(shown_path(train))}"
    )


def step(msg: str) -> None:
    print(f"\n== {msg}", flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Rayform's demo: build, serve, pull, train.")
    parser.add_argument(
        "--demo-dir", type=Path, default=HERE / ".demo", help="where it all goes (default .demo)"
    )
    parser.add_argument("--small", action="store_true", help="4 short episodes (for tests)")
    args = parser.parse_args(argv)
    demo = Path(os.path.abspath(args.demo_dir))
    root, cache, train = demo / "root", demo / "cache", demo / "train.py"
    bindir = Path(sys.executable).parent

    step(f"1/4 demo slice {SLICE} in {shown_path(root)}")
    if not (root / "slices" / f"{SLICE}.json").exists():
        t0 = time.perf_counter()
        small = ["--small"] if args.small else []
        subprocess.run(
            [bindir / "rayform-server", "demo", "--root", root, "--slice", SLICE, *small],
            check=True,
        )
        print(f"built in {time.perf_counter() - t0:.1f} s")
    else:
        print(f"already built (delete {shown_path(demo)}/ to rebuild)")

    token = secrets.token_urlsafe(24)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    step(f"2/4 server stub on {url} (bearer token, random per run)")
    server = subprocess.Popen(
        [
            bindir / "rayform-server",
            "serve",
            "--root",
            root,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            # One argument: a random token may start with "-", which argparse would take for
            # an option (1 run in 64 failed to start).
            f"--token={token}",
        ],
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAYFORM_")}
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

        shutil.rmtree(cache, ignore_errors=True)
        step(f"3/4 rayform pull {SLICE} into a fresh cache ({shown_path(cache)})")
        subprocess.run(
            [bindir / "rayform", "pull", SLICE, "--streams", ",".join(STREAMS)],
            check=True,
            env={
                **env,
                "RAYFORM_ENDPOINT": url,
                "RAYFORM_TOKEN": token,
                "RAYFORM_CACHE_DIR": str(cache),
            },
        )
    finally:
        server.terminate()
        server.wait(10)
    print("server stopped: training below runs offline from the cache")

    command = train_command(cache, train)
    train.write_text(TRAIN_PY.format(command=command, slice_id=SLICE))
    step(f"4/4 the README's example, written to {shown_path(train)}: {command}")
    done = subprocess.run(["bash", "-c", command], env=env)
    if done.returncode != 0:
        return done.returncode
    print("\ndemo done: slice served, pulled, verified, and trained on offline.")
    print(
        "\nnext:\n"
        f"  {command}\n"
        "      the README's example again, offline from the demo's cache; edit it to train\n"
        f"  {shown_path(bindir / 'rayform')} slices show {SLICE} --offline --cache-dir "
        f"{shlex.quote(shown_path(cache))}\n"
        "      the command line (or `source "
        f"{shown_path(bindir / 'activate')}` to put rayform on your PATH)\n"
        f"  {shown_path(bindir / 'rayform')} docs\n"
        "      the guides (`rayform docs dataset`: what a sample holds; `cache`, `cli`, ...)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
