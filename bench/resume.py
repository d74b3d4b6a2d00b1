"""Resume costs of ``EpisodeSampler``, and loader throughput against the previous sampler.

Run (a few minutes on 2 cores; the demo data root is built once into ``.bench/resume-demo``)::

    .venv/bin/python -m bench.resume

Measures, each as a median over repeats:

1. ``sampler.state_dict()`` in the middle of an epoch (target < 1 ms);
2. ``load_state_dict`` plus the first key, fresh vs resumed half-way, on a virtual index of
   1,000,000 episodes x 1,000 samples (the position is computed, nothing is replayed);
3. time to the first batch of a real ``DataLoader`` (2 workers, ``rayform.torch.collate``, the
   demo slice, two cameras): fresh vs resumed half-way through the epoch;
4. keys/s of the two samplers alone, and samples/s and CPU ms per sample (this process and
   its workers) over one epoch of the same ``DataLoader`` with the previous sampler (one
   ``numpy`` permutation per epoch) and with this one, alternated (A/B/A/B...).
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
from torch.utils.data import DataLoader, Sampler

REPO = Path(__file__).resolve().parents[1]
ROOT = REPO / ".bench" / "resume-demo"
SLICE_ID = "slc_7c1e04aa"


class PreviousSampler(Sampler[tuple[int, int]]):
    """The sampler before this change: a numpy permutation of the epoch, drawn at ``iter``."""

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __iter__(self) -> Iterator[tuple[int, int]]:
        epoch = int(self.dataset.epoch)
        order = np.random.default_rng([int(self.dataset.seed), epoch, 0x5A]).permutation(
            len(self.dataset)
        )
        for i in order.tolist():
            yield (i, epoch)


class _Virtual:
    """The sampler's contract (rayform.torch.SamplerDataset) over a huge index space (no manifest, no data)."""

    def __init__(self, episodes: int, per_episode: int) -> None:
        from rayform.torch._sampling import episode_streams

        self._streams = episode_streams
        self._offsets = np.arange(episodes + 1, dtype=np.int64) * per_episode
        self.seed, self.epoch, self.shard, self.ddp_even = 0, 0, (0, 1), "split"

    def __len__(self) -> int:
        return int(self._offsets[-1])

    shard_auto, accepts_window = False, True

    def order_streams(
        self, world: int, epoch: int, shuffle: bool, window: int | None = None
    ) -> list[Any]:
        return self._streams(self._offsets, world, self.ddp_even, self.seed, epoch, shuffle, window)

    def order_fingerprint(self) -> dict[str, Any]:
        return {"samples": len(self)}

    def cache_footprint(self) -> None:
        return None

    def follow_order(self, shuffle: bool, window: int | None) -> None:
        pass


def _cpu_s() -> float:
    own, kids = (
        resource.getrusage(resource.RUSAGE_SELF),
        resource.getrusage(resource.RUSAGE_CHILDREN),
    )
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def median_s(fn: Any, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def open_slice() -> Any:
    from bench._data import StoreClient
    from rayform.slice import Slice
    from rayform_server.demo import build_demo
    from rayform_server.store import Store

    manifest = build_demo(ROOT, slice_id=SLICE_ID, jobs=2)
    store = Store(ROOT)
    return Slice(SLICE_ID, manifest.hash, store.load_manifest(manifest.hash), StoreClient(ROOT))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "resume.json")
    args = parser.parse_args(argv)

    import rayform.torch as rt

    out: dict[str, Any] = {"command": ".venv/bin/python -m bench.resume"}

    # 1. state_dict() mid-epoch.
    virtual = _Virtual(1_000_000, 1_000)
    sampler = rt.EpisodeSampler(virtual)
    it = iter(sampler)
    for _ in range(5000):
        next(it)
    reps = 2000
    t = time.perf_counter()
    for _ in range(reps):
        state = sampler.state_dict()
    out["state_dict_us"] = (time.perf_counter() - t) / reps * 1e6
    out["state_json_bytes"] = len(json.dumps(state))

    # 2. First key, fresh vs half-way through a 1e9-sample epoch.
    half = {**state, "history": [[1, len(virtual) // 2]]}

    def first_key(resume: bool) -> None:
        s = rt.EpisodeSampler(virtual)
        if resume:
            s.load_state_dict(half)
        next(iter(s))

    out["first_key_fresh_ms"] = median_s(lambda: first_key(False), args.repeats) * 1e3
    out["first_key_resumed_ms"] = median_s(lambda: first_key(True), args.repeats) * 1e3

    # Keys per second of the two samplers alone (no data), over 100,000 samples.
    small = _Virtual(1000, 100)
    for kind, make_sampler in (
        ("previous", PreviousSampler),
        ("episode_sampler", rt.EpisodeSampler),
    ):
        s = make_sampler(small)
        out[f"keys_per_s_{kind}"] = len(small) / median_s(
            lambda s=s: sum(1 for _ in s), args.repeats
        )

    # 3. Time to first batch of a real loader, fresh vs resumed half-way.
    slice_ = open_slice()
    obs = ["cam0/rgb", "wrist/rgb", "joints/position"]

    def make() -> Any:
        return rt.EpisodeDataset(
            slice_, obs=obs, action="joints/position_delta", fps=15, horizon=16
        )

    n = len(make())
    batch = 16
    mid = {**rt.EpisodeSampler(make()).state_dict(), "history": [[1, (n // batch // 2) * batch]]}

    def first_batch(resume: bool) -> None:
        ds = make()
        s = rt.EpisodeSampler(ds)
        if resume:
            s.load_state_dict(mid)
        loader = DataLoader(ds, batch_size=batch, sampler=s, num_workers=2, collate_fn=rt.collate)
        next(iter(loader))

    first_batch(False)  # warm the page cache
    fresh, resumed = [], []
    for _ in range(args.repeats):  # alternated, so load drifts hit both alike
        fresh.append(median_s(lambda: first_batch(False), 1))
        resumed.append(median_s(lambda: first_batch(True), 1))
    out["first_batch_fresh_s"] = statistics.median(fresh)
    out["first_batch_resumed_s"] = statistics.median(resumed)
    out["samples"] = n

    # 4. Throughput A/B on the same DataLoader settings. Wall time on a shared machine swings
    # with other load, so CPU time (this process plus its reaped workers) is reported beside it.
    def epoch_rate(kind: str) -> tuple[float, float]:
        ds = make()
        ds.set_epoch(1)
        s = PreviousSampler(ds) if kind == "previous" else rt.EpisodeSampler(ds)
        loader = DataLoader(ds, batch_size=batch, sampler=s, num_workers=2, collate_fn=rt.collate)
        cpu0 = _cpu_s()
        t = time.perf_counter()
        for _ in loader:
            pass
        wall = time.perf_counter() - t
        del loader  # its workers exit and are reaped: their CPU time is now counted
        return n / wall, (_cpu_s() - cpu0) / n * 1e3

    rates: dict[str, list[float]] = {"previous": [], "episode_sampler": []}
    cpu: dict[str, list[float]] = {"previous": [], "episode_sampler": []}
    for _ in range(args.repeats):
        for kind in rates:
            r, c = epoch_rate(kind)
            rates[kind].append(r)
            cpu[kind].append(c)
    out["throughput"] = {k: statistics.median(v) for k, v in rates.items()}
    out["cpu_ms_per_sample"] = {k: statistics.median(v) for k, v in cpu.items()}
    out["throughput_runs"] = rates
    out["cpu_ms_per_sample_runs"] = cpu
    pairs = [b / a for a, b in zip(rates["previous"], rates["episode_sampler"], strict=True)]
    out["throughput_ratio_median_of_pairs"] = statistics.median(pairs)
    out["cpu_ratio"] = (
        out["cpu_ms_per_sample"]["episode_sampler"] / out["cpu_ms_per_sample"]["previous"]
    )

    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2))
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
