"""``rayform-server ingest``: turn LeRobot datasets and ROS 2 MCAP bags into slices.

Python API: :func:`ingest_lerobot` and :func:`ingest_mcap`, whose ``progress=`` takes a
:class:`Progress` (``Progress(None)``: quiet). The server CLI registers the
``ingest`` subcommand through :func:`add_parser`::

    rayform-server ingest lerobot --root DATA_ROOT --slice SLICE_ID PATH [--stream NAME=FEATURE ...] [--site SITE]
    rayform-server ingest mcap --root DATA_ROOT --slice SLICE_ID FILE... [--stream NAME=TOPIC[:FIELD] ...] [--site SITE]

Either takes ``--stage BATCH [--shard I/N]`` to be one worker of a distributed ingest, or
``--ray [ADDRESS]`` to run its shards as Ray tasks and commit once (docs/ray.md).

See ``docs/ingest-lerobot.md`` and ``docs/ingest-mcap.md``.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

from rayform.errors import InvalidArgumentError, RayformError
from rayform_server._renditions import heights_argument
from rayform_server._video import DEFAULT_GOP
from rayform_server.ingest._common import Progress, parse_stream_specs
from rayform_server.ingest.lerobot import ingest_lerobot
from rayform_server.ingest.mcap import ingest_mcap
from rayform_server.staging import Shard, add_stage_arguments
from rayform_server.store import Store

__all__ = ["Progress", "add_parser", "ingest_lerobot", "ingest_mcap"]

if TYPE_CHECKING:
    Subparsers = argparse._SubParsersAction[argparse.ArgumentParser]


def _common_args(p: argparse.ArgumentParser, source: str) -> None:
    p.add_argument("--root", required=True, help="the server's data root (created if missing)")
    p.add_argument(
        "--slice", required=True, dest="slice_id", help="slice ID to create, e.g. slc_7c1e04aa"
    )
    p.add_argument(
        "--stream",
        action="append",
        default=[],
        metavar=f"NAME={source}",
        help=f"ingest {source} as stream NAME (repeatable); when given, only these are ingested",
    )
    p.add_argument(
        "--site", default="local", help="site recorded in every segment (default: local)"
    )
    p.add_argument("--quiet", action="store_true", help="no progress output")
    p.add_argument(
        "--gop",
        type=int,
        default=DEFAULT_GOP,
        metavar="N",
        help=f"keyframe interval of the stored H.264 videos, in frames (default {DEFAULT_GOP}: "
        "fastest random access; 10 is ~3x smaller; see docs/video-encoding.md)",
    )
    p.add_argument(
        "--jobs",
        type=int,
        default=1,
        metavar="N",
        help="ingest N recordings at a time in parallel processes (default 1); the slice is "
        "the same",
    )
    p.add_argument(
        "--renditions",
        metavar="HEIGHTS",
        type=heights_argument,
        default=(),
        help="also store each camera at these heights in pixels, comma-separated, e.g. "
        "240,120 (the width keeps the aspect ratio; a height at or above a camera's is "
        "skipped with a warning); with --jobs or --stage each worker renders its own",
    )
    add_stage_arguments(p, "recordings")
    p.add_argument(
        "--ray",
        metavar="ADDRESS",
        nargs="?",
        const="",
        default=None,
        help="run the shards as Ray tasks (one per source file, retried when a worker dies) on "
        "the cluster at ADDRESS (default: RAY_ADDRESS, else a local Ray), then commit once; the "
        "root must be shared by every node (docs/ray.md)",
    )


class _LeafParser(argparse.ArgumentParser):
    """An ingest subcommand's parser: ``--ray`` followed by a path that exists means a local
    Ray and that path, not an address (its optional ADDRESS would otherwise take the dataset's
    path, and the command fail for want of one)."""

    def parse_known_args(  # type: ignore[override]
        self, args: list[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        given = list(sys.argv[1:] if args is None else args)
        for i, arg in enumerate(given[:-1]):
            if arg == "--ray" and os.path.exists(given[i + 1]):
                given[i] = "--ray="
        return super().parse_known_args(given, namespace)


def add_parser(
    subparsers: Subparsers,
    *,
    leaf_options: Callable[[argparse.ArgumentParser], None] | None = None,
) -> argparse.ArgumentParser:
    """Register ``ingest`` (with ``lerobot`` and ``mcap``) on the server CLI's subparsers.

    Each leaf sets ``func``: a callable taking the parsed arguments and returning an exit code
    (0 on success, 2 on bad input, with the reason on stderr).

    Args:
        subparsers: what ``ArgumentParser.add_subparsers()`` returned.
        leaf_options: called with each leaf's parser once it is complete, e.g. to add options
            that every command of the CLI shares or to wrap its ``func``.

    Returns:
        The ``ingest`` parser.
    """
    ingest = subparsers.add_parser("ingest", help="ingest LeRobot datasets or ROS 2 MCAP bags")
    kinds = ingest.add_subparsers(
        dest="ingest_kind", metavar="{lerobot,mcap}", parser_class=_LeafParser
    )
    kinds.required = True

    lr = kinds.add_parser("lerobot", help="ingest a LeRobot dataset (v2.1 or v3.0 layout)")
    _common_args(lr, "FEATURE")
    lr.add_argument(
        "--dataset-id", default=None, help="name used in segment IDs (default: the directory name)"
    )
    lr.add_argument("path", help="the dataset's root directory (holding meta/info.json)")
    lr.set_defaults(func=_run_lerobot)

    mc = kinds.add_parser("mcap", help="ingest ROS 2 bags recorded as MCAP, one segment per file")
    _common_args(mc, "TOPIC[:FIELD]")
    mc.add_argument(
        "--task",
        default=None,
        metavar="TEXT",
        help="the task of every bag: a text stream 'task' (docs/language.md)",
    )
    mc.add_argument("files", nargs="+", help="MCAP files")
    mc.set_defaults(func=_run_mcap)
    if leaf_options is not None:
        for leaf in (lr, mc):
            leaf_options(leaf)
    return ingest


def _run(args: argparse.Namespace, work: Callable[[Store, Progress, Shard | None], None]) -> int:
    progress = Progress(None if args.quiet else sys.stderr)
    try:
        if args.shard is not None and args.stage is None:
            raise InvalidArgumentError(
                f"--shard {args.shard} splits a distributed ingest: give the staging batch too, "
                "e.g. --stage run-0412"
            )
        store = Store(args.root)
        work(store, progress, Shard.parse(args.shard) if args.shard is not None else None)
        if args.stage is not None and not args.quiet:
            print(
                f"when every worker is done run: rayform-server commit --root {store.root} "
                f"--stage {args.stage} --slice {args.slice_id}",
                file=sys.stderr,
            )
    except RayformError as exc:
        print(f"rayform-server ingest {args.ingest_kind}: error: {exc}", file=sys.stderr)
        return 2
    return 0


def _run_lerobot(args: argparse.Namespace) -> int:
    def work(store: Store, progress: Progress, shard: Shard | None) -> None:
        ingest_lerobot(
            store,
            args.path,
            args.slice_id,
            streams=parse_stream_specs(args.stream, "FEATURE") or None,
            site=args.site,
            dataset_id=args.dataset_id,
            progress=progress,
            gop=args.gop,
            stage=args.stage,
            shard=shard,
            jobs=args.jobs,
            renditions=args.renditions,
            ray=args.ray,
        )

    return _run(args, work)


def _run_mcap(args: argparse.Namespace) -> int:
    def work(store: Store, progress: Progress, shard: Shard | None) -> None:
        ingest_mcap(
            store,
            args.files,
            args.slice_id,
            streams=parse_stream_specs(args.stream, "TOPIC[:FIELD]") or None,
            site=args.site,
            progress=progress,
            gop=args.gop,
            stage=args.stage,
            shard=shard,
            jobs=args.jobs,
            renditions=args.renditions,
            ray=args.ray,
            task=args.task,
        )

    return _run(args, work)
