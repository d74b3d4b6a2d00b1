"""The lever experiments of ``make bench``: what changes the loader's speed, and by how much.

Each lever is timed like a main row (:func:`bench._measure.loader_row`) or measured by a helper
of :mod:`bench.levers`; :func:`run_levers` runs them all and returns ``{key: result}`` in the
order ``bench/report.py`` prints them:

* the no-decoding ceilings (building, collating and shipping samples only);
* ``decoder_cache_size`` 4 and 64; :class:`bench.levers.BlockShuffleSampler` blocks 8 and 32;
* the sequential bound with 64-frame calls; keyframe intervals ``--gops`` (re-encoded data);
* with ``--hugepage-shm``: ``/dev/shm`` with 2 MiB pages;
* whole epochs; CPU per sample by process; a cProfile of ``__getitems__``;
* last, glibc malloc keeping big buffers (it changes this process's allocator for good).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from functools import partial
from typing import Any

from torch.utils.data import DataLoader

from bench import levers, rows
from bench._data import REPO, Workload
from bench._measure import loader_row, log
from bench._timing import LOADER_KW
from rayform.slice import Slice

__all__ = ["run_levers"]

Loaders = dict[str, Callable[[], DataLoader]]

#: Decoder cache sizes and sampler block lengths tried (the dataset keeps 64 decoders by default).
DECODER_CACHE_SIZES = (4, 64)
SAMPLER_BLOCKS = (8, 32)
#: Slice ID of the re-encoded episodes of the keyframe-interval levers.
GOP_SLICE = "slc_be4c0002"


def _block_loader(slice_: Slice, block: int) -> DataLoader:
    ds = rows.episode_loader(slice_, 50, rows.HORIZON, decoder_cache_size=64).dataset
    kw = {k: v for k, v in LOADER_KW.items() if k != "shuffle"}
    return DataLoader(ds, sampler=levers.BlockShuffleSampler(ds, block), **kw)


def _timed_levers(slice_: Slice, make: Loaders) -> list[tuple[str, str, Callable[[], DataLoader]]]:
    """``(result key, title, loader)`` of every lever that is one timed loader."""
    return [
        (
            "transfer_ceiling",
            "no decoding: build + collate + ship samples from 2 workers (ceiling)",
            make["transfer_ceiling"],
        ),
        (
            "transfer_ceiling_collate",
            "no decoding, collate_fn=rayform.torch.collate (ceiling of row 7)",
            make["transfer_ceiling_collate"],
        ),
        *(
            (
                f"decoder_cache_{n}",
                f"EpisodeDataset 50 Hz, decoder_cache_size={n}",
                partial(rows.episode_loader, slice_, 50, rows.HORIZON, decoder_cache_size=n),
            )
            for n in DECODER_CACHE_SIZES
        ),
        *(
            (
                f"block_sampler_{b}",
                f"EpisodeDataset 50 Hz, BlockShuffleSampler(block={b}), decoder_cache_size=64",
                partial(_block_loader, slice_, b),
            )
            for b in SAMPLER_BLOCKS
        ),
    ]


def _gop_levers(w: Workload, slice_: Slice, args: argparse.Namespace) -> dict[str, Any]:
    """The first episodes re-encoded with each keyframe interval of ``args.gops``."""
    out: dict[str, Any] = {}
    n_seg = min(4, len(slice_.manifest.segments))
    for gop in args.gops:
        log(f"[lever] keyframe interval {gop} ({n_seg} episodes re-encoded, x264 crf 23)")
        t = time.perf_counter()
        sub = levers.regop_slice(
            slice_, w.root.with_name(f"{w.root.name}-gop{gop}"), gop, n_seg, GOP_SLICE
        )
        build_s = time.perf_counter() - t
        size = sum(
            st.blob.size
            for seg in sub.manifest.segments
            for st in seg.streams.values()
            if st.kind == "video"
        )
        res = loader_row(
            f"[lever] gop {gop}: EpisodeDataset 50 Hz",
            partial(rows.episode_loader, sub, 50, rows.HORIZON, decoder_cache_size=64),
            args,
        )
        res["bound"] = rows.sequential_bound(sub, 50)
        one = rows.episode_loader(sub, 50, rows.HORIZON, decoder_cache_size=64).dataset
        res["getitems_one_process"] = levers.getitems_rate(one, 10, 32)
        log(f"  one process, no DataLoader: {res['getitems_one_process']:.1f} samples/s")
        res["video_bytes"] = size
        res["build_s"] = build_s
        log(f"  bound {res['bound']['samples_per_s']:.1f} samples/s; videos {size / 1e6:.1f} MB")
        out[f"gop_{gop}"] = res
    return out


def _hugepage_levers(make: Loaders, args: argparse.Namespace, prefix: str = "") -> dict[str, Any]:
    """Row 3 (and, before malloc is tuned, the ceiling) with ``/dev/shm`` on 2 MiB pages."""
    from bench._shm import hugepage_shm

    out: dict[str, Any] = {}
    tuned = ", malloc tuned" if prefix else ""
    with hugepage_shm() as old:
        log(f"[lever] /dev/shm remounted huge=within_size (was huge={old}) for the next rows")
        out[f"{prefix}hugepage_shm_episode_50hz"] = loader_row(
            f"[lever] {'3. ' if prefix else ''}EpisodeDataset 50 Hz{tuned}, /dev/shm with 2 MiB pages",
            make["episode_50hz"],
            args,
        )
        if not prefix:
            out["hugepage_shm_transfer_ceiling"] = loader_row(
                "[lever] no decoding (ceiling), /dev/shm with 2 MiB pages",
                make["transfer_ceiling"],
                args,
            )
        out[f"cpu_per_sample_{prefix}hugepage_shm"] = levers.cpu_per_sample(
            make["episode_50hz"], args.batches
        )
    log(f"[lever] /dev/shm back to huge={old}")
    return out


def _cpu_levers(make: Loaders, args: argparse.Namespace) -> dict[str, Any]:
    log("[lever] CPU per sample by process (user/system ms), from /proc")
    out: dict[str, Any] = {}
    for key in ("episode_50hz", "transfer_ceiling", "episode_50hz_threads", "episode_50hz_collate"):
        res = out[key] = levers.cpu_per_sample(make[key], args.batches)
        log(
            f"  {key}: {res['samples_per_s']:.1f} samples/s, user {res['total_user_ms']:.2f} ms + system "
            f"{res['total_sys_ms']:.2f} ms per sample: "
            + ", ".join(
                f"{p} {v['user_ms']:.2f}/{v['sys_ms']:.2f}" for p, v in res["per_process"].items()
            )
        )
    return out


def _malloc_levers(make: Loaders, args: argparse.Namespace) -> dict[str, Any]:
    """Rows 3, 6 and 7 again with glibc malloc keeping big buffers (bench/_malloc.py).

    Changes this process's allocator for good, so it runs after every other row.
    """
    from bench._malloc import tune_glibc_malloc

    tune_glibc_malloc()
    log("[lever] glibc malloc tuned: mmap threshold 32 MiB, trim threshold 1 GiB (from here on)")
    out: dict[str, Any] = {}
    out["malloc_episode_50hz"] = loader_row(
        "[lever] 3. EpisodeDataset 50 Hz, malloc tuned", make["episode_50hz"], args
    )
    for key, title in (
        ("threads", "6. EpisodeDataset 50 Hz, decode_threads=2, num_workers=0"),
        ("collate", "7. EpisodeDataset 50 Hz, rayform.torch.collate"),
    ):
        out[f"malloc_episode_50hz_{key}"] = loader_row(
            f"[lever] {title}, malloc tuned", make[f"episode_50hz_{key}"], args
        )
        out[f"cpu_per_sample_malloc_{key}"] = levers.cpu_per_sample(
            make[f"episode_50hz_{key}"], args.batches
        )
    if args.hugepage_shm:
        out.update(_hugepage_levers(make, args, prefix="malloc_"))
    return out


def run_levers(w: Workload, slice_: Slice, args: argparse.Namespace) -> dict[str, Any]:
    """Every lever experiment on ``slice_`` (workload ``w``), in the order the report prints."""
    make = rows.loaders(slice_, w.height, w.width)
    out: dict[str, Any] = {}
    for key, title, loader in _timed_levers(slice_, make):
        out[key] = loader_row(f"[lever] {title}", loader, args)
    log("[lever] sequential bound with 64-frame get_frames_at calls (the first runs' bound)")
    out["bound_chunk64"] = rows.sequential_bound(slice_, 50, chunk=64)
    log(f"  -> {out['bound_chunk64']['samples_per_s']:.1f} samples/s")
    out.update(_gop_levers(w, slice_, args))
    if args.hugepage_shm:
        out.update(_hugepage_levers(make, args))
    for key, loader_key in (
        ("full_epoch_episode_50hz", "episode_50hz"),
        ("full_epoch_episode_50hz_collate", "episode_50hz_collate"),
    ):
        log(f"[lever] {key}: whole epochs, each from iter() to its last batch")
        out[key] = levers.full_epochs(make[loader_key])
        log(
            f"  -> {out[key]['samples_per_s']:.1f} samples/s ({', '.join(f'{v:.0f}' for v in out[key]['runs'])})"
        )
    out["cpu_per_sample"] = _cpu_levers(make, args)
    log("[lever] profile of EpisodeDataset 50 Hz __getitems__ (one process, cProfile)")
    ds = make["episode_50hz"]().dataset
    out["profile"] = levers.profile_getitems(
        ds, 8, 32, REPO / ".bench" / "profile-episode-50hz.txt"
    )
    log(f"  {out['profile']}")
    out.update(_malloc_levers(make, args))  # last: it changes this process's allocator
    return out
