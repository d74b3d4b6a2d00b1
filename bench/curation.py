"""Benchmark: a filter on labels and episode fields over a fleet-sized slice.

Builds ``rayform-server demo --small --episodes N --share-blobs`` (N segments, version 2
manifest) into a data root, opens it from the store (no network: what is timed is the
selection), gives every episode labels (``success`` bool, ``quality`` number, ``tags``), and
times ``slice_.select(where="success and quality >= 0.7 and version == 1 and duration_s > 1")``:

* **cold**: the first select on a fresh :class:`~rayform.curation.Labels` (the label columns
  are built from the label set, once per key, then the filter runs);
* **warm**: the same select again (columns built; parsing, one kernel per comparison, the
  positions kept), best of 5;
* **tags**: ``'regrasp' in tags and not success``, warm, best of 5.

With ``--loader``, instead: the full demo slice is served with a write token, every other
episode is published as a new slice, and the README loader reads the published slice and the
parent's view of the same episodes in turn (same samples, blobs cached), ``--rounds`` times:
samples/s of each and their ratio.

With ``--create``, also serves the root (``rayform-server serve`` with a write token) and
publishes ``select(where=CREATE_FILTER)`` of the parent with ``client.slices.create``: the
seconds it takes, and the bytes the data root gained against those of its blobs (which must
not change: no blob is written).

Usage::

    python bench/curation.py [--segments 1000000] [--root DIR] [--create]
    python bench/curation.py --loader [--rounds 3]

Writes ``bench/results/curation-<N>.json`` (``curation-loader.json`` with ``--loader``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from rayform.curation import Labels, empty_labelset
from rayform.slice import Slice
from rayform_server.store import Store

SLICE = "slc_7c1e04aa"
HERE = Path(__file__).resolve().parent
FILTER = "success and quality >= 0.7 and version == 1 and duration_s > 1"
TAGS = "'regrasp' in tags and not success"
CREATE_FILTER = "duration_s > 1 and version == 1"


def _bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


@contextlib.contextmanager
def _writer(root: Path, prefix: str) -> Iterator[Any]:
    """A ``rayform.Client`` with a write token on ``root`` served on loopback, with an empty
    cache of its own, until exit."""
    import rayform

    sys.path.insert(0, str(HERE.parent))  # run as a script: bench/ is not a package on the path
    from bench._serve import serving

    write = "w" + "0" * 31
    with (
        tempfile.TemporaryDirectory(prefix=prefix) as cache,
        serving(root, write_token=write) as (url, _),
    ):
        yield rayform.Client(endpoint=url, token=write, cache_dir=cache)


def publish(root: Path) -> dict[str, object]:
    """``client.slices.create`` of a selection of :data:`SLICE` on a served ``root``: seconds,
    and bytes written under the root and under its blobs."""
    blobs, before = _bytes(root / "blobs"), _bytes(root)
    with _writer(root, "curation-create-") as client:
        t0 = time.perf_counter()
        parent = client.slices.get(SLICE)
        got = time.perf_counter() - t0
        view = parent.select(where=CREATE_FILTER)
        t0 = time.perf_counter()
        new = client.slices.create(view, description="bench: a published selection")
        created = time.perf_counter() - t0
        t0 = time.perf_counter()
        again = client.slices.create(view, description="bench: a published selection")
        repeat = time.perf_counter() - t0
    return {
        "filter": CREATE_FILTER,
        "kept": len(view),
        "parent_get_cold_s": round(got, 2),
        "create_s": round(created, 2),
        "create_again_s": round(repeat, 2),
        "same_id_again": again.id == new.id,
        "bytes_written": _bytes(root) - before,
        "blob_bytes_written": _bytes(root / "blobs") - blobs,
    }


def _readme_loader(dataset: object) -> object:
    """The README's loader: batch 64, 2 persistent workers, ``rayform.torch.collate``."""
    from torch.utils.data import DataLoader

    import rayform
    from rayform.torch import EpisodeSampler

    return DataLoader(
        dataset,  # type: ignore[arg-type]
        batch_size=64,
        num_workers=2,
        sampler=EpisodeSampler(dataset, shuffle=True),  # type: ignore[arg-type]
        persistent_workers=True,
        collate_fn=rayform.torch.collate,
    )


def _epoch(loader: object, epoch: int) -> tuple[float, int, list[int]]:
    """One epoch of ``loader``: samples/s, samples, and the first batch's ``t_ns``."""
    loader.dataset.set_epoch(epoch)  # type: ignore[attr-defined]
    n, first = 0, list[int]()
    t0 = time.perf_counter()
    for batch in loader:  # type: ignore[attr-defined]
        if not first:
            first = batch["t_ns"].tolist()
        n += len(batch["t_ns"])
    return n / (time.perf_counter() - t0), n, first


def loader_rates(root: Path, rounds: int) -> dict[str, object]:
    """The README loader on a published slice against its parent's view of the same episodes."""
    from rayform.torch import EpisodeDataset
    from rayform_server import demo

    if not (root / "slices").is_dir():
        demo.build_demo(root, slice_id=SLICE, small=False)
    with _writer(root, "curation-loader-") as client:
        parent = client.slices.get(SLICE)
        ids = [str(i) for i in parent.segments.ids().to_pylist()]
        view = parent.select(segments=ids[::2])
        published = client.slices.create(view, description="bench: every other episode")

        def dataset(slice_: Slice) -> object:
            return EpisodeDataset(
                slice_,
                obs=["cam0/rgb", "wrist/rgb", "joints/position"],
                action="joints/position_delta",
                fps=15,
                horizon=16,
                frame="ros",
            )

        sides = {
            "parent view": _readme_loader(dataset(view)),
            "published": _readme_loader(dataset(published)),
        }
        warm = {name: _epoch(ds, 0) for name, ds in sides.items()}  # fetches every blob once
        if warm["parent view"][1:] != warm["published"][1:]:
            raise RuntimeError("the published slice read other samples than its parent's view")
        rates: dict[str, list[float]] = {name: [] for name in sides}
        for r in range(rounds):
            for name, ds in sides.items():
                rates[name].append(round(_epoch(ds, 1 + r)[0], 1))
    ratios = [p / v for p, v in zip(rates["published"], rates["parent view"], strict=True)]
    return {
        "slice": SLICE,
        "episodes": f"{len(ids[::2])} of {len(ids)}",
        "published": published.id,
        "samples_per_epoch": warm["published"][1],
        "samples_per_s": rates,
        "published_over_parent": [round(x, 3) for x in ratios],
        "median_ratio": round(float(np.median(ratios)), 3),
    }


def _labels(segments: object, ids: list[str], manifest: str) -> Labels:
    rng = np.random.default_rng(0)
    quality = rng.random(len(ids)).round(3).tolist()
    success = (rng.random(len(ids)) < 0.6).tolist()
    doc = empty_labelset(SLICE, manifest)
    doc.update(
        version=1,
        kinds={"quality": "number", "success": "bool", "tags": "tags"},
        episodes={
            e: {"quality": q, "success": s, **({"tags": ["regrasp"]} if i % 7 == 0 else {})}
            for i, (e, q, s) in enumerate(zip(ids, quality, success, strict=True))
        },
    )
    return Labels(doc, "0" * 64, segments)  # type: ignore[arg-type]


def fleet_root(root: Path, segments: int) -> Path:
    """``root`` holding slice :data:`SLICE`: ``rayform-server demo --small --episodes N
    --share-blobs`` (built unless already there; seconds for a million segments)."""
    if not (root / "slices" / f"{SLICE}.json").exists():
        subprocess.run(
            [
                sys.executable,
                "-m",
                "rayform_server",
                "demo",
                "--root",
                str(root),
                "--small",
                "--episodes",
                str(segments),
                "--share-blobs",
            ],
            check=True,
            stdout=subprocess.DEVNULL,
        )
    return root


def _best(fn: object, n: int = 5) -> float:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()  # type: ignore[operator]
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--segments", type=int, default=1_000_000)
    ap.add_argument("--root", type=Path, default=None, help="reuse (or build) this data root")
    ap.add_argument("--create", action="store_true", help="also time slices.create (served)")
    ap.add_argument(
        "--loader",
        action="store_true",
        help="only the README loader on a published slice against its parent (full demo)",
    )
    ap.add_argument("--rounds", type=int, default=3, help="--loader: interleaved epochs per side")
    args = ap.parse_args()
    if args.loader:
        root = args.root or HERE.parent / ".bench" / "curation-loader-root"
        got = loader_rates(root, args.rounds)
        out = HERE / "results" / "curation-loader.json"
        out.write_text(json.dumps(got, indent=2) + "\n")
        print(json.dumps(got, indent=2))
        return
    root = args.root or Path(tempfile.mkdtemp(prefix="curation-bench-")) / "root"
    fleet_root(root, args.segments)
    store = Store(root)
    manifest_hash = str(store.get_slice(SLICE)["manifest"])  # type: ignore[index]
    manifest = store.load_manifest(manifest_hash)
    slice_ = Slice(SLICE, manifest_hash, manifest, client=None)  # type: ignore[arg-type]
    ids = [str(i) for i in slice_.segments.ids().to_pylist()]
    t0 = time.perf_counter()
    labels = _labels(slice_.segments, ids, manifest_hash)
    made = time.perf_counter() - t0
    t0 = time.perf_counter()
    view = slice_.select(where=FILTER, labels=labels)
    cold = time.perf_counter() - t0
    warm = _best(lambda: slice_.select(where=FILTER, labels=labels))
    slice_.select(where=TAGS, labels=labels)
    tags = _best(lambda: slice_.select(where=TAGS, labels=labels))
    result = {
        "segments": len(ids),
        "kept": len(view),
        "filter": FILTER,
        "labels_in_memory_s": round(made, 3),
        "cold_s": round(cold, 3),
        "warm_s": round(warm, 4),
        "tags_warm_s": round(tags, 4),
    }
    if args.create:
        result["create"] = publish(root)
    out = HERE / "results" / f"curation-{len(ids)}.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
