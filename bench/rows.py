"""The rayform-side rows of the loader benchmark and the side measurements.

* :class:`NaiveDataset`: row 1, the pattern the PyTorch guide warns about: every
  ``__getitem__`` opens a new torchcodec ``VideoDecoder`` per camera (default arguments) and
  re-reads the table blobs, no cache of any kind;
* :func:`episode_loader`: rows 3, 4, 6 and 7, ``EpisodeDataset`` in the benchmark's DataLoader
  (row 6: in the training process, ``decode_threads=2``, ``num_workers=0``; row 7: the
  benchmark's settings with ``collate_fn=rayform.torch.collate``);
* :func:`sequential_bound`: row 5, every needed frame decoded front to back once per video,
  one process per core, by the faster of torchcodec and our all-intra packet decoder;
* :func:`worker_rss`, :func:`construction_time`: the memory and construction measurements.
"""

from __future__ import annotations

import dataclasses
import multiprocessing as mp
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from bench._timing import LOADER_KW, child_pids, rss_kib
from rayform._resolution import Target
from rayform.format import decode_table, decode_timestamps
from rayform.manifest import Manifest, manifest_hash
from rayform.slice import Slice
from rayform.torch import EpisodeDataset, collate
from rayform.torch._decoding import open_intra, resize_frames
from rayform.torch._index import build_index

__all__ = [
    "CAMERAS",
    "COLLATE_KW",
    "HORIZON",
    "IN_PROCESS_KW",
    "NaiveDataset",
    "TransferCeiling",
    "collate_loader",
    "construction_time",
    "episode_loader",
    "loaders",
    "needed_frames",
    "sequential_bound",
    "threaded_loader",
    "worker_rss",
]

CAMERAS = ("cam0/rgb", "wrist/rgb")
STATE, ACTION = "observation/state", "action"
#: Action chunk length of every row.
HORIZON = 16


class NaiveDataset(Dataset):
    """Row 1: one sample per stored row (the native rate); nothing is kept between calls.

    Sample: ``cam0/rgb``, ``wrist/rgb`` ``(3, H, W) uint8``, ``observation/state (14,)``,
    ``action (horizon, 14)`` (rows ``k .. k + horizon - 1``, the last row repeated past the
    end) and ``action_is_pad (horizon,) bool``.
    """

    def __init__(self, slice_: Slice, horizon: int) -> None:
        self.slice = slice_
        self.horizon = horizon
        self.counts = [seg.streams[STATE].count for seg in slice_.manifest.segments]
        self.offsets = np.concatenate([[0], np.cumsum(self.counts)])

    def __len__(self) -> int:
        return int(self.offsets[-1])

    def __getitem__(self, i: int) -> dict[str, Any]:
        from torchcodec.decoders import VideoDecoder

        s = int(np.searchsorted(self.offsets, i, side="right") - 1)
        k = i - int(self.offsets[s])
        seg = self.slice.manifest.segments[s]
        out: dict[str, Any] = {}
        for cam in CAMERAS:
            decoder = VideoDecoder(str(self.slice.blob_path(seg.streams[cam].blob)))
            out[cam] = decoder[k]  # type: ignore[index]  # stubs say numbers.Integral
        _, state = decode_table(self.slice.blob_path(seg.streams[STATE].blob).read_bytes())
        _, action = decode_table(self.slice.blob_path(seg.streams[ACTION].blob).read_bytes())
        rows = np.arange(k, k + self.horizon)
        out[STATE] = torch.from_numpy(np.ascontiguousarray(state[k], dtype=np.float32))
        out["action"] = torch.from_numpy(
            action[np.minimum(rows, len(action) - 1)].astype(np.float32)
        )
        out["action_is_pad"] = torch.from_numpy(rows >= len(action))
        return out


class TransferCeiling(Dataset):
    """No decoding at all: samples shaped like row 3's (two ``(3, H, W) uint8`` frames, state,
    action chunk, meta) copied from a fixed pool. Its throughput in the benchmark's DataLoader is
    the cost of building, collating and shipping samples from the workers: a ceiling for every
    row that uses worker processes.
    """

    def __init__(self, n: int, height: int, width: int, horizon: int) -> None:
        self.n = n
        self.pool = torch.randint(0, 256, (8, 3, height, width), dtype=torch.uint8)
        self.horizon = horizon

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {
            CAMERAS[0]: self.pool[i % 8].clone(),
            CAMERAS[1]: self.pool[(i + 1) % 8].clone(),
            STATE: torch.zeros(14),
            "action": torch.zeros(self.horizon, 14),
            "action_is_pad": torch.zeros(self.horizon, dtype=torch.bool),
            "t_ns": torch.tensor(i),
            "meta": {"slice": "s", "segment": "g", "segment_version": 1, "site": "x"},
        }


#: Row 6's DataLoader: the benchmark's settings with no worker processes.
IN_PROCESS_KW: dict[str, Any] = {"batch_size": 32, "shuffle": True, "num_workers": 0}

#: Row 7's DataLoader: the benchmark's settings, batches collated into reused shared memory.
COLLATE_KW: dict[str, Any] = {**LOADER_KW, "collate_fn": collate}


def episode_loader(
    slice_: Slice, fps: float, horizon: int, loader_kw: dict[str, Any] | None = None, **kw: Any
) -> DataLoader:
    """Rows 3/4/6/7: ``EpisodeDataset`` over both cameras and the state, action chunk ``horizon``.

    ``loader_kw`` replaces the benchmark's DataLoader settings (rows 6, 7); ``kw`` go to the dataset.
    """
    ds = EpisodeDataset(
        slice_, obs=[*CAMERAS, STATE], action=ACTION, fps=fps, horizon=horizon, shard=None, **kw
    )
    return DataLoader(ds, **(LOADER_KW if loader_kw is None else loader_kw))


def threaded_loader(slice_: Slice, fps: float, horizon: int, threads: int = 2) -> DataLoader:
    """Row 6: ``EpisodeDataset(decode_threads=threads)`` in ``DataLoader(num_workers=0)``."""
    return episode_loader(slice_, fps, horizon, decode_threads=threads, loader_kw=IN_PROCESS_KW)


def collate_loader(slice_: Slice, fps: float, horizon: int) -> DataLoader:
    """Row 7: ``EpisodeDataset`` in the benchmark's DataLoader with ``rayform.torch.collate``."""
    return episode_loader(slice_, fps, horizon, loader_kw=COLLATE_KW)


def loaders(slice_: Slice, height: int, width: int) -> dict[str, Callable[[], DataLoader]]:
    """Every loader the benchmark times more than once, by its key in the results.

    Rows 1, 3, 4, 6 and 7 over ``slice_``, and the two no-decoding ceilings with samples of
    ``height`` x ``width`` pixels. Each value builds a new dataset and ``DataLoader``.
    """

    def ceiling(kw: dict[str, Any]) -> DataLoader:
        return DataLoader(TransferCeiling(8000, height, width, HORIZON), **kw)

    return {
        "naive": lambda: DataLoader(NaiveDataset(slice_, HORIZON), **LOADER_KW),
        "episode_50hz": lambda: episode_loader(slice_, 50, HORIZON),
        "episode_15hz": lambda: episode_loader(slice_, 15, HORIZON),
        "episode_50hz_threads": lambda: threaded_loader(slice_, 50, HORIZON),
        "episode_50hz_collate": lambda: collate_loader(slice_, 50, HORIZON),
        "transfer_ceiling": lambda: ceiling(LOADER_KW),
        "transfer_ceiling_collate": lambda: ceiling(COLLATE_KW),
    }


def needed_frames(
    slice_: Slice, fps: float, names: tuple[str, ...] | None = None
) -> list[tuple[str, int, np.ndarray]]:
    """Per (video path, frame count) the sorted unique frame indices a ``fps`` grid needs
    (the grid of the streams ``names``; default the benchmark's cameras, state and action)."""
    streams = list(names) if names else [*CAMERAS, STATE, ACTION]
    index = build_index(slice_.segments, streams, fps)
    tasks = []
    for s, seg in enumerate(index.segments):
        times = index.times_ns(s, np.arange(int(index.count[s])))
        for cam in CAMERAS:
            st = seg.streams[cam]
            assert st.timestamps is not None  # every video stream has its timestamps
            ts = decode_timestamps(slice_.blob_path(st.timestamps).read_bytes())
            idx = np.unique(np.searchsorted(ts, times, side="right") - 1)
            tasks.append((str(slice_.blob_path(st.blob)), st.count, idx[idx >= 0]))
    return tasks


#: Frames per ``get_frames_at`` call in the bound. Each call returns a new ``(N, 3, H, W)``
#: tensor: at 64 frames of 480x640 that is 59 MB, above glibc's 32 MB mmap ceiling, so every
#: call page-faulted fresh memory and the bound ran ~1.5x slower than decoding allows (0.46 ms
#: of system time per frame). 8 frames (7.4 MB) are reused from the heap: no faults.
BOUND_CHUNK = 8


def _decode_front_to_back(task: tuple[str, int, np.ndarray, int, str, Target | None]) -> int:
    path, _, idx, chunk, decoder, target = task
    if target is not None:
        return _decode_and_resize_front_to_back(Path(path), idx, chunk, target)
    if decoder == "intra":
        dec: Any = open_intra(Path(path))
        if dec is None:
            raise ValueError(f"{path} is not all-intra video")
    else:
        from torchcodec.decoders import VideoDecoder

        dec = VideoDecoder(path, seek_mode="approximate", num_ffmpeg_threads=1)
    for part in np.array_split(idx, max(1, len(idx) // chunk)):
        dec.get_frames_at(part.tolist())
    return len(idx)


def _decode_and_resize_front_to_back(
    path: Path, idx: np.ndarray, chunk: int, target: Target
) -> int:
    """The packet decoder and the dataset's resize, as a DataLoader worker runs them: each
    chunk decoded into one kept RGBA buffer, then resized to ``target`` into a new output
    (which collate would copy into the batch)."""
    torch.set_num_threads(1)  # one process per core, as DataLoader workers run
    dec = open_intra(path)
    if dec is None:
        raise ValueError(f"{path} is not all-intra video")
    parts = np.array_split(idx, max(1, len(idx) // chunk))  # of up to 2 * chunk - 1 frames
    most = max(len(p) for p in parts)
    buffer = np.empty((most, dec.height, dec.width, 4), dtype=np.uint8)
    for part in parts:
        frames = buffer[: len(part)]
        dec.get_frames_at(part.tolist(), out=frames)
        resize_frames(torch.from_numpy(frames).permute(0, 3, 1, 2), target)
    return len(idx)


def _bound_rates(
    slice_: Slice,
    fps: float,
    samples: int,
    processes: int,
    runs: int,
    chunk: int,
    decoder: str,
    names: tuple[str, ...] | None = None,
    target: Target | None = None,
) -> tuple[list[float], int]:
    tasks = [(*task, chunk, decoder, target) for task in needed_frames(slice_, fps, names)]
    rates = []
    with mp.get_context("fork").Pool(processes) as pool:
        for _ in range(runs):
            t = time.perf_counter()
            frames = sum(pool.map(_decode_front_to_back, tasks, chunksize=1))
            rates.append(samples / (time.perf_counter() - t))
    return rates, frames


def sequential_bound(
    slice_: Slice,
    fps: float,
    processes: int | None = None,
    runs: int = 3,
    chunk: int = BOUND_CHUNK,
    decoders: tuple[str, ...] = ("torchcodec", "intra"),
    streams: tuple[str, str] | None = None,
    resize_to: tuple[int, int, str] | None = None,
) -> dict[str, Any]:
    """Row 5: decode every needed frame front to back, one video per task, all cores.

    Each of ``decoders`` (torchcodec's ``get_frames_at``; ``"intra"``: our all-intra packet
    decoder, all-intra video only) decodes the epoch ``runs`` times, in ``chunk``-frame calls;
    the bound is the faster one, since the speed of light is the best decode we know of.

    ``streams``: ``(state, action)`` names of another slice than the benchmark's (whose cameras
    are the benchmark's ``CAMERAS``).

    ``resize_to``: ``(H, W, mode)``: every frame is also resized as
    ``EpisodeDataset(image_size=(H, W), resize=mode)`` resizes (all-intra video, the packet
    decoder only): the speed of light of a loader at that training resolution, decode and
    resize and nothing else.

    Returns ``samples_per_s`` = grid samples of the epoch (``samples``) / wall seconds of the
    decode (the median of the faster decoder's ``runs``), ``by_decoder`` (each one's median
    and runs), ``decoder`` (the faster), plus ``frames`` decoded per pass.
    """
    target = Target(*resize_to) if resize_to is not None else None
    state, action = streams or (STATE, ACTION)
    names = (*CAMERAS, state, action)
    samples = len(EpisodeDataset(slice_, obs=list(CAMERAS), action=action, fps=fps, shard=None))
    processes = processes or os.cpu_count() or 1
    by_decoder: dict[str, Any] = {}
    for decoder in decoders:
        try:
            rates, frames = _bound_rates(
                slice_, fps, samples, processes, runs, chunk, decoder, names, target
            )
        except ValueError:  # not all-intra: that decoder does not apply
            continue
        by_decoder[decoder] = {"samples_per_s": statistics.median(rates), "runs": rates}
    best = max(by_decoder, key=lambda d: by_decoder[d]["samples_per_s"])
    return {
        **by_decoder[best],
        "decoder": best,
        "by_decoder": by_decoder,
        "frames": frames,
        "processes": processes,
        "samples": samples,
        "chunk": chunk,
    }


def worker_rss(
    make_loader: Callable[[], DataLoader], epochs: int, log: Callable[[str], None]
) -> dict[str, Any]:
    """Worker RSS (KiB) after each of ``epochs`` full epochs, and each worker's peak."""
    loader = make_loader()
    dataset = cast(EpisodeDataset, loader.dataset)
    per_epoch = []
    for e in range(epochs):
        dataset.set_epoch(e)
        n = sum(1 for _ in loader)
        rss = [rss_kib(p) for p in child_pids()]
        per_epoch.append([r for r, _ in rss])
        log(f"  epoch {e + 1}/{epochs}: {n} batches, worker RSS {[r // 1024 for r, _ in rss]} MiB")
    peak = [h for _, h in (rss_kib(p) for p in child_pids())]
    first, last = np.array(per_epoch[0]), np.array(per_epoch[-1])
    return {
        "rss_kib_per_epoch": per_epoch,
        "peak_kib": peak,
        "growth_kib": (last - first).tolist(),
        "epochs": epochs,
        "samples_per_epoch": len(dataset),
    }


def construction_time(slice_: Slice, segments: int, fps: float, repeats: int = 3) -> dict[str, Any]:
    """Median seconds to construct ``EpisodeDataset`` over a synthetic ``segments``-episode slice.

    The synthetic manifest repeats the real slice's segments under new IDs (no blob is read:
    construction only reads the manifest).
    """
    real = slice_.manifest.segments
    segs = tuple(
        dataclasses.replace(real[i % len(real)], id=f"seg_{i:016x}") for i in range(segments)
    )
    big = Manifest(segments=segs, description="synthetic")
    big_slice = Slice(slice_.id, manifest_hash(big), big, slice_.client)
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        ds = EpisodeDataset(
            big_slice, obs=[*CAMERAS, STATE], action=ACTION, fps=fps, horizon=16, shard=None
        )
        times.append(time.perf_counter() - t)
    return {
        "segments": segments,
        "samples": len(ds),
        "seconds": statistics.median(times),
        "runs": times,
    }
