"""A worker's CPU per sample against the decode bound's, in one process, rounds alternated.

On a shared, loaded machine the loader's wall-clock rate and the bound's (``bench.resize
--bound``) are measured at different moments and swing with other jobs (a ratio of 0.5 one run
and 2.2 the next). This compares CPU time instead, both sides in this one process, alternated
round by round: a DataLoader worker's part of a batch (``__getitems__``, ``collate`` as in a
worker, and pickling the batch for the main process, which is what a worker sends) against
decoding the same epoch's frames front to back with the packet decoder (and, for ``rend224``,
the dataset's resize to 224x224 ``"pad"``: ``bench.rows``' bound, in this process). Uses the
data ``bench.resize`` renders (run it once with ``--renditions 240`` first). Within a round the
two sides' units (a batch; a video of the bound) are interleaved in proportion, so that the
load of other jobs on a shared machine meets both alike.

* ``full``: the originals (480x640) at full resolution, against the sequential decode bound.
* ``rend224``: the 240x320 renditions read at ``image_size=(224, 224), resize="pad"``, against
  the decode-and-resize bound.
* ``mixture``: ``bench.mixture_layout``'s mixture (``layout="union"``, 0.5 / 0.5) against its two
  sources alone, each read in its own sampler's order: the fraction is the sources' weighted
  mean CPU per sample over the mixture's (what the mixture would cost with no cost of its
  own; run ``bench.mixture_layout`` once first to render the data).

Prints CPU ms per sample per round and the fraction (bound's median / loader's median).

Usage: ``.venv/bin/python -m bench.cpu_fraction [--rows full rend224 mixture] [--rounds 3]
[--episodes 4]``
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time
import types
from collections.abc import Callable
from multiprocessing.reduction import ForkingPickler
from typing import Any, cast

import numpy as np
import torch
from torch.utils.data._utils import worker

from bench._data import BENCH
from bench.resize import DEMO, dataset, open_slice, renditions_as_videos, renditions_slice_id
from bench.rows import BOUND_CHUNK, _decode_front_to_back, needed_frames
from rayform.torch import EpisodeDataset, EpisodeSampler, MixtureDataset, collate

CAMERAS = ("cam0/rgb", "wrist/rgb")
BATCH = 32


def setup(row: str, episodes: int) -> tuple[EpisodeDataset, list[tuple], int]:
    """The dataset, the bound's decode tasks and the bound's sample count of ``row``."""
    root = BENCH / f"resize-e{episodes}"
    if row == "full":
        slice_ = open_slice(root)
        ds, videos, target = dataset(DEMO, slice_), slice_, None
    else:
        slice_ = open_slice(root, renditions_slice_id(240))
        ds = dataset(DEMO, slice_, image_size=(224, 224), resize="pad")
        targets = ds.spec.targets
        assert targets is not None  # image_size= was given
        videos, target = renditions_as_videos(slice_), targets["cam0/rgb"]
    names = (*CAMERAS, *DEMO.streams)
    tasks = [(*t, BOUND_CHUNK, "intra", target) for t in needed_frames(videos, DEMO.fps, names)]
    samples = len(
        EpisodeDataset(videos, obs=list(CAMERAS), action=DEMO.action, fps=DEMO.fps, shard=None)
    )
    return ds, tasks, samples


def sampler_order(ds: Any) -> list[Any]:
    """One epoch's keys of ``ds`` from its :class:`EpisodeSampler` (a mixture's are tuples)."""
    return list(EpisodeSampler(ds))


def loader_units(ds: Any, order: Any) -> tuple[list[Callable[[], float]], int]:
    """One unit per full batch of ``order``: the CPU seconds of a worker's read, collate and
    send of it (receiving, which frees the slot as the main process does, is not counted);
    and the samples they read."""

    def one(keys: list[Any]) -> float:
        t = time.process_time()
        sent = ForkingPickler.dumps(collate(ds.__getitems__(keys)))
        spent = time.process_time() - t
        ForkingPickler.loads(sent)  # then dropped: the slot is free again
        return spent

    units: list[Callable[[], float]] = []
    for b in range(0, len(order) - BATCH + 1, BATCH):
        part = order[b : b + BATCH]
        units.append(
            functools.partial(one, part.tolist() if isinstance(part, np.ndarray) else part)
        )
    return units, len(units) * BATCH


def bound_units(tasks: list[tuple]) -> list[Callable[[], float]]:
    """One unit per video of the bound: the CPU seconds of its decode (and resize)."""

    def one(task: tuple) -> float:
        t = time.process_time()
        _decode_front_to_back(task)
        return time.process_time() - t

    return [functools.partial(one, task) for task in tasks]


def interleaved(sides: list[list[Callable[[], float]]]) -> list[float]:
    """Every side's units run once, interleaved in proportion (unit ``k`` of a side of ``n``
    at ``k / n`` of the round), so that other jobs' load meets every side alike; each
    side's CPU seconds."""
    events = sorted(
        (k / len(units), i, k) for i, units in enumerate(sides) for k in range(len(units))
    )
    spent = [0.0] * len(sides)
    for _, i, k in events:
        spent[i] += sides[i][k]()
    return spent


def mixture_row(rounds: int, episodes: int, w: float = 0.5) -> None:
    """Prints the mixture's CPU per sample against its sources' weighted mean, per round."""
    from bench.mixture_layout import datasets

    bimanual, single_arm = datasets(BENCH / f"mixture-layout-e{episodes}")
    mixture = MixtureDataset(
        [(bimanual, w, "bimanual"), (single_arm, 1 - w, "single_arm")],
        layout="union",
        num_samples=len(bimanual) + len(single_arm),
    )
    rows = {"bimanual": bimanual, "single_arm": single_arm, "mixture": mixture}
    units = {name: loader_units(ds, sampler_order(ds)) for name, ds in rows.items()}
    sides = [u for u, _ in units.values()]
    interleaved(sides)  # warm: decoders open, files cached
    ms: dict[str, list[float]] = {name: [] for name in rows}
    for _ in range(rounds):
        for name, spent in zip(rows, interleaved(sides), strict=True):
            ms[name].append(spent / units[name][1] * 1e3)
    med = {name: statistics.median(v) for name, v in ms.items()}
    weighted = w * med["bimanual"] + (1 - w) * med["single_arm"]
    print(
        "mixture: "
        + ", ".join(f"{k} {[round(x, 3) for x in v]} ms/sample" for k, v in ms.items())
        + f": {weighted / med['mixture']:.3f} of the sources' weighted mean by CPU"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--rows", nargs="+", choices=("full", "rend224", "mixture"), default=["full", "rend224"]
    )
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--episodes", type=int, default=4)
    args = ap.parse_args()
    torch.set_num_threads(1)  # as a DataLoader worker runs
    # collate as in worker 0 (the batch goes into a shared-memory slot and is pickled).
    info = types.SimpleNamespace(id=0, num_workers=1, seed=0, dataset=None)
    worker._worker_info = cast(Any, info)
    for row in args.rows:
        if row == "mixture":
            mixture_row(args.rounds, args.episodes)
            continue
        ds, tasks, samples = setup(row, args.episodes)
        units, n = loader_units(ds, np.random.default_rng(0).permutation(len(ds)))
        sides = [units, bound_units(tasks)]
        interleaved(sides)  # warm: decoders open, files cached
        loader, bound = [], []
        for _ in range(args.rounds):
            spent = interleaved(sides)
            loader.append(spent[0] / n * 1e3)
            bound.append(spent[1] / samples * 1e3)
        fraction = statistics.median(bound) / statistics.median(loader)
        print(
            f"{row}: loader {[round(x, 3) for x in loader]} ms/sample, bound "
            f"{[round(x, 3) for x in bound]} ms/sample: {fraction:.3f} of the bound by CPU"
        )


if __name__ == "__main__":
    main()
