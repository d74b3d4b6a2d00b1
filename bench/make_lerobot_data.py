"""Write the benchmark's LeRobot v3.0 dataset with LeRobot's own writer (runs in the PEER venv).

Usage (``bench/run_all.py`` calls it; it needs the ``lerobot`` package, so run it with the
peer environment's python from ``scripts/peer_lerobot.sh``)::

    .peer-venv/bin/python bench/make_lerobot_data.py OUT_DIR --episodes 20 --frames 400 \
        --fps 50 --height 480 --width 640

Frames are rendered by the demo's procedural scene (``rayform_server/_demo_scene.py``, loaded
by file path so nothing else of rayform is imported here): an overhead camera and a wrist
camera over a textured table, two 7-joint arms moving smoothly (a few rad/s), a box that is
picked up halfway through. ``observation.state`` is the 14-D joint vector (rad) at each frame,
``action`` the commanded joints one frame later. Everything is seeded: the same arguments give
the same frames and values. The dataset is written with ``LeRobotDataset.create``,
``add_frame``, ``save_episode`` and ``finalize`` (LeRobot's default AV1 encoding).
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import time
from pathlib import Path

import numpy as np

_SCENE = Path(__file__).resolve().parents[1] / "server_stub" / "rayform_server" / "_demo_scene.py"


def _load_scene():  # noqa: ANN202
    spec = importlib.util.spec_from_file_location("_bench_demo_scene", _SCENE)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look the module up by name
    spec.loader.exec_module(module)
    return module


def _trajectory(
    rng: np.random.Generator, n: int, fps: float, scene
) -> tuple[np.ndarray, np.ndarray]:  # noqa: ANN001
    """Joint angles ``(n + 1, 14)`` (rad) and box poses ``(n + 1, 4)`` for one episode."""
    t = np.arange(n + 1) / fps
    q = np.zeros((n + 1, 14))
    for arm, base in enumerate(scene.ARM_BASES):
        # fingertip circling over the table at a few cm/s .. tens of cm/s, tool pointing down
        cx, cy = 0.38 + rng.uniform(-0.04, 0.04), base[1] * 0.5
        r, w, ph = rng.uniform(0.06, 0.12), rng.uniform(0.5, 1.2), rng.uniform(0, 2 * np.pi)
        z = 0.10 + 0.06 * np.sin(2 * np.pi * 0.3 * t + ph)
        tips = np.stack([cx + r * np.cos(w * t + ph), cy + r * np.sin(w * t + ph), z], axis=1)
        for i, tip in enumerate(tips):
            a = scene.ik_down(tip, base)
            q[i, 7 * arm : 7 * arm + 7] = [
                a[0],
                a[1],
                a[2],
                0.0,
                a[3],
                0.3 * np.sin(w * t[i]),
                0.5 + 0.5 * np.sin(0.7 * t[i] + ph),
            ]
    box = np.zeros((n + 1, 4))
    box[:, :2] = [0.42, 0.2]
    box[:, 3] = rng.uniform(-0.5, 0.5)
    grab = (n + 1) // 2
    tip = scene.fk(q[grab:, :7], scene.ARM_BASES[0])["tip"]
    box[grab:, :2] = tip[:, :2]
    box[grab:, 2] = np.maximum(0.0, tip[:, 2] - 0.1)
    return q, box


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path, help="dataset directory to create (must not exist)")
    ap.add_argument("--episodes", type=int, default=20)
    ap.add_argument("--frames", type=int, default=400, help="frames per episode")
    ap.add_argument("--fps", type=int, default=50)
    ap.add_argument("--height", type=int, default=480)
    ap.add_argument("--width", type=int, default=640)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)

    import torch
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    torch.set_num_threads(1)
    scene_mod = _load_scene()
    h, w = args.height, args.width
    names = [f"{side}_{j}" for side in ("left", "right") for j in range(7)]
    cam = {"dtype": "video", "shape": (h, w, 3), "names": ["height", "width", "channels"]}
    features = {
        "observation.images.cam0": cam,
        "observation.images.wrist": cam,
        "observation.state": {"dtype": "float32", "shape": (14,), "names": names},
        "action": {"dtype": "float32", "shape": (14,), "names": names},
    }
    t0 = time.perf_counter()
    ds = LeRobotDataset.create(
        "rayform/bench", fps=args.fps, features=features, root=args.out, use_videos=True
    )
    ds.start_image_writer(num_processes=0, num_threads=2)
    render_s = save_s = 0.0
    for ep in range(args.episodes):
        rng = np.random.default_rng([args.seed, ep])
        tex = scene_mod.table_texture(ep % 3, args.seed)
        scene = scene_mod.Scene(tex, (h, w), np.array([200, 40, 35], float))
        q, box = _trajectory(rng, args.frames, args.fps, scene_mod)
        for i in range(args.frames):
            a = time.perf_counter()
            st = scene_mod.State(q=q[i], box=box[i])
            frame = {
                "observation.images.cam0": scene.render_cam0(st),
                "observation.images.wrist": scene.render_wrist(st),
                "observation.state": q[i].astype(np.float32),
                "action": q[i + 1].astype(np.float32),
                "task": "circle and pick",
            }
            render_s += time.perf_counter() - a
            ds.add_frame(frame)
        a = time.perf_counter()
        ds.save_episode()
        save_s += time.perf_counter() - a
        print(
            f"[make_lerobot_data] episode {ep + 1}/{args.episodes}: {args.frames} frames "
            f"(render {render_s:.1f} s, save+encode {save_s:.1f} s so far)",
            flush=True,
        )
    ds.finalize()
    total = time.perf_counter() - t0
    frames = args.episodes * args.frames
    print(
        f"[make_lerobot_data] wrote {args.out}: {args.episodes} episodes x {args.frames} frames, "
        f"2 cameras {h}x{w}, in {total:.1f} s (render {render_s:.1f} s, save/encode {save_s:.1f} s, "
        f"{frames / total:.1f} frames/s)",
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
