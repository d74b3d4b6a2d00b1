"""A mixture of robots with one layout against its sources alone (issue 23).

Renders the bimanual demo and the single-arm demo (``rayform-server demo --robot single-arm``)
into ``.bench/mixture-layout-eN/`` once (N episodes each, the full demo's 240x320 cameras), then
times, in alternating rounds, three loaders (``DataLoader(batch_size=32, num_workers=2,
persistent_workers=True, collate_fn=rayform.torch.collate)`` with ``EpisodeSampler``):

* ``bimanual``: two cameras, 14 joints, a 14-D action chunk of 8 steps at 30 Hz, keys mapped,
  ``image_size=(96, 128)``, ``normalize="mean_std"``;
* ``single_arm``: one wrist camera, 7 joints, a 7-D chunk of 8 steps at 15 Hz, the same keys;
* ``mixture``: ``MixtureDataset([(bimanual, w), (single_arm, 1 - w)], layout="union")``: every
  sample padded to 14-D with ``*_dim_is_pad`` masks, a zero ``image_primary`` with
  ``image_primary_is_missing`` for the single arm.

The mixture draws ``w`` of its samples from the bimanual source, so with no cost of its own it
would run at the weighted harmonic mean of the sources' rates, ``1 / (w / r_bimanual + (1 - w) /
r_single_arm)``; the report gives the mixture's rate over that, per round (target: >= 0.9).
On a shared machine wall-clock rates swing with other jobs, so it also measures CPU seconds per
sample (the main process and both workers, from ``/proc``), whose weighted mean over the
sources is the same target in CPU terms: ``cpu_ratio = (w c_bimanual + (1 - w) c_single_arm) /
c_mixture`` (>= 0.9: the layout adds no measurable cost). It also times the layout step alone
(``mixture.layout.plan(spec).apply(sample)`` over samples each source already read), in
microseconds per sample, and a control row: ``control``, today's mixture without a layout of the
bimanual dataset with a second copy of itself (0.5 / 0.5), whose rate over the bimanual rate
(``control_ratio``, CPU: ``control_cpu_ratio``) is the cost of mixing itself (each source's share
of a batch is read in its own, smaller batched call), layout or not.

Usage: ``.venv/bin/python -m bench.mixture_layout [--episodes 4] [--rounds 3] [--batches 20]
[--weight 0.5] [--out FILE]``; writes ``bench/results/mixture_layout.json``. Not part of
``make bench``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

from torch.utils.data import DataLoader

from bench._data import BENCH, REPO, StoreClient, manifest_of
from bench._measure import loadavg, log
from bench._timing import child_pids
from rayform.slice import Slice
from rayform.torch import EpisodeDataset, EpisodeSampler, MixtureDataset, collate
from rayform_server.demo import DEMO_SLICE, SINGLE_ARM_SLICE, build_demo
from rayform_server.store import Store

SIZE = (96, 128)


def build(root: Path, episodes: int) -> None:
    """Both robots' demos, ``episodes`` each, full-size cameras (once)."""
    store = Store(root)
    for slice_id, robot in ((DEMO_SLICE, "bimanual"), (SINGLE_ARM_SLICE, "single-arm")):
        if store.get_slice(slice_id) is not None:  # built by an earlier run
            continue
        log(
            f"[bench] rendering {episodes} {robot} episodes into {root} (once; a minute or two) ..."
        )
        build_demo(root, slice_id, episodes=episodes, robot=robot, jobs=2)


def open_slice(root: Path, slice_id: str) -> Slice:
    store = Store(root)
    digest = manifest_of(store, slice_id)
    return Slice(slice_id, digest, store.load_manifest(digest), StoreClient(root))


def datasets(root: Path) -> tuple[EpisodeDataset, EpisodeDataset]:
    return _bimanual(root), _single_arm(root)


def _bimanual(root: Path) -> EpisodeDataset:
    return EpisodeDataset(
        open_slice(root, DEMO_SLICE),
        obs={"image_primary": "cam0/rgb", "image_wrist": "wrist/rgb", "state": "joints/position"},
        action={"action": "joints/position_delta"},
        fps=30,
        horizon=8,
        image_size=SIZE,
        normalize="mean_std",
        shard=None,
        readahead_bytes=0,
    )


def _single_arm(root: Path) -> EpisodeDataset:
    return EpisodeDataset(
        open_slice(root, SINGLE_ARM_SLICE),
        obs={"image_wrist": "hand/rgb", "state": "arm/joint_pos"},
        action={"action": "arm/joint_cmd_delta"},
        fps=15,
        horizon=8,
        image_size={"image_wrist": SIZE},
        normalize="mean_std",
        shard=None,
        readahead_bytes=0,
    )


def cpu_s(pids: list[int]) -> float:
    """User + system CPU seconds of ``pids`` so far (``/proc/PID/stat``)."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / tick


def rate(ds: Any, batches: int, warmup: int = 3) -> tuple[float, float]:
    """``(samples/s, CPU s per sample)`` of the loader over ``batches`` batches after ``warmup``
    (workers started)."""
    loader = DataLoader(
        ds,
        sampler=EpisodeSampler(ds),
        batch_size=32,
        num_workers=2,
        persistent_workers=True,
        collate_fn=collate,
    )
    stream = iter(loader)
    for _ in range(warmup):
        next(stream)
    pids = [os.getpid(), *child_pids()]
    n, c0, t0 = 0, cpu_s(pids), time.perf_counter()
    for _ in range(batches):
        try:
            batch = next(stream)
        except StopIteration:
            stream = iter(loader)
            batch = next(stream)
        n += int(batch["t_ns"].shape[0])
    dt, dc = time.perf_counter() - t0, cpu_s(pids) - c0
    del stream, loader
    return n / dt, dc / n


def layout_us(mixture: MixtureDataset, n: int = 256) -> dict[str, float]:
    """Microseconds per sample of the layout step alone, per source (samples read beforehand)."""
    assert mixture.layout is not None
    out = {}
    for name, ds in zip(mixture.source_names, mixture.sources, strict=True):
        plan = mixture.layout.plan(ds.sample_spec())
        samples = ds.__getitems__(list(range(0, len(ds), max(1, len(ds) // n)))[:n])
        plan.apply(samples[0])  # the constant masks and zero images are made once
        t0 = time.perf_counter()
        for sample in samples:
            plan.apply(sample)
        out[name] = (time.perf_counter() - t0) / len(samples) * 1e6
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--episodes", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batches", type=int, default=20)
    ap.add_argument("--weight", type=float, default=0.5, help="the bimanual source's weight")
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "mixture_layout.json")
    args = ap.parse_args()
    root = BENCH / f"mixture-layout-e{args.episodes}"
    build(root, args.episodes)
    bimanual, single_arm = datasets(root)
    w = args.weight
    mixture = MixtureDataset(
        [(bimanual, w, "bimanual"), (single_arm, 1 - w, "single_arm")],
        layout="union",
        num_samples=len(bimanual) + len(single_arm),
    )
    control = MixtureDataset([(bimanual, 0.5, "a"), (_bimanual(root), 0.5, "b")])
    step = layout_us(mixture)
    log(
        "[bench] the layout step alone: "
        + ", ".join(f"{k} {v:.1f} us/sample" for k, v in step.items())
    )
    rounds: list[dict[str, float]] = []
    for r in range(args.rounds):
        row: dict[str, float] = {}
        for name, ds in (
            ("bimanual", bimanual),
            ("single_arm", single_arm),
            ("mixture", mixture),
            ("control", control),
        ):
            row[name], row[f"{name}_cpu_ms"] = (
                x * f for x, f in zip(rate(ds, args.batches), (1, 1000), strict=True)
            )
        row["harmonic"] = 1 / (w / row["bimanual"] + (1 - w) / row["single_arm"])
        row["ratio"] = row["mixture"] / row["harmonic"]
        row["cpu_ratio"] = (w * row["bimanual_cpu_ms"] + (1 - w) * row["single_arm_cpu_ms"]) / row[
            "mixture_cpu_ms"
        ]
        row["control_ratio"] = row["control"] / row["bimanual"]
        row["control_cpu_ratio"] = row["bimanual_cpu_ms"] / row["control_cpu_ms"]
        row["load"] = loadavg()
        rounds.append(row)
        log(f"[bench] round {r + 1}: " + ", ".join(f"{k} {v:.3g}" for k, v in row.items()))
    med = {k: statistics.median(row[k] for row in rounds) for k in rounds[0]}
    report = {
        "episodes": args.episodes,
        "weight": w,
        "batches": args.batches,
        "image_size": list(SIZE),
        "layout_us_per_sample": step,
        "rounds": rounds,
        "median": med,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    per_round = ", ".join(f"{row['ratio']:.3f}" for row in rounds)
    cpu_rounds = ", ".join(f"{row['cpu_ratio']:.3f}" for row in rounds)
    log(
        f"[bench] median: mixture {med['mixture']:.1f} samples/s, harmonic mean of the sources "
        f"{med['harmonic']:.1f}, ratio {med['ratio']:.3f} (per round: "
        f"{per_round}); CPU per sample: mixture {med['mixture_cpu_ms']:.2f} ms, cpu_ratio {med['cpu_ratio']:.3f} "
        f"(per round: {cpu_rounds}); control (mixing alone, no layout): ratio {med['control_ratio']:.3f}, "
        f"cpu_ratio {med['control_cpu_ratio']:.3f}; wrote {args.out}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
