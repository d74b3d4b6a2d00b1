"""``make bench``: every loader row of issue 6 in one run, plus the side measurements.

Usage::

    .venv/bin/python bench/run_all.py            # default workload, ~5 min on 2 cores once the data exists
    .venv/bin/python bench/run_all.py --quick    # 4 episodes x 100 frames, to try things

Rows (``DataLoader(shuffle=True, batch_size=32, num_workers=2, persistent_workers=True)``,
warm cache, warm-up then the median of ``--runs`` timed runs):

1. naive: a new torchcodec decoder per ``__getitem__``, no cache, on our stored data;
2. ``LeRobotDataset`` defaults (torchcodec) on its own data, in the peer venv;
3. ``EpisodeDataset`` at the native 50 Hz;  4. ``EpisodeDataset`` at 15 Hz;
5. the sequential-epoch bound (every needed frame decoded front to back, all cores);
6. ``EpisodeDataset`` at 50 Hz in the training process: ``decode_threads=2`` with
   ``DataLoader(shuffle=True, batch_size=32, num_workers=0)`` (no worker processes);
7. ``EpisodeDataset`` at 50 Hz in the benchmark's DataLoader with
   ``collate_fn=rayform.torch.collate`` (each worker's shared memory reused across batches).

Writes ``bench/results/loader.json`` (``--quick``: ``loader-quick.json``) and the plot
``docs/benchmarks.png`` (not for ``--quick``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._data import REPO, Workload, open_slice, peer_env, peer_python, prepare  # noqa: E402
from bench._timing import time_loader  # noqa: E402

RESULTS = REPO / "bench" / "results"


def log(msg: str) -> None:
    print(msg, flush=True)


def _samples(batch: dict[str, Any]) -> int:
    return int(batch["action"].shape[0])


def _machine() -> dict[str, Any]:
    import torch
    import torchcodec

    cpu = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                if ln.startswith("model name")), platform.processor())
    mem = int(Path("/proc/meminfo").read_text().split()[1]) // 1024
    return {"cpu": cpu, "cores": os.cpu_count(), "mem_mib": mem, "python": platform.python_version(),
            "torch": torch.__version__, "torchcodec": torchcodec.__version__, "platform": platform.platform()}


def _loadavg() -> float:
    """1-minute load average (the machine is shared: record how busy it was)."""
    return float(Path("/proc/loadavg").read_text().split()[0])


def _loader_row(name: str, make: Any, args: argparse.Namespace, batches: int) -> dict[str, Any]:
    log(f"[bench] {name}")
    load0 = _loadavg()
    res = time_loader(make, batches=batches, runs=args.runs, warmup_batches=args.warmup,
                      batch_size_of=_samples, log=log)
    loader = res.pop("loader")
    del loader  # shuts the persistent workers down
    res["loadavg_1min"] = [load0, _loadavg()]
    log(f"  -> {res['samples_per_s']:.1f} samples/s (first batch {res['first_batch_s']:.2f} s)")
    return res


def _lerobot_row(w: Workload, args: argparse.Namespace, batches: int) -> dict[str, Any]:
    log("[bench] 2. LeRobotDataset (peer venv, torchcodec)")
    out = REPO / ".bench" / "lerobot-row.json"
    load0 = _loadavg()
    subprocess.run([peer_python(), str(REPO / "bench" / "_lerobot_row.py"), str(w.lerobot_dir), str(out),
                    "--batches", str(batches), "--runs", str(args.runs), "--warmup", str(args.warmup),
                    "--horizon", "16"], check=True, env=peer_env(), stderr=subprocess.DEVNULL)
    res = json.loads(out.read_text())
    res["loadavg_1min"] = [load0, _loadavg()]
    log(f"  -> {res['samples_per_s']:.1f} samples/s (first batch {res['first_batch_s']:.2f} s)")
    return res


def _malloc_levers(w: Workload, slice_: Any, args: argparse.Namespace) -> dict[str, Any]:
    """Rows 3, 6 and 7 again with glibc malloc keeping big buffers (bench/_malloc.py).

    Changes this process's allocator for good, so it runs after every default row.
    """
    from bench import levers, rows
    from bench._malloc import tune_glibc_malloc

    tune_glibc_malloc()
    log("[lever] glibc malloc tuned: mmap threshold 32 MiB, trim threshold 1 GiB (from here on)")
    out: dict[str, Any] = {}
    out["malloc_episode_50hz"] = _loader_row(
        "[lever] 3. EpisodeDataset 50 Hz, malloc tuned", lambda: rows.episode_loader(slice_, 50, 16),
        args, args.batches)
    out["malloc_episode_50hz_threads"] = _loader_row(
        "[lever] 6. EpisodeDataset 50 Hz, decode_threads=2, num_workers=0, malloc tuned",
        lambda: rows.threaded_loader(slice_, 50, 16),
        args, args.batches)
    out["cpu_per_sample_malloc_threads"] = levers.cpu_per_sample(
        lambda: rows.threaded_loader(slice_, 50, 16), args.batches)
    out["malloc_episode_50hz_collate"] = _loader_row(
        "[lever] 7. EpisodeDataset 50 Hz, rayform.torch.collate, malloc tuned",
        lambda: rows.collate_loader(slice_, 50, 16), args, args.batches)
    out["cpu_per_sample_malloc_collate"] = levers.cpu_per_sample(
        lambda: rows.collate_loader(slice_, 50, 16), args.batches)
    if args.hugepage_shm:
        from bench._shm import hugepage_shm

        with hugepage_shm():
            out["malloc_hugepage_shm_episode_50hz"] = _loader_row(
                "[lever] 3. EpisodeDataset 50 Hz, malloc tuned, /dev/shm with 2 MiB pages",
                lambda: rows.episode_loader(slice_, 50, 16), args, args.batches)
            out["cpu_per_sample_malloc_hugepage_shm"] = levers.cpu_per_sample(
                lambda: rows.episode_loader(slice_, 50, 16), args.batches)
    return out


def _levers(w: Workload, slice_: Any, args: argparse.Namespace) -> dict[str, Any]:
    """Decoder LRU size, a locality-aware sampler, keyframe interval; a profile of row 3."""
    from torch.utils.data import DataLoader

    from bench import levers, rows

    out: dict[str, Any] = {}
    out["transfer_ceiling"] = _loader_row(
        "[lever] no decoding: build + collate + ship samples from 2 workers (ceiling)",
        lambda: DataLoader(rows.TransferCeiling(8000, w.height, w.width, 16), **rows.LOADER_KW),
        args, args.batches)
    out["transfer_ceiling_collate"] = _loader_row(
        "[lever] no decoding, collate_fn=rayform.torch.collate (ceiling of row 7)",
        lambda: DataLoader(rows.TransferCeiling(8000, w.height, w.width, 16), **rows.COLLATE_KW),
        args, args.batches)
    for size in (4, 64):
        out[f"decoder_cache_{size}"] = _loader_row(
            f"[lever] EpisodeDataset 50 Hz, decoder_cache_size={size}",
            lambda size=size: rows.episode_loader(slice_, 50, 16, decoder_cache_size=size), args, args.batches)
    for block in (8, 32):
        def make(block: int = block) -> DataLoader:
            ds = rows.episode_loader(slice_, 50, 16, decoder_cache_size=64).dataset
            kw = {k: v for k, v in rows.LOADER_KW.items() if k != "shuffle"}
            return DataLoader(ds, sampler=levers.BlockShuffleSampler(ds, block), **kw)
        out[f"block_sampler_{block}"] = _loader_row(
            f"[lever] EpisodeDataset 50 Hz, BlockShuffleSampler(block={block}), decoder_cache_size=64",
            make, args, args.batches)
    log("[lever] sequential bound with 64-frame get_frames_at calls (the first runs' bound)")
    out["bound_chunk64"] = rows.sequential_bound(slice_, 50, chunk=64)
    log(f"  -> {out['bound_chunk64']['samples_per_s']:.1f} samples/s")
    n_seg = min(4, len(slice_.manifest.segments))
    for gop in args.gops:
        log(f"[lever] keyframe interval {gop} ({n_seg} episodes re-encoded, x264 crf 23)")
        t = time.perf_counter()
        sub = levers.regop_slice(slice_, w.root.with_name(f"{w.root.name}-gop{gop}"), gop, n_seg,
                                 "slc_be4c0002")
        build_s = time.perf_counter() - t
        size = sum(st.blob.size for seg in sub.manifest.segments for st in seg.streams.values()
                   if st.kind == "video")
        res = _loader_row(f"[lever] gop {gop}: EpisodeDataset 50 Hz", lambda sub=sub: rows.episode_loader(
            sub, 50, 16, decoder_cache_size=64), args, args.batches)
        res["bound"] = rows.sequential_bound(sub, 50)
        one = rows.episode_loader(sub, 50, 16, decoder_cache_size=64).dataset
        res["getitems_one_process"] = levers.getitems_rate(one, 10, 32)
        log(f"  one process, no DataLoader: {res['getitems_one_process']:.1f} samples/s")
        res["video_bytes"] = size
        res["build_s"] = build_s
        log(f"  bound {res['bound']['samples_per_s']:.1f} samples/s; videos {size / 1e6:.1f} MB")
        out[f"gop_{gop}"] = res
    if args.hugepage_shm:
        from bench._shm import hugepage_shm

        with hugepage_shm() as old:
            log(f"[lever] /dev/shm remounted huge=within_size (was huge={old}) for the next rows")
            out["hugepage_shm_episode_50hz"] = _loader_row(
                "[lever] EpisodeDataset 50 Hz, /dev/shm with 2 MiB pages", lambda: rows.episode_loader(slice_, 50, 16),
                args, args.batches)
            out["hugepage_shm_transfer_ceiling"] = _loader_row(
                "[lever] no decoding (ceiling), /dev/shm with 2 MiB pages",
                lambda: DataLoader(rows.TransferCeiling(8000, w.height, w.width, 16), **rows.LOADER_KW),
                args, args.batches)
            out["cpu_per_sample_hugepage_shm"] = levers.cpu_per_sample(
                lambda: rows.episode_loader(slice_, 50, 16), args.batches)
        log(f"[lever] /dev/shm back to huge={old}")
    for key, make_full in (("full_epoch_episode_50hz", lambda: rows.episode_loader(slice_, 50, 16)),
                           ("full_epoch_episode_50hz_collate",
                            lambda: rows.collate_loader(slice_, 50, 16))):
        log(f"[lever] {key}: whole epochs, each from iter() to its last batch")
        out[key] = levers.full_epochs(make_full)
        log(f"  -> {out[key]['samples_per_s']:.1f} samples/s ({', '.join(f'{v:.0f}' for v in out[key]['runs'])})")
    log("[lever] CPU per sample by process (user/system ms), from /proc")
    cpu = {
        "episode_50hz": lambda: rows.episode_loader(slice_, 50, 16),
        "transfer_ceiling": lambda: DataLoader(rows.TransferCeiling(8000, w.height, w.width, 16), **rows.LOADER_KW),
        "episode_50hz_threads": lambda: rows.threaded_loader(slice_, 50, 16),
        "episode_50hz_collate": lambda: rows.collate_loader(slice_, 50, 16),
    }
    out["cpu_per_sample"] = {}
    for key, make_cpu in cpu.items():
        res = out["cpu_per_sample"][key] = levers.cpu_per_sample(make_cpu, args.batches)
        log(f"  {key}: {res['samples_per_s']:.1f} samples/s, user {res['total_user_ms']:.2f} ms + system "
            f"{res['total_sys_ms']:.2f} ms per sample: " + ", ".join(
                f"{p} {v['user_ms']:.2f}/{v['sys_ms']:.2f}" for p, v in res["per_process"].items()))
    log("[lever] profile of EpisodeDataset 50 Hz __getitems__ (one process, cProfile)")
    ds = rows.episode_loader(slice_, 50, 16).dataset
    out["profile"] = levers.profile_getitems(ds, 8, 32, REPO / ".bench" / "profile-episode-50hz.txt")
    log(f"  {out['profile']}")
    out.update(_malloc_levers(w, slice_, args))  # last: it changes this process's allocator
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Rayform loader benchmark (issue 6)")
    ap.add_argument("--quick", action="store_true", help="4 episodes x 100 frames")
    ap.add_argument("--runs", type=int, default=5, help="timed runs per row (median reported)")
    ap.add_argument("--warmup", type=int, default=3, help="untimed batches after the first")
    ap.add_argument("--batches", type=int, default=20, help="batches per timed run (fast rows)")
    ap.add_argument("--naive-batches", type=int, default=4, help="batches per timed run (naive row)")
    ap.add_argument("--rss-epochs", type=int, default=10)
    ap.add_argument("--rows", default="1,2,3,4,5,6,7", help="comma-separated rows to run")
    ap.add_argument("--no-levers", dest="levers", action="store_false", help="skip the lever rows")
    ap.add_argument("--hugepage-shm", action="store_true",
                    help="also measure with /dev/shm remounted huge=within_size (root; restored after)")
    ap.add_argument("--gops", type=lambda s: [int(g) for g in s.split(",")], default=[1, 2, 10],
                    help="keyframe intervals to measure (lever)")
    args = ap.parse_args(argv)
    import torch

    from bench import rows

    torch.set_num_threads(1)
    w = Workload(4, 100) if args.quick else Workload(20, 400)
    wanted = {int(r) for r in args.rows.split(",")}
    t_all = time.perf_counter()
    out: dict[str, Any] = {"workload": {"episodes": w.episodes, "frames": w.frames, "fps": w.fps,
                                        "cameras": [w.height, w.width], "state_dim": 14, "horizon": 16},
                           "machine": _machine(), "settings": vars(args)}
    out["prepare"] = prepare(w, log)
    slice_, how = open_slice(w, log)
    out["data"] = how
    log(f"[bench] slice {slice_.id}: {len(slice_.manifest.segments)} segments via {how['client']}")
    r: dict[str, Any] = {}
    if args.rss_epochs:
        # First, while this process has decoded nothing: forked workers inherit (and count in
        # their RSS) whatever the parent holds, e.g. the decoders of row 6, which runs in-process.
        segs = [s.id for s in slice_.manifest.segments[: max(1, len(slice_.manifest.segments) // 5)]]
        log(f"[bench] worker RSS over {args.rss_epochs} epochs (EpisodeDataset 15 Hz, {len(segs)} episodes)")
        out["rss"] = rows.worker_rss(lambda: rows.episode_loader(slice_, 15, 16, segments=segs),
                                     args.rss_epochs, log)
    if 1 in wanted:
        r["naive"] = _loader_row("1. naive (new decoder per sample, no cache)", lambda: torch.utils.data.DataLoader(
            rows.NaiveDataset(slice_, 16), **rows.LOADER_KW), args, args.naive_batches)
    if 2 in wanted:
        r["lerobot"] = _lerobot_row(w, args, args.batches)
    if 3 in wanted:
        r["episode_50hz"] = _loader_row("3. EpisodeDataset 50 Hz", lambda: rows.episode_loader(slice_, 50, 16),
                                        args, args.batches)
    if 4 in wanted:
        r["episode_15hz"] = _loader_row("4. EpisodeDataset 15 Hz", lambda: rows.episode_loader(slice_, 15, 16),
                                        args, args.batches)
    if 6 in wanted:
        r["episode_50hz_threads"] = _loader_row(
            "6. EpisodeDataset 50 Hz, decode_threads=2, DataLoader(num_workers=0)",
            lambda: rows.threaded_loader(slice_, 50, 16),
            args, args.batches)
    if 7 in wanted:
        r["episode_50hz_collate"] = _loader_row(
            "7. EpisodeDataset 50 Hz, collate_fn=rayform.torch.collate",
            lambda: rows.collate_loader(slice_, 50, 16), args, args.batches)
    if 5 in wanted:
        for fps in (50, 15):
            log(f"[bench] 5. sequential-epoch bound at {fps} Hz")
            r[f"bound_{fps}hz"] = rows.sequential_bound(slice_, fps)
            log(f"  -> {r[f'bound_{fps}hz']['samples_per_s']:.1f} samples/s ({r[f'bound_{fps}hz']['samples']} samples)")
    out["rows"] = r
    # name: (numerator row, denominator row)
    pairs = {"3/2": ("episode_50hz", "lerobot"), "3/5": ("episode_50hz", "bound_50hz"),
             "4/5@15Hz": ("episode_15hz", "bound_15hz"), "6/5": ("episode_50hz_threads", "bound_50hz"),
             "6/2": ("episode_50hz_threads", "lerobot"), "7/5": ("episode_50hz_collate", "bound_50hz"),
             "7/2": ("episode_50hz_collate", "lerobot"), "7/3": ("episode_50hz_collate", "episode_50hz"),
             "3/1": ("episode_50hz", "naive")}
    ratios = {name: r[a]["samples_per_s"] / r[b]["samples_per_s"] for name, (a, b) in pairs.items()
              if a in r and b in r}
    out["ratios"] = ratios
    log("[bench] ratios: " + ", ".join(f"{k} = {v:.2f}" for k, v in ratios.items()))

    if args.levers:
        out["levers"] = _levers(w, slice_, args)

    out["construction"] = rows.construction_time(slice_, 10_000, 15)
    log(f"[bench] construction on 10,000 segments: {out['construction']['seconds'] * 1e3:.1f} ms")
    out["total_s"] = time.perf_counter() - t_all
    pull = RESULTS / "pull.json"
    if pull.is_file():
        out["pull"] = json.loads(pull.read_text())
    RESULTS.mkdir(parents=True, exist_ok=True)
    dest = RESULTS / ("loader-quick.json" if args.quick else "loader.json")
    dest.write_text(json.dumps(out, indent=1, default=float) + "\n")
    log(f"[bench] wrote {dest} ({out['total_s']:.0f} s)")
    if not args.quick:
        try:
            from bench.plot import plot

            plot(out, REPO / "docs" / "benchmarks.png")
        except ImportError as exc:
            log(f"[bench] no plot ({exc}): pip install -e '.[bench]' then python bench/plot.py")
    return 0


if __name__ == "__main__":
    sys.exit(main())
