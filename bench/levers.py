"""Speed levers measured by the benchmark, and where the time goes (a profile).

* :class:`BlockShuffleSampler`: a locality-aware shuffling sampler (bench-only for now);
* :func:`regop_slice`: the same episodes re-encoded with another keyframe interval (GOP);
* :func:`profile_getitems`: cProfile of ``EpisodeDataset.__getitems__`` in one process;
* :func:`cpu_per_sample`: user and system CPU per sample of every process of a running
  ``DataLoader`` (the main process and each worker), from ``/proc``.

**What the block sampler does to sample independence.** Each epoch the grid of every
segment is cut into blocks of ``block`` consecutive steps; the list of all blocks is shuffled
(a permutation from ``(seed, epoch)``) and so is the order inside each block. Every sample
appears exactly once per epoch, as with ``shuffle=True``; but a batch of ``B`` samples is
``B / block`` blocks, so it holds ``block`` consecutive time steps of each of ``B / block``
episodes instead of ``B`` draws from anywhere. Within-batch samples are therefore correlated
(neighbouring frames), the batch gradient's variance rises, and batch statistics (BatchNorm)
see fewer episodes. Across batches the order is still uniformly random over blocks.
"""

from __future__ import annotations

import cProfile
import io
import os
import pstats
import statistics
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
from torch.utils.data import Sampler

from rayform.format import decode_table, decode_timestamps
from rayform.slice import Slice

__all__ = [
    "BlockShuffleSampler",
    "cpu_per_sample",
    "full_epochs",
    "getitems_rate",
    "profile_getitems",
    "regop_slice",
]


class BlockShuffleSampler(Sampler[int]):
    """Every index once per epoch, shuffled by blocks of ``block`` consecutive grid steps.

    Args:
        dataset: an ``EpisodeDataset`` (uses its private grid offsets, its seed and epoch).
        block: grid steps per block (>= 1; 1 is a plain shuffle).
    """

    def __init__(self, dataset: Any, block: int) -> None:
        self.dataset = dataset
        self.block = int(block)
        offsets = dataset._index.offsets
        starts = [
            np.arange(a, b, self.block) for a, b in zip(offsets[:-1], offsets[1:], strict=True)
        ]
        self.starts = np.concatenate(starts)
        self.ends = np.concatenate(
            [np.minimum(s + self.block, b) for s, b in zip(starts, offsets[1:], strict=True)]
        )

    def __len__(self) -> int:
        return len(self.dataset)

    def __iter__(self) -> Iterator[int]:
        rng = np.random.default_rng([int(self.dataset.seed), int(self.dataset.epoch), 0xB10C])
        for j in rng.permutation(len(self.starts)):
            yield from rng.permutation(np.arange(self.starts[j], self.ends[j])).tolist()


def regop_slice(src: Slice, root: Path, gop: int, segments: int, slice_id: str) -> Slice:
    """The first ``segments`` episodes of ``src``, videos re-encoded with keyframe interval ``gop``.

    Built once into data root ``root`` (reused when present); returned through a stand-in
    client that reads blobs from ``root``.
    """
    from torchcodec.decoders import VideoDecoder

    from bench._data import StoreClient, manifest_of
    from rayform_server.builder import SliceBuilder, TableData, VideoData
    from rayform_server.store import Store

    store = Store(root)
    if store.get_slice(slice_id) is None:
        builder = SliceBuilder(store, description=f"bench: gop {gop}")
        for seg in src.manifest.segments[:segments]:
            streams: list[Any] = []
            for name, st in seg.streams.items():
                if st.kind == "video":
                    assert st.timestamps is not None  # every video stream has its timestamps
                    t_ns = decode_timestamps(src.blob_path(st.timestamps).read_bytes())
                    dec = VideoDecoder(str(src.blob_path(st.blob)), seek_mode="approximate")
                    frames = (dec[i].permute(1, 2, 0).numpy() for i in range(len(t_ns)))  # type: ignore[index]
                    streams.append(VideoData(name, frames, t_ns, st.rate_hz, gop=gop))
                else:
                    t_ns, values = decode_table(src.blob_path(st.blob).read_bytes())
                    streams.append(TableData(name, t_ns, values, st.rate_hz, units=st.units))
            builder.add_segment(seg.id, site=seg.site, version=seg.version, streams=streams)
        builder.commit(slice_id)
    digest = manifest_of(store, slice_id)
    return Slice(slice_id, digest, store.load_manifest(digest), StoreClient(root))


def getitems_rate(dataset: Any, batches: int, batch_size: int, seed: int = 2) -> float:
    """Samples/s of ``dataset.__getitems__`` on random batches in this one process (no
    DataLoader, no workers, no collate): the per-sample read cost alone."""
    rng = np.random.default_rng(seed)
    keys = [rng.integers(0, len(dataset), batch_size).tolist() for _ in range(batches + 1)]
    dataset.__getitems__(keys[0])  # open decoders, load tables
    t = time.perf_counter()
    for k in keys[1:]:
        dataset.__getitems__(k)
    return batches * batch_size / (time.perf_counter() - t)


def profile_getitems(dataset: Any, batches: int, batch_size: int, dest: Path) -> dict[str, Any]:
    """cProfile ``dataset.__getitems__`` on ``batches`` random batches in this process.

    Writes the top of the profile (by total time per function) to ``dest`` and returns the
    share of wall time spent in frame decoding, decoder construction and everything else.
    """
    rng = np.random.default_rng(1)
    dataset.__getitems__(rng.integers(0, len(dataset), batch_size).tolist())  # warm tables
    prof = cProfile.Profile()
    t = time.perf_counter()
    prof.enable()
    for _ in range(batches):
        dataset.__getitems__(rng.integers(0, len(dataset), batch_size).tolist())
    prof.disable()
    wall = time.perf_counter() - t
    stats = pstats.Stats(prof)
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(25)
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(buf.getvalue())

    def cum(fragment: str) -> float:
        return max(
            (
                v[3]
                for k, v in stats.stats.items()  # type: ignore[attr-defined]  # undocumented but stable
                if fragment in f"{k[0]}:{k[2]}"
            ),
            default=0.0,
        )

    # Either backend: torchcodec's wrapper in _decode.py, or the all-intra packet decoder.
    decode = max(cum("_decode.py:get_frames_at"), cum("_intra.py:get_frames_at"))
    opening = cum("_decode.py:__init__") + cum("_decode.py:_checked_intra")
    return {
        "batches": batches,
        "batch_size": batch_size,
        "wall_s": wall,
        "samples_per_s_one_process": batches * batch_size / wall,
        "decode_frames_s": decode,
        "open_decoder_s": opening,
        "other_s": max(0.0, wall - decode - opening),
        "profile": str(dest),
    }


def _cpu_s(pid: int) -> tuple[float, float]:
    """``(user, system)`` CPU seconds of ``pid`` (all its threads), from ``/proc/PID/stat``."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


def _warm(make_loader: Any) -> Any:
    """A new loader whose workers have started and produced 3 batches of an abandoned epoch."""
    loader = make_loader()
    it = iter(loader)
    for _ in range(3):
        next(it)
    del it
    return loader


def cpu_per_sample(make_loader: Any, batches: int, runs: int = 3) -> dict[str, Any]:
    """Where a loader's CPU goes: user and system ms per sample, per process.

    Draws ``batches`` batches ``runs`` times (after a warm-up epoch start), reading the CPU
    time of the main process and of each worker before and after; reports the run with the
    median wall time. System time is mostly the kernel allocating, zeroing and freeing the
    shared memory each worker batch is collated into (and, in the main process, unmapping it).
    """
    from bench._timing import child_pids

    loader = _warm(make_loader)
    results: list[dict[str, Any]] = []
    for _ in range(runs):
        it = iter(loader)
        next(it)
        pids = {"main": os.getpid(), **{f"worker{i}": p for i, p in enumerate(child_pids())}}
        before = {k: _cpu_s(p) for k, p in pids.items()}
        t = time.perf_counter()
        n = sum(len(next(it)["t_ns"]) for _ in range(batches))
        wall = time.perf_counter() - t
        after = {k: _cpu_s(p) for k, p in pids.items()}
        del it
        per = {
            k: {
                "user_ms": (after[k][0] - before[k][0]) / n * 1e3,
                "sys_ms": (after[k][1] - before[k][1]) / n * 1e3,
            }
            for k in pids
        }
        results.append(
            {
                "samples_per_s": n / wall,
                "samples": n,
                "per_process": per,
                "total_user_ms": sum(v["user_ms"] for v in per.values()),
                "total_sys_ms": sum(v["sys_ms"] for v in per.values()),
            }
        )
    del loader
    return sorted(results, key=lambda r: r["samples_per_s"])[len(results) // 2]


def full_epochs(make_loader: Any, epochs: int = 2) -> dict[str, Any]:
    """Whole shuffled epochs, each timed from ``iter()`` to its last batch (after one warm-up
    epoch start): the loader's rate over exactly the work the sequential bound does."""
    loader = _warm(make_loader)
    rates = []
    for _ in range(epochs):
        t = time.perf_counter()
        n = sum(len(batch["t_ns"]) for batch in loader)
        rates.append(n / (time.perf_counter() - t))
    del loader
    return {"samples_per_s": statistics.median(rates), "runs": rates, "samples": n}
