"""``export_lerobot``: a slice (or a ``select()`` view) as a LeRobot dataset on disk.

Row ``k`` of an episode is grid step ``k`` of an :class:`~rayform.torch.EpisodeDataset` over
the exported streams at ``fps`` (its grid, alignment, renditions and resizing; ``_writer``),
its ``timestamp`` ``k / fps`` as LeRobot writes it.

Resumable: the plan (``DIR/.rayform-export/plan.json``) is fixed before any frame is read;
every file is written to a temporary name and renamed; a file group that is complete gets
``unit-NNNNNN.json`` (its episodes' statistics). A rerun with the same arguments skips the
groups that have one. ``meta/info.json`` is written last and the work directory removed:
a dataset with ``info.json`` is complete.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from torch.utils.data import DataLoader

from rayform import lerobot_layout as layout
from rayform._net import bar_size_options
from rayform.errors import InvalidArgumentError
from rayform.torch._index import build_index
from rayform.torch.dataset import EpisodeDataset
from rayform.torch.lerobot import _format as fmt
from rayform.torch.lerobot._copy import copyable
from rayform.torch.lerobot._language import pick_language
from rayform.torch.lerobot._meta import write_meta
from rayform.torch.lerobot._plan import (
    Plan,
    check_version,
    make_plan,
    pick_features,
)
from rayform.torch.lerobot._writer import WORK_DIR, UnitWriter

if TYPE_CHECKING:
    from rayform.slice import Slice

__all__ = ["ExportReport", "export_lerobot"]

_T = TypeVar("_T")


@dataclass(frozen=True)
class ExportReport:
    """What :func:`export_lerobot` did.

    Attributes:
        path: the dataset's root directory.
        version: ``"3.0"`` or ``"2.1"``.
        episodes: episodes in the dataset.
        frames: frames (rows) in the dataset.
        files_written: file groups written by this call.
        files_reused: file groups a previous, interrupted call had completed.
        seconds: wall time of this call.
        nbytes: bytes of the dataset on disk.
        fps: the dataset's rate.
        fps_from: where the rate came from: ``"fps"`` (given), ``"cameras"`` (the default:
            the exported cameras' rate) or ``"streams"`` (no camera: the tables' shared rate).
        features: ``{LeRobot feature: stream}`` of what was exported.
    """

    path: Path
    version: str
    episodes: int
    frames: int
    files_written: int
    files_reused: int
    seconds: float
    nbytes: int
    fps: float | None = None
    fps_from: str | None = None
    features: Mapping[str, str] | None = None

    def summary(self) -> str:
        """One line for a terminal."""
        from rayform.units import human_bytes

        reused = f", {self.files_reused} reused from an earlier run" if self.files_reused else ""
        rate = ""
        if self.fps is not None:
            why = {
                "cameras": " (the cameras' rate; --fps to choose)",
                "streams": " (the streams' rate)",
            }
            rate = f" at {self.fps:g} fps{why.get(self.fps_from or '', '')}"
        return (
            f"exported {self.episodes} episodes, {self.frames} frames{rate} as LeRobot v{self.version} "
            f"to {self.path} ({human_bytes(self.nbytes)}; {self.files_written} file groups "
            f"written{reused}) in {self.seconds:.1f} s"
        )


def _identity(x: _T) -> _T:
    return x


def _default_fps(
    slice_: Slice, streams: Mapping[str, str], kinds: Mapping[str, str]
) -> tuple[float, str]:
    """The rate of an export without ``fps``, and where it came from: the cameras' (every row a
    frame of each: no frame dropped or repeated), else the tables' when they share one."""
    seg = slice_.segments[0]
    cameras = [s for f, s in streams.items() if kinds[f] == "video"]
    source, named = ("cameras", cameras) if cameras else ("streams", list(streams.values()))
    rates = {round(seg.streams[s].rate_hz, 6) for s in named if s in seg.streams}
    if len(rates) != 1:
        raise InvalidArgumentError(
            f"the exported {'cameras' if cameras else 'streams'} have different rates "
            f"({', '.join(f'{r:g}' for r in sorted(rates))} Hz): choose the dataset's rate with "
            "--fps (fps=...)"
        )
    return float(rates.pop()), source


def export_lerobot(
    slice_: Slice,
    path: str | os.PathLike[str],
    *,
    streams: Mapping[str, str] | None = None,
    fps: float | None = None,
    image_size: tuple[int, int] | dict[str, tuple[int, int]] | None = None,
    resize: str = "pad",
    version: str = "3.0",
    task: str | None = None,
    robot_type: str | None = None,
    jobs: int = 1,
    progress: bool = False,
    crf: int = 18,
    gop: int = 2,
    episodes_per_file: int | None = None,
    reencode: bool = False,
) -> ExportReport:
    """Write ``slice_`` (a slice or a ``select()`` view) as a LeRobot dataset in ``path``.

    Args:
        slice_: from ``client.slices.get(...)``, or ``slice_.select(...)``.
        path: the dataset's root directory (created; must be empty or hold an interrupted
            export of the same arguments, which is continued).
        streams: ``{stream name: LeRobot feature}``, e.g. ``{"cam0/rgb":
            "observation.images.cam0", "joints/position": "observation.state"}``; only these
            are exported. Default: every stream, named as in :func:`default_feature_name`
            (``top/rgb`` -> ``observation.images.top``, ``observation/state`` ->
            ``observation.state``), the reverse of ``rayform-server ingest lerobot``; in a
            slice with neither ``observation/state`` nor ``action``, a table stream ``P`` with
            ``P_delta`` beside it (``joints/position``, ``joints/position_delta``) becomes
            ``observation.state`` and ``P_delta`` ``action``.
        fps: the dataset's rate; rows lie on this grid, each stream's latest record at or
            before the row's time (as ``EpisodeDataset(fps=...)`` aligns). Default: the
            exported cameras' rate (tables at other rates are resampled onto it), or without
            cameras the tables' rate when they share one.
        image_size: cameras at this size ``(H, W)`` (or ``{stream: (H, W)}``), from the
            smallest stored rendition that covers it, as ``EpisodeDataset(image_size=...)``.
        resize: ``"pad"``, ``"squash"`` or ``"crop"`` (with ``image_size``).
        version: ``"3.0"`` (default) or ``"2.1"``.
        task: the task string of every frame. Default: each frame's task from the slice's
            ``task`` text stream, where it has one (a frame before an episode's first task
            record gets the slice ID), else the slice ID. The slice's other text streams
            become LeRobot's ``language_persistent`` and ``language_events`` columns
            (``_language``); ``streams`` may map a text stream to ``task``,
            ``language_persistent`` or ``language_events``.
        robot_type: ``robot_type`` of ``info.json``.
        jobs: file groups written in parallel processes.
        progress: show a progress bar (frames).
        crf: x264 quality of the videos (lower: better, larger; 18 is visually lossless).
        gop: keyframe interval of the videos, frames (LeRobot writes 2: cheap random access).
        episodes_per_file: v3.0: episodes per data/video file (default: about 200 MB of
            source per file, as LeRobot's files).
        reencode: always decode and encode the cameras. By default a camera stored all-intra
            H.264 (the ingest's default) exported at its stored size has its packets copied:
            the slice's exact pixels, no decoding (``crf`` and ``gop`` then do not apply; every
            frame is a keyframe).

    Returns:
        An :class:`ExportReport`.

    Raises:
        InvalidArgumentError: a bad argument, or ``path`` holds something else.
        NotFoundError: a stream is not in every episode.
    """
    t_start = time.monotonic()
    version = check_version(version)
    if not isinstance(jobs, int) or jobs < 1:
        raise InvalidArgumentError(f"jobs={jobs!r}: use a positive integer")
    root = Path(path)
    mapping, kinds = pick_features(slice_, streams)
    language, _ = pick_language(slice_, streams, task)
    if fps is None:
        fps, fps_from = _default_fps(slice_, mapping, kinds)
    else:
        fps, fps_from = float(fps), "fps"
    action = {"action": mapping["action"]} if "action" in mapping else None
    obs = {k: s for k, s in mapping.items() if k != "action"}
    ds = EpisodeDataset(
        slice_,
        obs=obs,
        action=action,
        fps=fps,
        shard=None,
        image_size=image_size,
        resize=resize,
        readahead_bytes=0,
    )
    cameras = [k for k in mapping if kinds[k] == "video"]
    features = _features(ds, mapping, cameras, language.columns)
    copy = (
        not reencode
        and image_size is None
        and all(copyable(list(ds.segments), mapping[k]) for k in cameras)
    )
    lengths = list(ds.segment_lengths.values())
    source = [
        sum(seg.streams[s].nbytes for s in mapping.values() if s in seg.streams)
        for seg in ds.segments
    ]
    plan = make_plan(lengths, source, version, episodes_per_file)
    starts = build_index(ds.segments, list(mapping.values()), fps).start_ns
    language = language.needing_fallback(
        [ds.segments[p] for p in plan.positions], [int(starts[p]) for p in plan.positions]
    )
    if not plan.positions:
        raise InvalidArgumentError(
            f"no episode of slice {slice_.id} has a frame at {fps:g} fps where every exported "
            "stream has a record"
        )
    identity = {
        "slice": slice_.id,
        "manifest": slice_.manifest_hash,
        "selection": slice_.selection,
        "streams": mapping,
        "fps": fps,
        "image_size": image_size,
        "resize": resize if image_size else None,
        "version": version,
        "task": task or slice_.id,
        "language": language.to_json(),
        "crf": crf,
        "gop": gop,
        "copy": copy,
        "plan": plan.to_json(),
    }
    done = _start(root, identity)
    if done is None:
        return ExportReport(
            root,
            version,
            len(plan.positions),
            sum(plan.lengths),
            0,
            len(plan.units),
            time.monotonic() - t_start,
            _du(root),
            fps,
            fps_from,
            dict(mapping),
        )
    pending = [u for u in plan.units if u.file not in done]
    writer = UnitWriter(
        ds, root, plan, features, mapping, cameras, copy, version, crf, gop, pending, language
    )
    bar = _bar(sum(plan.lengths), progress, f"export {slice_.id}")
    for u in plan.units:
        if u.file in done:
            bar.update(sum(plan.lengths[e] for e in u.episodes))
    results: Iterator[dict[str, Any]]
    if jobs == 1:
        writer.progress = bar.update  # episode by episode
        results = (writer[i] for i in range(len(writer)))
    else:
        results = iter(
            DataLoader(
                writer,
                batch_size=None,
                num_workers=min(jobs, len(writer)) if pending else 0,
                collate_fn=_identity,
            )
        )
    for doc in results:
        done[doc["file"]] = doc
        if jobs > 1:  # workers report whole file groups
            bar.update(sum(ep["length"] for ep in doc["episodes"]))
    bar.refresh()  # updates within tqdm's mininterval are not drawn; show the end state
    bar.close()
    _finish(root, identity, plan, features, cameras, done, robot_type, ds)
    return ExportReport(
        root,
        version,
        len(plan.positions),
        sum(plan.lengths),
        len(pending),
        len(plan.units) - len(pending),
        time.monotonic() - t_start,
        _du(root),
        fps,
        fps_from,
        dict(mapping),
    )


def _du(root: Path) -> int:
    return sum(f.stat().st_size for f in root.rglob("*") if f.is_file())


def _bar(total: int, show: bool, desc: str) -> Any:
    from tqdm.std import tqdm

    return tqdm(
        total=total,
        unit="frame",
        desc=desc,
        disable=not show,
        leave=False,
        file=sys.stderr,
        **bar_size_options(sys.stderr),
    )


def _features(
    ds: EpisodeDataset,
    mapping: dict[str, str],
    cameras: list[str],
    language: dict[str, dict[str, Any]],
) -> dict[str, dict[str, Any]]:
    """``info.json``'s features of the recorded streams (cameras left out: ``_video_features``)."""
    spec = ds.sample_spec()
    out: dict[str, dict[str, Any]] = {}
    for key, stream in mapping.items():
        if key in cameras:
            continue
        width = int(spec[key][1][-1])
        dtype = ds.stream(stream).dtype
        out[key] = {
            "dtype": "float32" if dtype == "float16" else dtype,
            "shape": [width],
            "names": None,
        }
    return {**out, **language, **layout.BOOKKEEPING_FEATURES}


def _start(root: Path, identity: dict[str, Any]) -> dict[int, dict[str, Any]] | None:
    """Check ``root`` and load the units an interrupted export of the same arguments left
    (``None``: ``root`` holds this export, complete)."""
    work = root / WORK_DIR
    plan_file = work / "plan.json"
    if plan_file.is_file():
        previous = json.loads(plan_file.read_text())
        if previous != json.loads(json.dumps(identity)):
            raise InvalidArgumentError(
                f"{root} holds an interrupted export of other arguments (another slice, "
                "manifest, selection, mapping or options): rerun that export to finish it, or "
                "export to an empty directory"
            )
        done = {}
        for f in sorted(work.glob("unit-*.json")):
            doc = json.loads(f.read_text())
            done[int(doc["file"])] = doc
        return done
    info = root / layout.INFO
    if info.is_file() and not work.exists():
        export = json.loads(info.read_text()).get("rayform", {}).get("export")
        if export == json.loads(json.dumps(identity)):
            return None  # complete: nothing to do
        raise InvalidArgumentError(
            f"{root} holds a complete export of other arguments"
            + (f" (slice {export.get('slice')})" if isinstance(export, dict) else "")
            + ": export into a new or empty directory"
        )
    if root.exists() and any(root.iterdir()):
        raise InvalidArgumentError(
            f"{root} is not empty: export into a new or empty directory (an interrupted "
            "export continues only in its own directory)"
        )
    fmt.write_json(plan_file, identity)
    return {}


def _finish(
    root: Path,
    identity: dict[str, Any],
    plan: Plan,
    features: dict[str, dict[str, Any]],
    cameras: list[str],
    done: dict[int, dict[str, Any]],
    robot_type: str | None,
    ds: EpisodeDataset,
) -> None:
    write_meta(root, identity, plan, features, cameras, done, robot_type, ds)
    shutil.rmtree(root / WORK_DIR, ignore_errors=True)
    for tmp in root.rglob(".*.tmp"):  # left by a killed run
        tmp.unlink(missing_ok=True)
