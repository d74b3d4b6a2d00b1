"""The benchmark's data: generate once into ``.bench/``, ingest, serve, pull into a warm cache.

Everything is reused when already there (delete ``.bench/`` to start over):

* ``.bench/lerobot-eE-fF/``: the LeRobot v3.0 dataset (``bench/make_lerobot_data.py`` in the
  peer venv);
* ``.bench/root-eE-fF/``: a rayform data root with slice :data:`SLICE_ID`
  (``rayform-server ingest lerobot``);
* ``.bench/cache-eE-fF/``: the client cache, filled by ``rayform pull`` from a real
  ``rayform-server serve`` on loopback.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / ".bench"
SLICE_ID = "slc_be4c0001"
VENV_BIN = Path(sys.executable).parent

__all__ = [
    "BENCH",
    "REPO",
    "SLICE_ID",
    "Workload",
    "open_slice",
    "peer_python",
    "prepare",
    "run_lerobot_row",
]


@dataclass(frozen=True)
class Workload:
    """Episodes x frames at ``fps`` Hz, two cameras ``height`` x ``width``."""

    episodes: int
    frames: int
    fps: int = 50
    height: int = 480
    width: int = 640

    @property
    def tag(self) -> str:
        return f"e{self.episodes}-f{self.frames}"

    @property
    def lerobot_dir(self) -> Path:
        return BENCH / f"lerobot-{self.tag}"

    @property
    def root(self) -> Path:
        return BENCH / f"root-{self.tag}"

    @property
    def cache(self) -> Path:
        return BENCH / f"cache-{self.tag}"


def manifest_of(store: Any, slice_id: str) -> str:
    """The manifest hash a data root's ``slice_id`` names (``store``: a
    ``rayform_server.store.Store``); a clear error where the root lacks the slice."""
    ref = store.get_slice(slice_id)
    if ref is None:
        raise SystemExit(f"[bench] slice {slice_id} is not in the data root {store.root}")
    return str(ref["manifest"])


def peer_python() -> str:
    """The LeRobot peer venv's python (built by ``scripts/peer_lerobot.sh`` when missing)."""
    out = subprocess.run(
        ["bash", str(REPO / "scripts" / "peer_lerobot.sh")],
        check=True,
        capture_output=True,
        text=True,
    )
    return out.stdout.strip().splitlines()[-1]


def peer_env() -> dict[str, str]:
    return {
        "HF_HUB_OFFLINE": "1",
        "PATH": "/usr/bin:/bin",
        "OMP_NUM_THREADS": "1",
        "HOME": os.environ.get("HOME", "/root"),
    }


def run_lerobot_row(
    w: Workload,
    out: Path,
    *,
    batches: int,
    runs: int,
    warmup: int,
    python: str | None = None,
    extra: tuple[str, ...] = (),
    dataset: Path | None = None,
) -> dict[str, Any]:
    """Run ``bench/_lerobot_row.py`` over ``w``'s LeRobot dataset (or ``dataset``) in the peer
    venv (or the interpreter ``python``), with ``extra`` arguments; returns the JSON it writes
    to ``out``."""
    subprocess.run(
        [
            python or peer_python(),
            str(REPO / "bench" / "_lerobot_row.py"),
            str(dataset or w.lerobot_dir),
            str(out),
            "--batches",
            str(batches),
            "--runs",
            str(runs),
            "--warmup",
            str(warmup),
            "--horizon",
            "16",
            *extra,
        ],
        check=True,
        env=peer_env(),
        stderr=subprocess.DEVNULL,
    )
    return dict(json.loads(out.read_text()))


def prepare(w: Workload, log: Any = print, *, python: str | None = None) -> dict[str, float]:
    """Make sure the dataset and the ingested data root exist; returns the seconds spent.

    ``python`` writes the dataset (default: the peer venv's, :func:`peer_python`)."""
    spent: dict[str, float] = {}
    if not (w.lerobot_dir / "meta" / "episodes").is_dir():
        tmp = w.lerobot_dir.with_name(w.lerobot_dir.name + ".partial")
        subprocess.run(["rm", "-rf", str(tmp)], check=True)
        log(f"[bench] writing the LeRobot dataset {w.lerobot_dir} (once; minutes) ...")
        t = time.perf_counter()
        subprocess.run(
            [
                python or peer_python(),
                str(REPO / "bench" / "make_lerobot_data.py"),
                str(tmp),
                "--episodes",
                str(w.episodes),
                "--frames",
                str(w.frames),
                "--fps",
                str(w.fps),
                "--height",
                str(w.height),
                "--width",
                str(w.width),
            ],
            check=True,
            env=peer_env(),
        )
        tmp.rename(w.lerobot_dir)
        spent["lerobot_write_s"] = time.perf_counter() - t
    if not (w.root / "slices").is_dir() or not any((w.root / "slices").iterdir()):
        log(f"[bench] ingesting into {w.root} ...")
        t = time.perf_counter()
        subprocess.run(
            [
                str(VENV_BIN / "rayform-server"),
                "ingest",
                "lerobot",
                "--root",
                str(w.root),
                "--slice",
                SLICE_ID,
                "--quiet",
                str(w.lerobot_dir),
            ],
            check=True,
        )
        spent["ingest_s"] = time.perf_counter() - t
    return spent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _pull(w: Workload, log: Any) -> float:
    """Serve the data root on loopback and ``rayform pull`` the slice into ``w.cache``."""
    token, port = secrets.token_hex(16), _free_port()
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "rayform_server",
            "serve",
            "--root",
            str(w.root),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--token",
            token,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline or server.poll() is not None:
                    raise RuntimeError("rayform-server did not start") from None
                time.sleep(0.2)
        env = {
            **os.environ,
            "RAYFORM_ENDPOINT": f"http://127.0.0.1:{port}",
            "RAYFORM_TOKEN": token,
            "RAYFORM_CACHE_DIR": str(w.cache),
        }
        t = time.perf_counter()
        subprocess.run(
            [str(VENV_BIN / "rayform"), "pull", "--quiet", SLICE_ID], check=True, env=env
        )
        return time.perf_counter() - t
    finally:
        server.terminate()
        server.wait(timeout=30)


class StoreClient:
    """Stand-in client reading blobs straight from the data root (when the real one fails)."""

    def __init__(self, root: Path) -> None:
        from rayform_server.store import Store

        self.store = Store(root)
        self.cache_dir = None

    #: Blobs stay in the store: no cache to bound.
    cache_limit = None

    def ensure_blob(self, slice_id: str, ref: Any) -> Path:
        return self.store.blob_path(ref.hash)

    def would_fetch(self, ref: Any) -> bool:
        return False  # every blob of the store is already local

    def pull(
        self, slice_id: Any, streams: Any = None, jobs: int = 8, progress: bool = False
    ) -> None:
        """Nothing to do: every blob of the store is already local."""


def open_slice(w: Workload, log: Any = print) -> tuple[Any, dict[str, Any]]:
    """The benchmark slice through the real client in offline mode over a warm cache.

    Falls back to a stand-in client on the data root if the real client cannot pull or open
    it (the report says which was used).
    """
    from rayform.slice import Slice

    try:
        import rayform

        pull_s = _pull(w, log)
        client = rayform.Client(cache_dir=w.cache, offline=True)
        slice_ = client.slices.get(SLICE_ID)
        return slice_, {
            "client": "rayform.Client (offline, warm cache after rayform pull)",
            "pull_s": pull_s,
        }
    except Exception as exc:  # noqa: BLE001 - any failure of the client under construction
        log(f"[bench] real client unavailable ({type(exc).__name__}: {exc}); using the data root")
        from rayform_server.store import Store

        store = Store(w.root)
        digest = manifest_of(store, SLICE_ID)
        return Slice(SLICE_ID, digest, store.load_manifest(digest), StoreClient(w.root)), {
            "client": f"stand-in (data root; real client failed: {type(exc).__name__})"
        }
