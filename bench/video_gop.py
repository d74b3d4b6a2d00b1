"""Keyframe interval (GOP) vs random single-frame access time and file size, on demo content.

Renders two full-size demo episodes (240x320, 6-8 s, both cameras), encodes them with each GOP,
then reads random single frames with torchcodec (``seek_mode="approximate"``, one FFmpeg
thread) through a decoder opened once per file, the way a DataLoader worker's decoder cache
does. Prints a Markdown table (the one in docs/video-encoding.md).

Usage: ``.venv/bin/python bench/video_gop.py [--gops 1 5 10 30 250] [--reads 150]``
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from torchcodec.decoders import VideoDecoder

from rayform_server.demo import build_episode, demo_spec
from rayform_server.store import Store


def _measure(
    paths: list[Path], counts: list[int], reads: int, rng: np.random.Generator
) -> tuple[float, float, float]:
    """Median and p95 ms of one random frame through an open decoder, and ms to open + first read."""
    decoders = [VideoDecoder(str(p), seek_mode="approximate", num_ffmpeg_threads=1) for p in paths]
    times = []
    for _ in range(reads):
        k = int(rng.integers(len(paths)))
        i = int(rng.integers(counts[k]))
        t0 = time.perf_counter()
        decoders[k].get_frame_at(i)
        times.append((time.perf_counter() - t0) * 1e3)
    cold = []
    for k, p in enumerate(paths):
        t0 = time.perf_counter()
        VideoDecoder(str(p), seek_mode="approximate", num_ffmpeg_threads=1).get_frame_at(
            counts[k] // 2
        )
        cold.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times), float(np.percentile(times, 95)), statistics.median(cold)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gops", type=int, nargs="+", default=[1, 5, 10, 30, 250])
    parser.add_argument("--reads", type=int, default=150, help="random reads per GOP")
    parser.add_argument("--episodes", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(1)
    spec = demo_spec(small=False)
    print(
        f"demo content {spec.size[1]}x{spec.size[0]}, {args.episodes} episodes x 2 cameras, "
        f"{args.reads} random reads per GOP\n"
    )
    print(
        "| GOP (frames) | size (kB per camera-second) | random frame, median (ms) | p95 (ms) | open + 1 frame (ms) |"
    )
    print("|---:|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(tmp)
        for gop in args.gops:
            paths, counts, seconds, size = [], [], 0.0, 0
            for index in range(args.episodes):
                seg = build_episode(str(store.root), spec, 0, index, gop=gop)
                for name in ("cam0/rgb", "wrist/rgb"):
                    s = seg.streams[name]
                    paths.append(store.blob_path(s.blob.hash))
                    counts.append(s.count)
                    seconds += s.count / s.rate_hz
                    size += s.blob.size
            med, p95, cold = _measure(paths, counts, args.reads, np.random.default_rng(gop))
            print(
                f"| {gop} | {size / seconds / 1e3:.1f} | {med:.2f} | {p95:.2f} | {cold:.2f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
