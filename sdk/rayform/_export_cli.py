"""``rayform export SLICE DIR --format lerobot``: the subcommand's arguments and its handler.

Kept apart from ``rayform.cli`` so that the command line's core stays small. The export needs
torch (it reads frames through ``EpisodeDataset``): its module is loaded by name when the
command runs, as ``rayform.torch`` itself is (``import rayform`` never needs torch).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import Any

from rayform import lerobot_layout
from rayform._cliargs import ListOption, Parser, torch_module
from rayform._resolution import RESIZE_MODES, check_size_value, parse_image_size
from rayform.errors import InvalidArgumentError

__all__ = ["add_export_parser"]

FORMATS = ("lerobot",)


def _stream_pair(text: str) -> tuple[str, str]:
    name, eq, feature = text.partition("=")
    if not eq or not name or not feature:
        raise argparse.ArgumentTypeError(
            f"{text!r}: write STREAM=FEATURE, e.g. cam0/rgb=observation.images.cam0"
        )
    return name, feature


def _cmd_export(args: argparse.Namespace, client_of: Callable[[argparse.Namespace], Any]) -> int:
    if args.resize is not None and args.image_size is None:
        raise InvalidArgumentError(
            f"--resize {args.resize} without --image-size: add --image-size HxW, or leave "
            "--resize out"
        )
    image_size = parse_image_size(args.image_size) if args.image_size else None
    check_size_value(image_size, args.resize or "pad")
    lerobot = torch_module("rayform.torch.lerobot", "rayform export")
    slice_ = client_of(args).slices.get(args.slice_id)
    segments = [i.strip() for item in args.segments or [] for i in item.split(",") if i.strip()]
    if args.segments is not None and not segments:
        raise InvalidArgumentError(
            f"--segments {' '.join(args.segments)!r} names no episode: give IDs such as "
            "--segments seg_26294da5e6984c17, or leave --segments out to export them all"
        )
    if segments or args.sites:
        slice_ = slice_.select(segments=segments or None, sites=args.sites)
    report = lerobot.export_lerobot(
        slice_,
        args.dir,
        streams=dict(args.stream) if args.stream else None,
        fps=args.fps,
        image_size=image_size,
        resize=args.resize or "pad",
        version=args.lerobot_version,
        task=args.task,
        robot_type=args.robot_type,
        jobs=args.jobs,
        progress=not args.quiet and not args.json,
        episodes_per_file=args.episodes_per_file,
        reencode=args.reencode,
    )
    if args.json:
        doc = {k: str(v) if k == "path" else v for k, v in vars(report).items()}
        print(json.dumps(doc, indent=2, sort_keys=True))
    elif not args.quiet:
        print(report.summary())
    return 0


def add_export_parser(
    sub: argparse._SubParsersAction[Parser],
    common: Parser,
    client_of: Callable[[argparse.Namespace], Any],
) -> None:
    """Add ``export`` to the ``rayform`` subcommands ``sub``."""
    p = sub.add_parser(
        "export",
        parents=[common],
        help="write a slice as a LeRobot dataset",
        description="Write a slice (or some of its episodes) as a LeRobot dataset in DIR: "
        "meta/, chunked Parquet data and MP4 videos that LeRobotDataset loads. Resumable: "
        "run the same command again after an interruption. docs/lerobot.md",
    )
    p.add_argument("slice_id", metavar="SLICE_ID", help="e.g. slc_7c1e04aa")
    p.add_argument("dir", metavar="DIR", help="the dataset's directory (new or empty)")
    p.add_argument("--format", choices=FORMATS, required=True, help="the dataset format")
    p.add_argument(
        "--lerobot-version",
        choices=lerobot_layout.VERSIONS,
        default=lerobot_layout.VERSIONS[0],
        help="LeRobot codebase version (default 3.0; 2.1 for openpi and GR00T)",
    )
    p.add_argument(
        "--stream",
        action="append",
        type=_stream_pair,
        metavar="STREAM=FEATURE",
        help="export STREAM as LeRobot feature FEATURE (repeat; when given, only these "
        "streams are exported), e.g. joints/position=observation.state",
    )
    p.add_argument(
        "--fps",
        type=float,
        default=None,
        help="the dataset's rate (default: the cameras', or the tables' shared rate)",
    )
    p.add_argument(
        "--image-size",
        metavar="HxW",
        default=None,
        help="cameras at this size (e.g. 224x224, or cam0/rgb:224x224,...), from the "
        "smallest stored rendition that covers it",
    )
    p.add_argument(
        "--resize", choices=RESIZE_MODES, default=None, help="with --image-size (default pad)"
    )
    p.add_argument(
        "--task",
        default=None,
        help="task string of every frame (default: the slice's task stream, else the slice ID)",
    )
    p.add_argument("--robot-type", default=None, help="robot_type of meta/info.json")
    p.add_argument(
        "--segments",
        nargs="+",
        action=ListOption,
        metavar="ID",
        help="only these episodes (IDs separated by spaces or commas)",
    )
    # Sites are free text, which may hold a comma: only spaces separate them, unlike IDs.
    p.add_argument(
        "--sites", nargs="+", action=ListOption, metavar="SITE", help="only episodes of these sites"
    )
    p.add_argument(
        "--episodes-per-file",
        type=int,
        default=None,
        metavar="N",
        help="v3.0: episodes per data/video file (default: about 200 MB of source per file)",
    )
    p.add_argument(
        "--reencode",
        action="store_true",
        help="decode and encode every camera (default: copy the stored frames where the "
        "slice's video is all-intra H.264 at the exported size)",
    )
    p.add_argument("--jobs", "-j", type=int, default=1, help="files written in parallel")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress bar or summary")
    p.set_defaults(func=lambda args: _cmd_export(args, client_of))
