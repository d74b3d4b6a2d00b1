"""Both ways with LeRobot, measured: the export's throughput and size, and ACT's training step
with the loader from a slice against ``LeRobotDataset`` on the same episodes.

1. **Export** (this venv): the full demo slice (``rayform-server demo``: 20 episodes of 6-8 s,
   two 240x320 cameras at 30 Hz, stored all-intra) exported at 30 fps with both cameras, the
   joints as ``observation.state`` and their deltas as ``action``, 5 episodes per file: frames
   copied (the default), re-encoded (``reencode=True``) in one process and with ``jobs=2``. Rows per second, camera
   frames per second, and the dataset's bytes against the exported streams' bytes in the slice.
2. **ACT step time** (the LeRobot peer venv, ``bench/_lerobot_act.py``): LeRobot 0.4.4's ACT
   (ResNet-18 backbone, 30-step chunks, batch 8) on ``cam0/rgb`` + joints, fed by
   ``EpisodeDataset`` + ``LeRobotCollate`` from the slice, and by ``LeRobotDataset`` on a
   re-encoded export of the same episodes and streams (H.264, a keyframe every 2 frames, as LeRobot's own
   AV1 files), both ``num_workers=2``, in alternating rounds in one process: seconds per step
   and the share of it spent waiting for the loader.

Usage: ``.venv/bin/python -m bench.lerobot_export [--rounds 2] [--steps 20] [--out FILE]``
(writes ``bench/results/lerobot_export.json``; not part of ``make bench``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

from bench._data import BENCH, REPO, StoreClient, peer_env, peer_python
from bench._measure import loadavg, log
from bench._serve import serving

SLICE = "slc_7c1e04aa"
STREAMS = {
    "cam0/rgb": "observation.images.cam0",
    "wrist/rgb": "observation.images.wrist",
    "joints/position": "observation.state",
    "joints/position_delta": "action",
}


def _root() -> Path:
    root = BENCH / "lerobot-demo"
    if not (root / "slices").is_dir():
        from rayform_server.demo import build_demo

        log(f"building the demo root in {root} ...")
        build_demo(root, slice_id=SLICE)
    return root


def _slice(root: Path) -> Any:
    from rayform.slice import Slice
    from rayform_server.store import Store

    store = Store(root)
    digest = store.get_slice(SLICE)["manifest"]  # type: ignore[index]
    return Slice(SLICE, digest, store.load_manifest(digest), StoreClient(root))


def export_rows(root: Path, out: Path) -> dict[str, Any]:
    from rayform.torch.lerobot import export_lerobot

    slice_ = _slice(root)
    source = slice_.stream_nbytes(list(STREAMS))
    rows = {}
    runs: list[tuple[str, dict[str, Any]]] = [
        ("copied", {}),
        ("reencoded", {"reencode": True}),
        ("reencoded_jobs2", {"reencode": True, "jobs": 2}),
    ]
    for name, kw in runs:
        target = out / name
        shutil.rmtree(target, ignore_errors=True)
        t = time.perf_counter()
        report = export_lerobot(slice_, target, streams=STREAMS, fps=30, episodes_per_file=5, **kw)
        seconds = time.perf_counter() - t
        rows[name] = {
            "seconds": round(seconds, 2),
            "rows": report.frames,
            "rows_per_s": round(report.frames / seconds, 1),
            "camera_frames_per_s": round(2 * report.frames / seconds, 1),
            "bytes": report.nbytes,
            "bytes_vs_slice": round(report.nbytes / source, 3),
            "loadavg": loadavg(),
        }
        log(f"export {name}: {rows[name]}")
    return {"source_bytes": source, "episodes": len(slice_.segments), "rows": rows}


def act_rows(root: Path, exported: Path, rounds: int, steps: int, out: Path) -> dict[str, Any]:
    with serving(root) as (url, token):
        env = {
            **peer_env(),
            "RAYFORM_ENDPOINT": url,
            "RAYFORM_TOKEN": token,
            "RAYFORM_CACHE_DIR": str(BENCH / "lerobot-cache"),
            "PYTHONPATH": str(REPO / "sdk"),
            "HF_HOME": str(BENCH / "hf-home"),
        }
        result = out / "act.json"
        subprocess.run(
            [
                peer_python(),
                str(REPO / "bench" / "_lerobot_act.py"),
                SLICE,
                str(exported),
                str(result),
                "--rounds",
                str(rounds),
                "--steps",
                str(steps),
            ],
            check=True,
            env=env,
        )
        return dict(json.loads(result.read_text()))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--out", default=str(REPO / "bench" / "results" / "lerobot_export.json"))
    p.add_argument("--skip-act", action="store_true")
    args = p.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    root = _root()
    work = BENCH / "lerobot-export"
    work.mkdir(parents=True, exist_ok=True)
    doc: dict[str, Any] = {"cpus": os.cpu_count(), "export": export_rows(root, work)}
    if not args.skip_act:
        # LeRobotDataset decodes every camera of a dataset: the ACT comparison's has cam0 only.
        from rayform.torch.lerobot import export_lerobot

        act_ds = work / "act"
        shutil.rmtree(act_ds, ignore_errors=True)
        export_lerobot(
            _slice(root),
            act_ds,
            streams={k: v for k, v in STREAMS.items() if k != "wrist/rgb"},
            fps=30,
            reencode=True,
        )
        doc["act"] = act_rows(root, act_ds, args.rounds, args.steps, work)
    elif Path(args.out).is_file():  # keep the last run's ACT rows
        doc["act"] = json.loads(Path(args.out).read_text()).get("act")
    Path(args.out).write_text(json.dumps(doc, indent=2) + "\n")
    log(json.dumps(doc, indent=2))


if __name__ == "__main__":
    main()
