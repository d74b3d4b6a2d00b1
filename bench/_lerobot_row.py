"""Row 2 of the loader benchmark: ``LeRobotDataset`` with its defaults (runs in the PEER venv).

Usage: ``.peer-venv/bin/python bench/_lerobot_row.py DATASET_DIR OUT_JSON --batches N --runs R
--warmup W --horizon 16 [--image-size S]``. Loads the dataset written by ``bench/make_lerobot_data.py`` with
``LeRobotDataset(repo_id, root=..., delta_timestamps={"action": [i / fps ...]})`` and its
default video backend (torchcodec), then times ``DataLoader(shuffle=True, batch_size=32,
num_workers=2, persistent_workers=True)`` with ``bench/_timing.py``. LeRobot returns images
as float32 in [0, 1] (it has no uint8 option), which is what is timed. With ``--image-size S``
every camera frame is padded to ``S`` x ``S`` by ``image_transforms`` (in the workers, the way
its users train at a smaller size): scaled to fit with ``torch.nn.functional.interpolate(mode=
"bilinear", antialias=True)``, zeros around it. ``--uint8`` passes ``return_uint8=True``
(LeRobot 0.6 and later), so images stay ``uint8`` as ours do. ``--lance``: DATASET_DIR is
the Lance layout of ``lerobot-lancedb`` (``lerobot-lance-convert``; LeRobot 0.6 and later) and
``lerobot_lancedb.LanceDBDataset`` is timed instead, with the same arguments, in a
``DataLoader`` with the ``multiprocessing_context`` its README asks for
(``lance_mp_context()``: Lance is not fork-safe); with ``--remote s3://...`` it reads the
tables from an object store (``bench/remote.py``; storage options in
``$LANCE_STORAGE_OPTIONS``). ``--epoch`` times one whole epoch after its first batch instead of
windows. Writes a JSON object (with the CPU seconds per sample of each window: this process and
all its descendants).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import os
import sys
import time
from pathlib import Path


def _timing():  # noqa: ANN202
    spec = importlib.util.spec_from_file_location(
        "_bench_timing", Path(__file__).with_name("_timing.py")
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class _PadTo:
    """``(C, h, w)`` float image -> ``(C, S, S)``: fitted inside, centred, zeros around it."""

    def __init__(self, size: int) -> None:
        self.size = size

    def __call__(self, image):  # noqa: ANN001, ANN204
        import torch
        import torch.nn.functional as F

        c, h, w = image.shape[-3:]
        scale = min(self.size / h, self.size / w)
        sh, sw = round(h * scale), round(w * scale)
        out = torch.zeros((c, self.size, self.size), dtype=image.dtype)
        top, left = (self.size - sh) // 2, (self.size - sw) // 2
        out[:, top : top + sh, left : left + sw] = F.interpolate(
            image[None], size=(sh, sw), mode="bilinear", antialias=True
        )[0]
        return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("dataset", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--batches", type=int, default=10)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--horizon", type=int, default=16)
    ap.add_argument("--image-size", type=int, default=None)
    ap.add_argument(
        "--uint8", action="store_true", help="return_uint8=True (LeRobot 0.6 and later)"
    )
    ap.add_argument(
        "--lance", action="store_true", help="DATASET is a Lance layout: time LanceDBDataset"
    )
    ap.add_argument(
        "--remote",
        default=None,
        help="with --lance: read the tables from this object-store URI (s3://...) instead, "
        "with the storage options in $LANCE_STORAGE_OPTIONS (JSON); DATASET gives meta/",
    )
    ap.add_argument(
        "--epoch",
        action="store_true",
        help="time one whole epoch of a fresh loader after its first batch (_timing.time_epoch)",
    )
    args = ap.parse_args()

    import torch
    from lerobot.datasets.lerobot_dataset import LeRobotDataset
    from torch.utils.data import DataLoader

    timing = _timing()
    info = json.loads((args.dataset / "meta" / "info.json").read_text())
    fps = info["fps"]
    delta = {"action": [i / fps for i in range(args.horizon)]}
    built: dict = {}
    transform = None if args.image_size is None else _PadTo(args.image_size)

    def make_loader() -> DataLoader:
        t = time.perf_counter()
        kw: dict = {"delta_timestamps": delta, "image_transforms": transform}
        if args.uint8:
            kw["return_uint8"] = True
        extra: dict = {}
        if args.lance:
            from lerobot_lancedb import LanceDBDataset, lance_mp_context

            if args.remote:
                options = json.loads(os.environ.get("LANCE_STORAGE_OPTIONS", "{}"))
                ds = LanceDBDataset(root=args.remote, storage_options=options, **kw)
            else:
                ds = LanceDBDataset(root=args.dataset, **kw)
            extra["multiprocessing_context"] = lance_mp_context()
            built["video_backend"] = "torchcodec over Lance blob ranges"
        else:
            ds = LeRobotDataset("rayform/bench", root=args.dataset, **kw)
            built["video_backend"] = getattr(
                ds, "video_backend", getattr(ds, "_video_backend", None)
            )
        built["construct_s"] = time.perf_counter() - t
        built["len"] = len(ds)
        return DataLoader(ds, **timing.LOADER_KW, **extra)

    def batch_size_of(batch: dict) -> int:
        return int(batch["index"].shape[0])

    versions = {"torch": torch.__version__, "lerobot": importlib.metadata.version("lerobot")}
    if args.lance:
        for dist in ("lerobot-lancedb", "lancedb", "pylance"):
            versions[dist] = importlib.metadata.version(dist)
    if args.epoch:
        res = timing.time_epoch(make_loader, batch_size_of=batch_size_of)
        args.out.write_text(json.dumps({**res, **built, **versions}, indent=1))
        return 0
    res = timing.time_loader(
        make_loader,
        batches=args.batches,
        runs=args.runs,
        warmup_batches=args.warmup,
        log=lambda s: print(s, flush=True),
        batch_size_of=batch_size_of,
    )
    loader = res.pop("loader")
    batch = next(iter(loader))
    cam = next(k for k in batch if k.startswith("observation.images."))
    res.update(built)
    res["image_dtype"] = str(batch[cam].dtype)
    res["image_shape"] = list(batch[cam].shape)
    res["action_shape"] = list(batch["action"].shape)
    res["workers"] = [timing.rss_kib(p) for p in timing.child_pids()]
    res.update(versions)
    args.out.write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
