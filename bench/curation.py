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

With ``--create``, also serves the root (``rayform-server serve`` with a write token) and
publishes ``select(where=CREATE_FILTER)`` of the parent with ``client.slices.create``: the
seconds it takes, and the bytes the data root gained against those of its blobs (which must
not change: no blob is written).

Usage::

    python bench/curation.py [--segments 1000000] [--root DIR] [--create]

Writes ``bench/results/curation-<N>.json``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

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


def publish(root: Path) -> dict[str, object]:
    """``client.slices.create`` of a selection of :data:`SLICE` on a served ``root``: seconds,
    and bytes written under the root and under its blobs."""
    import rayform

    sys.path.insert(0, str(HERE.parent))  # run as a script: bench/ is not a package on the path
    from bench._serve import serving

    write = "w" + "0" * 31
    blobs, before = _bytes(root / "blobs"), _bytes(root)
    with (
        tempfile.TemporaryDirectory(prefix="curation-create-") as cache,
        serving(root, write_token=write) as (url, _),
    ):
        client = rayform.Client(endpoint=url, token=write, cache_dir=cache)
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
    args = ap.parse_args()
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
