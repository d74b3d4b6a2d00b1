"""Training resolution: the README loader at full resolution against ``image_size=(224, 224)``.

Renders demo episodes with two 480x640 cameras (all-intra, as ingest stores them) into
``.bench/resize-eN/`` once, then times, in alternating rounds on the same data, the README's
loader (``DataLoader(batch_size=32, num_workers=2, shuffle=True, persistent_workers=True,
collate_fn=rayform.torch.collate)`` over both cameras, the joints and a 16-step action chunk at
15 Hz):

* ``full``: frames as stored (today's default);
* ``pad224``: ``image_size=(224, 224), resize="pad"`` (decode, then resize in the worker);
* ``transform224``: frames as stored, resized to the same 224x224 pad in a ``transform`` (how
  users did it before ``image_size``), for reference;
* ``rend224`` (with ``--renditions 240``): the same episodes ingested with 240x320 renditions
  (a second slice in the same root: the originals are the same blobs), ``image_size=(224, 224),
  resize="pad"``: the dataset reads the renditions.

With ``--bound`` (and ``--renditions``) it also measures, in the same run, the sequential decode
bound of the renditions (``bench.rows.sequential_bound``: every frame the 15 Hz grid needs,
decoded front to back once per video, one process per core, the faster of torchcodec and the
packet decoder) and the ``rend224`` loader's fraction of it; and the same decode followed by
the dataset's resize to 224x224 pad, of the renditions and of the originals (the packet
decoder): what a loader at 224 could reach with this resize, and the ``rend224`` and ``pad224``
loaders' fractions of it.

With renditions it also reports their disk cost (bytes of the renditions / the originals'),
the bytes a cold epoch fetches (blobs the 224 dataset reads / the full-resolution dataset's)
and the PSNR per camera of the rendition path against decoding the original and resizing it
(``torch.nn.functional.interpolate(mode="bilinear", antialias=True)``) to the same target.

With ``--lance PYTHON`` (and ``--data bench``) each round also times ``lerobot-lancedb``'s
``LanceDBDataset`` (``bench/_lance.py``; PYTHON: the LeRobot 0.6.1 peer venv with it, from
``scripts/peer_lance.sh``) on the same episodes converted by its ``lerobot-lance-convert``,
uint8 frames, at full resolution (``lance_full``) and padded to 224x224 in a transform in its
workers (``lance224``), and reports Rayform / Lance per round.

Prints samples/s per round, the ratios to ``full`` in the same round, CPU seconds per sample
(the main process and both workers, from ``/proc``: on a shared, loaded machine wall-clock
rates swing with other jobs, CPU per sample much less) and batch bytes per sample; writes
``bench/results/resize.json``. Not part of ``make bench``.

Usage: ``.venv/bin/python -m bench.resize [--episodes 4] [--rounds 3] [--batches 30]
[--renditions 240 [--bound]] [--no-transform] [--data bench [--lerobot] [--lance PYTHON]]
[--out FILE]``
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

from bench import _lance
from bench._data import BENCH, REPO, StoreClient, Workload, manifest_of, prepare, run_lerobot_row
from bench._data import SLICE_ID as BENCH_SLICE_ID
from bench._measure import loadavg, log
from bench._timing import LOADER_KW, child_pids
from rayform.manifest import BlobRef, Manifest, Stream
from rayform.slice import Slice
from rayform.torch import EpisodeDataset, collate
from rayform_server.builder import SliceBuilder
from rayform_server.demo import DemoSpec, build_episode
from rayform_server.store import Store

SLICE_ID = "slc_be4c0480"
#: The slice with renditions at 240 px (the first one measured); other heights get their own.
RENDITIONS_SLICE_ID = "slc_be4c0481"


def renditions_slice_id(height: int) -> str:
    return RENDITIONS_SLICE_ID if height == 240 else f"slc_be4d{height:04x}"


CAMERAS = ["cam0/rgb", "wrist/rgb"]


@dataclasses.dataclass(frozen=True)
class Data:
    """Which episodes are read, and how: the streams, the grid rate and the description."""

    obs: tuple[str, ...]
    action: str
    fps: float
    description: str

    @property
    def streams(self) -> tuple[str, str]:
        """``(state, action)``: what ``bench.rows.sequential_bound`` reads besides the cameras."""
        return self.obs[-1], self.action


#: The demo scene rendered straight into a data root at 30 Hz, read at 15 Hz.
DEMO = Data(
    (*CAMERAS, "joints/position"),
    "joints/position_delta",
    15,
    "demo episodes x 8 s, 2 cameras 480x640 all-intra H.264 at 30 Hz; fps 15",
)
#: The loader benchmark's episodes (written by LeRobot, ingested), read as row 7 reads them.
BENCH_EPISODES = Data(
    (*CAMERAS, "observation/state"),
    "action",
    50,
    "the loader benchmark's episodes (bench/_data.py: LeRobot-written, ingested all-intra "
    "H.264), 2 cameras 480x640 at 50 Hz; fps 50 (row 7)",
)


def build(
    root: Path, episodes: int, slice_id: str = SLICE_ID, renditions: tuple[int, ...] = ()
) -> None:
    """Render ``episodes`` demo episodes of 8 s with 480x640 cameras into ``root`` as
    ``slice_id``, with renditions at the heights ``renditions`` (once)."""
    store = Store(root)
    if (root / "slices" / slice_id).exists() or (root / "slices" / f"{slice_id}.json").exists():
        return
    log(
        f"[bench] rendering {episodes} episodes at 480x640 into {root} as {slice_id} (once; minutes) ..."
    )
    spec = DemoSpec(episodes=episodes, duration_s=(8.0, 8.0), size=(480, 640))
    builder = SliceBuilder(store, description="bench: demo scene at 480x640")
    for i in range(episodes):
        builder.segments.append(build_episode(str(root), spec, 0, i, renditions=renditions))
    builder.commit(slice_id)


def open_slice(root: Path, slice_id: str = SLICE_ID) -> Slice:
    store = Store(root)
    digest = manifest_of(store, slice_id)
    return Slice(slice_id, digest, store.load_manifest(digest), StoreClient(root))


def with_renditions(root: Path, height: int) -> Path:
    """A copy of the data root ``root`` (``.bench/resize-<root name>-rHEIGHT``, made once) whose
    slice lists renditions at ``height`` (``rayform-server renditions``); ``root`` itself is
    left as it is, so the full-resolution rows read a slice without renditions."""
    out = root.with_name(f"resize-{root.name}-r{height}")
    if not (out / "slices").is_dir():
        tmp = out.with_name(out.name + ".partial")
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(root, tmp)
        log(f"[bench] adding {height}-px renditions to a copy of {root} (once; minutes) ...")
        subprocess.run(
            [
                str(Path(sys.executable).parent / "rayform-server"),
                "renditions",
                "--root",
                str(tmp),
                "--slice",
                BENCH_SLICE_ID,
                "--renditions",
                str(height),
                "--jobs",
                str(os.cpu_count() or 1),
                "--quiet",
            ],
            check=True,
        )
        tmp.rename(out)
    return out


def lerobot_row(
    w: Workload,
    batches: int,
    runs: int,
    warmup: int,
    python: str | None = None,
    uint8: bool = False,
) -> dict[str, Any]:
    """``LeRobotDataset`` (``bench/_lerobot_row.py`` in the peer venv, or the interpreter
    ``python``) over ``w``'s dataset with every camera frame padded to 224x224 by a transform
    in its workers; ``uint8``: with ``return_uint8=True`` (LeRobot 0.6 and later)."""
    return run_lerobot_row(
        w,
        BENCH / "lerobot-row-224.json",
        batches=batches,
        runs=runs,
        warmup=warmup,
        python=python,
        extra=("--image-size", "224", *(["--uint8"] if uint8 else [])),
    )


def resize_in_transform(sample: dict[str, Any]) -> dict[str, Any]:
    """A 4:3 frame padded to 224x224 by a user's ``transform`` (one frame at a time): scaled
    to 168x224 with the same interpolation, 28 zero rows above and below."""
    for key in CAMERAS:
        frame = sample[key]
        h, w = frame.shape[-2:]
        sh = round(h * 224 / w)
        out = torch.zeros((3, 224, 224), dtype=torch.uint8)
        top = (224 - sh) // 2
        out[:, top : top + sh] = F.interpolate(
            frame[None].contiguous(), size=(sh, 224), mode="bilinear", antialias=True
        )[0]
        sample[key] = out
    return sample


def rendition_blobs(stream: Stream, chosen: str | None) -> list[BlobRef]:
    """The blobs ``stream`` is read from: the rendition ``chosen`` (``"HxW"``, as the dataset's
    ``describe()["renditions"]`` names it) and the timestamps, else the stream's own."""
    for r in stream.renditions:
        if f"{r.height}x{r.width}" == chosen and stream.timestamps is not None:
            return [r.blob, stream.timestamps]
    return stream.blobs()


def renditions_as_videos(slice_: Slice) -> Slice:
    """``slice_`` with each camera's first rendition in place of its original video (the same
    timestamps and frame count): what the decode bound of the renditions decodes."""
    segments = []
    for seg in slice_.manifest.segments:
        streams = dict(seg.streams)
        for cam in CAMERAS:
            st = streams[cam]
            r = st.renditions[0]
            streams[cam] = dataclasses.replace(
                st, blob=r.blob, shape=(r.height, r.width, 3), renditions=()
            )
        segments.append(dataclasses.replace(seg, streams=streams))
    # Imported here: `--against` runs this module with an SDK from before manifest_hash.
    from rayform.manifest import manifest_hash

    manifest = Manifest(segments=tuple(segments), description="renditions as videos")
    return Slice(slice_.id, manifest_hash(manifest), manifest, slice_.client)


def dataset(data: Data, slice_: Slice, **kw: Any) -> EpisodeDataset:
    return EpisodeDataset(
        slice_, obs=list(data.obs), action=data.action, fps=data.fps, horizon=16, shard=None, **kw
    )


def loader(data: Data, slice_: Slice, **kw: Any) -> DataLoader:
    return DataLoader(dataset(data, slice_, **kw), **LOADER_KW, collate_fn=collate)


def cpu_s(pids: list[int]) -> float:
    """User + system CPU seconds of ``pids`` so far (``/proc/PID/stat``)."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / tick


def time_row(make: Any, batches: int, warmup: int) -> tuple[float, float]:
    """``(samples/s, CPU s per sample)`` over ``batches`` batches after ``warmup``."""
    loader = make()
    stream = iter(loader)
    for _ in range(1 + warmup):
        next(stream)
    pids = [os.getpid(), *child_pids()]
    n, c0, t0 = 0, cpu_s(pids), time.perf_counter()
    for _ in range(batches):
        try:
            batch = next(stream)
        except StopIteration:
            stream = iter(loader)
            batch = next(stream)
        n += int(batch["action"].shape[0])
    dt, dc = time.perf_counter() - t0, cpu_s(pids) - c0
    del stream, loader  # shuts the persistent workers down
    return n / dt, dc / n


def batch_bytes_per_sample(data: Data, slice_: Slice, **kw: Any) -> float:
    batch = next(iter(DataLoader(dataset(data, slice_, **kw), batch_size=32)))
    total = sum(v.nbytes for v in batch.values() if isinstance(v, torch.Tensor))
    return total / int(batch["action"].shape[0])


def rendition_report(data: Data, full: Slice, rend: Slice) -> dict[str, Any]:
    """Disk cost, cold-epoch bytes and PSNR per camera of the renditions of ``rend``."""
    segs = rend.manifest.segments
    originals = sum(seg.streams[c].blob.size for seg in segs for c in CAMERAS)
    stored = sum(r.blob.size for seg in segs for c in CAMERAS for r in seg.streams[c].renditions)
    ds_full = dataset(data, full)
    ds_rend = dataset(data, rend, image_size=(224, 224), resize="pad")
    # What a cold epoch fetches: every blob each dataset reads, once.
    read_full = {
        r.hash: r.size
        for seg in segs
        for n in (*data.obs, data.action)
        for r in seg.streams[n].blobs()
    }
    chosen = ds_rend.describe()["renditions"]
    read_rend = {
        r.hash: r.size
        for seg in segs
        for n in (*data.obs, data.action)
        for r in rendition_blobs(seg.streams[n], chosen.get(n))
    }
    # PSNR over every 5th sample of the first episode, per camera.
    picks = list(range(0, ds_full.segment_lengths[segs[0].id], 5))
    psnr = {}
    for cam in CAMERAS:
        ref = torch.stack([s[cam] for s in ds_full.__getitems__(picks)])
        h, w = ref.shape[-2:]
        sh = round(h * 224 / w)
        top = (224 - sh) // 2
        ref = F.interpolate(ref.contiguous(), size=(sh, 224), mode="bilinear", antialias=True)
        got = torch.stack([s[cam] for s in ds_rend.__getitems__(picks)])[:, :, top : top + sh]
        mse = ((got.double() - ref.double()) ** 2).mean(dim=(1, 2, 3)).clamp_min(1e-12)
        psnr[cam] = float((10 * torch.log10(255.0**2 / mse)).mean())
    return {
        "renditions_read": ds_rend.describe()["renditions"],
        "rendition_disk_fraction_of_originals": stored / originals,
        "cold_epoch_bytes_ratio_rend224_to_full": sum(read_rend.values()) / sum(read_full.values()),
        "psnr_db_rend224_vs_resized_original": psnr,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--episodes", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds of every row")
    ap.add_argument("--batches", type=int, default=30, help="batches per timed window")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--no-transform", action="store_true", help="skip the transform224 row")
    ap.add_argument(
        "--out",
        type=Path,
        default=REPO / "bench" / "results" / "resize.json",
        help="where the JSON results go (default bench/results/resize.json)",
    )
    ap.add_argument(
        "--renditions",
        type=int,
        default=None,
        metavar="HEIGHT",
        help="also time the rend224 row on a slice with renditions at HEIGHT (e.g. 240)",
    )
    ap.add_argument(
        "--bound",
        action="store_true",
        help="with --renditions: the sequential decode bound of the renditions, and the loader's fraction",
    )
    ap.add_argument(
        "--data",
        choices=("demo", "bench"),
        default="demo",
        help="demo: demo episodes rendered at 480x640, 30 Hz, read at 15 Hz (default); bench: "
        "the loader benchmark's 50 Hz episodes (bench/_data.py), read as row 7 reads them",
    )
    ap.add_argument("--frames", type=int, default=400, help="with --data bench: frames per episode")
    ap.add_argument(
        "--lerobot",
        action="store_true",
        help="with --data bench: also time LeRobotDataset (the peer venv) serving the same "
        "224x224 frames, resized in a transform in its workers",
    )
    ap.add_argument(
        "--lerobot-python",
        action="append",
        default=[],
        metavar="PYTHON",
        help="with --lerobot: also time the interpreter of another LeRobot install (e.g. "
        "LeRobot 0.6.1's), with float and with uint8 images; the peer venv of "
        "scripts/peer_lerobot.sh (LeRobot 0.4.4) always runs",
    )
    ap.add_argument(
        "--lance",
        default=None,
        metavar="PYTHON",
        help="with --data bench: in every round also time lerobot-lancedb's LanceDBDataset "
        "(the interpreter of the LeRobot 0.6.1 peer venv with it: scripts/peer_lance.sh) at "
        "full resolution and at 224x224",
    )
    args = ap.parse_args()
    if args.lance and args.data != "bench":
        ap.error("--lance needs --data bench (the LeRobot-written episodes it converts)")
    data = DEMO if args.data == "demo" else BENCH_EPISODES
    workload: Workload | None = None
    if args.data == "demo":
        root = BENCH / f"resize-e{args.episodes}"
        build(root, args.episodes)
        slice_ = open_slice(root)
    else:
        workload = Workload(args.episodes, args.frames)
        prepare(workload, log)
        slice_ = open_slice(workload.root, BENCH_SLICE_ID)
    rows: dict[str, dict[str, Any]] = {
        "full": {},
        "pad224": {"image_size": (224, 224), "resize": "pad"},
    }
    if not args.no_transform:
        rows["transform224"] = {"transform": resize_in_transform}
    slices = dict.fromkeys(rows, slice_)
    extra: dict[str, Any] = {}
    if args.renditions:
        if workload is None:
            rend_id = renditions_slice_id(args.renditions)
            build(root, args.episodes, rend_id, (args.renditions,))
            slices["rend224"] = open_slice(root, rend_id)
        else:
            rend_root = with_renditions(workload.root, args.renditions)
            slices["rend224"] = open_slice(rend_root, BENCH_SLICE_ID)
        rows["rend224"] = {"image_size": (224, 224), "resize": "pad"}
        extra = rendition_report(data, slice_, slices["rend224"])
    peer = _lance.Peer(workload, args.lance, log) if args.lance and workload else None
    names = [*rows, *(peer.rows if peer else ())]
    rates: dict[str, list[float]] = {name: [] for name in names}
    cpu: dict[str, list[float]] = {name: [] for name in names}
    ratios: dict[str, list[float]] = {name: [] for name in rows if name != "full"}
    loads = []
    for r in range(args.rounds):
        this: dict[str, float] = {}
        for name in names:
            loads.append(loadavg())
            if name in rows:
                rate, cpu_per = time_row(
                    lambda name=name: loader(data, slices[name], **rows[name]),
                    args.batches,
                    args.warmup,
                )
            else:  # a peer's row, in a fresh process of its venv
                rate, cpu_per = peer.time(name, args.batches, args.warmup)  # type: ignore[union-attr]
            log(
                f"[bench] round {r + 1}/{args.rounds}: {name}: {rate:.1f} samples/s, "
                f"{cpu_per * 1e3:.2f} ms CPU per sample"
            )
            this[name] = rate
            rates[name].append(rate)
            cpu[name].append(cpu_per)
        for name in ratios:
            ratios[name].append(this[name] / this["full"])
    if peer:
        extra.update(peer.report(), rayform_over_lance=_lance.over_lance(rates, cpu))
    if args.bound and args.renditions:
        from bench.rows import sequential_bound

        bound = sequential_bound(
            renditions_as_videos(slices["rend224"]), data.fps, streams=data.streams
        )
        log(
            f"[bench] sequential decode bound of the {args.renditions} renditions: "
            f"{bound['samples_per_s']:.1f} samples/s ({bound['decoder']})"
        )
        extra["rendition_bound"] = bound
        extra["rend224_fraction_of_rendition_bound"] = (
            statistics.median(rates["rend224"]) / bound["samples_per_s"]
        )
        # The same decode plus the dataset's resize to 224x224 pad and nothing else: what a
        # loader at 224 could reach with this resize kernel (the renditions and the originals).
        for name, key, source in (
            ("rend224", "rendition_resize_bound", renditions_as_videos(slices["rend224"])),
            ("pad224", "original_resize_bound", slice_),
        ):
            res = sequential_bound(
                source,
                data.fps,
                streams=data.streams,
                decoders=("intra",),
                resize_to=(224, 224, "pad"),
            )
            log(
                f"[bench] sequential decode and resize to 224x224 pad ({key}): "
                f"{res['samples_per_s']:.1f} samples/s"
            )
            extra[key] = res
            extra[f"{name}_fraction_of_{key}"] = (
                statistics.median(rates[name]) / res["samples_per_s"]
            )
    if args.lerobot and workload is not None:
        # The peer venv's LeRobot (0.4.4, float images: it has no uint8 option), then each
        # --lerobot-python with its defaults and with return_uint8=True.
        extra["lerobot224"] = {}
        runs = [(None, False)] + [(p, u) for p in args.lerobot_python for u in (False, True)]
        for python, uint8 in runs:
            res = lerobot_row(workload, args.batches, args.rounds, args.warmup, python, uint8)
            version = str(res.get("lerobot", "0.4.4")) + (" uint8" if uint8 else "")
            extra["lerobot224"][version] = res
            rate = res["samples_per_s"]
            log(
                f"[bench] LeRobotDataset {version} at 224x224 (transform in its workers): "
                f"{rate:.1f} samples/s"
            )
            if "rend224" in rates:
                extra.setdefault("rend224_over_lerobot224", {})[version] = (
                    statistics.median(rates["rend224"]) / rate
                )
    sizes = {
        name: batch_bytes_per_sample(data, slices[name], **kw)
        for name, kw in rows.items()
        if name != "transform224"
    }
    out = {
        "data": f"{args.episodes} {data.description}"
        + (f", {args.frames} frames each" if workload else ""),
        "loader": "README loader: batch 32, 2 workers, shuffle, persistent, rayform.torch.collate; "
        f"fps {data.fps:g}, horizon 16",
        "samples_per_s": rates,
        "median_samples_per_s": {k: statistics.median(v) for k, v in rates.items()},
        "ratio_to_full_same_round": ratios,
        "median_ratio_to_full": {k: statistics.median(v) for k, v in ratios.items()},
        "cpu_ms_per_sample": {k: [x * 1e3 for x in v] for k, v in cpu.items()},
        "median_cpu_ms_per_sample": {k: statistics.median(v) * 1e3 for k, v in cpu.items()},
        "batch_bytes_per_sample": sizes,
        "bytes_ratio_pad224_to_full": sizes["pad224"] / sizes["full"],
        "loadavg_1min": loads,
        **extra,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    log(
        json.dumps(
            {
                k: out[k]
                for k in (
                    "median_samples_per_s",
                    "median_ratio_to_full",
                    "median_cpu_ms_per_sample",
                    "bytes_ratio_pad224_to_full",
                    *extra,
                )
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
