"""The Lance peer row: ``lerobot-lancedb``'s ``LanceDBDataset`` on the loader benchmark's episodes.

``lerobot-lancedb`` (scripts/peer_lance.sh installs it into the LeRobot 0.6.1 peer venv)
converts a LeRobot v3.0 dataset into three Lance tables beside a copy of its ``meta/``:
``frames.lance`` (one row per frame, the tabular features), ``videos.lance`` (each MP4 verbatim
as a blob, with a keyframe byte index) and ``meta.lance``; ``LanceDBDataset`` reads a batch's
rows in one read, fetches the byte ranges of the frames it needs and decodes them with
torchcodec. This module converts the benchmark's LeRobot dataset once, with the package's own
``lerobot-lance-convert``, and times one window of the loader in the peer venv
(``bench/_lerobot_row.py --lance``), so that ``bench.resize`` can alternate it with its rows.
"""

from __future__ import annotations

import json
import statistics
import subprocess
from pathlib import Path
from typing import Any

from bench._data import BENCH, Workload, peer_env, run_lerobot_row

__all__ = ["PAIRS", "Peer", "convert", "layout", "over_lance"]


def convert(w: Workload, python: str, log: Any = print) -> Path:
    """``w``'s LeRobot dataset in the Lance layout (``.bench/lance-eE-fF``, converted once by
    ``lerobot-lance-convert`` beside ``python``)."""
    out = BENCH / f"lance-{w.tag}"
    if not (out / "videos.lance").is_dir():
        tmp = out.with_name(out.name + ".partial")
        subprocess.run(["rm", "-rf", str(tmp)], check=True)
        log(f"[bench] converting {w.lerobot_dir} to the Lance layout in {out} ...")
        subprocess.run(
            [
                str(Path(python).parent / "lerobot-lance-convert"),
                "--root",
                str(w.lerobot_dir),
                "--out",
                str(tmp),
            ],
            check=True,
            env=peer_env(),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        tmp.rename(out)
    return out


class Peer:
    """``LanceDBDataset`` on ``w``'s episodes in the venv of ``python``: the rows :attr:`rows`
    (``lance_full``: uint8 frames as stored; ``lance224``: padded to 224x224 by a transform in
    its workers, as the LeRobot rows are), each timed for one window in a fresh process."""

    rows = ("lance_full", "lance224")

    def __init__(self, w: Workload, python: str, log: Any = print) -> None:
        self.w, self.python = w, python
        self.root = convert(w, python, log)
        self.versions: dict[str, str] = {}

    def time(self, row: str, batches: int, warmup: int) -> tuple[float, float]:
        """``(samples/s, CPU s per sample)`` of one window of ``batches`` after ``warmup``."""
        size = {"lance_full": None, "lance224": 224}[row]
        res = run_lerobot_row(
            self.w,
            BENCH / f"{row}.json",
            batches=batches,
            runs=1,
            warmup=warmup,
            python=self.python,
            dataset=self.root,
            extra=("--lance", "--uint8", *(["--image-size", str(size)] if size else [])),
        )
        self.versions = {k: res[k] for k in ("lerobot-lancedb", "lancedb", "pylance", "lerobot")}
        self.versions["torch"] = res["torch"]
        return float(res["samples_per_s"]), float(res["cpu_s_per_sample"])

    def report(self) -> dict[str, Any]:
        """The layout (:func:`layout`) and the versions timed."""
        return {"lance_layout": layout(self.w, self.root), "lance_versions": self.versions}


def layout(w: Workload, root: Path) -> dict[str, Any]:
    """What the Lance layout stores: bytes per table, against the LeRobot dataset's."""

    def size(path: Path) -> int:
        return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())

    info = json.loads((root / "meta" / "info.json").read_text())
    codecs = {
        k: v["info"]["video.codec"]
        for k, v in info["features"].items()
        if v.get("dtype") == "video" and "info" in v
    }
    return {
        "tables_bytes": {p.name: size(p) for p in sorted(root.glob("*.lance"))},
        "lance_bytes": size(root),
        "lerobot_bytes": size(w.lerobot_dir),
        "storage_format": info.get("storage_format"),
        "video_codecs": codecs,
    }


#: Each Rayform row of ``bench.resize`` and the Lance row it is compared with.
PAIRS = {"full": "lance_full", "pad224": "lance224", "rend224": "lance224"}


def over_lance(rates: dict[str, list[float]], cpu: dict[str, list[float]]) -> dict[str, Any]:
    """Rayform / Lance per round, for each pair of :data:`PAIRS` that was timed: samples/s
    (Rayform's over Lance's) and CPU per sample (Lance's over Rayform's), with medians."""
    out: dict[str, Any] = {}
    for ours, theirs in PAIRS.items():
        if ours not in rates or theirs not in rates:
            continue
        wall = [a / b for a, b in zip(rates[ours], rates[theirs], strict=True)]
        by_cpu = [b / a for a, b in zip(cpu[ours], cpu[theirs], strict=True)]
        out[f"{ours}_over_{theirs}"] = {
            "samples_per_s": wall,
            "median_samples_per_s": statistics.median(wall),
            "cpu_per_sample": by_cpu,
            "median_cpu_per_sample": statistics.median(by_cpu),
        }
    return out
