"""``rayform-server``: serve a data root, create the demo slice, list slices, ingest recordings.

::

    rayform-server demo   --root DIR [--slice slc_...] [--small] [--seed N] [--jobs N]
                          [--episodes N [--share-blobs]] [--stage BATCH --shard I/N] [S3]
    rayform-server commit --root DIR --stage BATCH --slice slc_... [--expect N]
    rayform-server serve  --root DIR [--host 127.0.0.1] [--port 8765]
                          [--token T | --tokens-file F | --allow-anonymous] [--write-token T]
                          [S3] [--presign-expiry SECONDS]
    rayform-server slices --root DIR
    rayform-server renditions --root DIR --slice slc_... --renditions 240[,120] [--jobs N] [S3]
    rayform-server ingest ... [S3]   (when rayform_server.ingest is installed)

    S3 = --blobs s3://BUCKET/PREFIX --s3-endpoint URL   (credentials: AWS_* variables)

A root given ``--blobs`` once records it (``ROOT/blobstore.json``); later commands on that
root use the same store without repeating it (see docs/team.md).

Every subcommand's parser sets ``func``: a callable taking the parsed arguments and returning
the exit code. Errors are printed as one ``error: ...`` line and exit with status 2.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from rayform.errors import RayformError
from rayform.units import human_bytes
from rayform_server._renditions import heights_argument
from rayform_server.blobstore import DEFAULT_PRESIGN_EXPIRY_S, LocalBlobBackend, configure_root
from rayform_server.migrate import add_parser as add_migrate

__all__ = ["build_parser", "listen_socket", "main"]

if TYPE_CHECKING:
    Subparsers = argparse._SubParsersAction[argparse.ArgumentParser]

_DEFAULT_PORT = 8765


def _err(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def listen_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host:port`` (0: a free port) for the server to listen on.

    Raises:
        OSError: the address cannot be bound.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP, not 0: asyncio turns TCP_NODELAY on only for sockets whose protocol says
    # TCP, and without it a small answer on a kept-alive connection waits out the client's
    # delayed ACK (about 40 ms a request on Linux).
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock


def _serve(args: argparse.Namespace) -> int:
    import uvicorn

    from rayform_server.app import create_app

    root = Path(args.root)
    if not (root / "slices").is_dir():
        _err(
            f"error: {root} is not a Rayform data root (no slices/ folder): create one with "
            f"`rayform-server demo --root {root}` or `rayform-server ingest ...`"
        )
        return 2
    token = args.token if args.token is not None else None
    if token is None and args.tokens_file is None and not args.allow_anonymous:
        token = os.environ.get("RAYFORM_SERVER_TOKEN") or None
    write_token = args.write_token
    if write_token is None and args.tokens_file is None:
        write_token = os.environ.get("RAYFORM_SERVER_WRITE_TOKEN") or None
    blobs = configure_root(root, args.blobs, args.s3_endpoint)
    if args.store_timeout is not None and hasattr(blobs, "set_lookup_timeout"):
        blobs.set_lookup_timeout(args.store_timeout)
    app = create_app(
        root,
        token=token,
        tokens_file=args.tokens_file,
        allow_anonymous=args.allow_anonymous,
        blobs=blobs,
        presign_expiry_s=args.presign_expiry,
        write_token=write_token,
    )
    family = socket.AF_INET6 if ":" in args.host else socket.AF_INET
    try:
        sock = listen_socket(args.host, args.port)
    except OSError as exc:
        _err(
            f"error: cannot listen on {args.host}:{args.port}: {exc.strerror}; pick another "
            "--port (0 chooses a free one)"
        )
        return 2
    port = sock.getsockname()[1]
    shown = f"[{args.host}]" if family == socket.AF_INET6 else args.host
    banner = f"serving {root.resolve()} on http://{shown}:{port}"
    if not isinstance(blobs, LocalBlobBackend):
        banner += (
            f" (blobs in {blobs.describe()}: 307 to presigned URLs valid {args.presign_expiry} s)"
        )

    class _Server(uvicorn.Server):
        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            await super().startup(sockets=sockets)
            if self.started:
                _err(banner)

    config = uvicorn.Config(
        app,
        access_log=False,
        log_level="warning",
        server_header=False,
        date_header=True,
        timeout_graceful_shutdown=5,
    )
    _Server(config).run(sockets=[sock])
    return 0


def _demo_robot(args: argparse.Namespace) -> int:
    """``demo --robot single-arm``: the second embodiment, a plain build in this process."""
    from rayform_server.demo import SINGLE_ARM_SLICE, build_demo

    if args.stage is not None or args.share_blobs or args.renditions:
        _err(
            f"error: --robot {args.robot} is a plain build: drop --stage, --share-blobs and --renditions"
        )
        return 2
    slice_id = args.slice or SINGLE_ARM_SLICE
    t0 = time.perf_counter()
    manifest = build_demo(
        args.root,
        slice_id,
        small=args.small,
        seed=args.seed,
        episodes=args.episodes,
        robot=args.robot,
        progress=lambda line: _err("  " + line),
    )
    _err(
        f"slice {slice_id} -> manifest {manifest.hash[:12]}...: {len(manifest.segments)} segments, "
        f"{len(manifest.stream_names())} streams in {time.perf_counter() - t0:.1f} s"
    )
    _err(
        f"serve it with: rayform-server serve --root {args.root} --token <TOKEN> "
        "[--write-token <WRITE_TOKEN> to label and publish]"
    )
    return 0


def _demo(args: argparse.Namespace) -> int:
    from rayform_server.demo import build_demo, demo_spec

    configure_root(Path(args.root), args.blobs, args.s3_endpoint)
    if args.robot != "bimanual":
        return _demo_robot(args)
    args.slice = args.slice or "slc_7c1e04aa"
    spec = demo_spec(args.small)
    episodes = spec.episodes if args.episodes is None else args.episodes
    if episodes < 1:
        _err(
            f"error: --episodes {episodes}: use a positive number of episodes, e.g. --episodes 1000"
        )
        return 2
    rendered = min(episodes, spec.episodes) if args.share_blobs else episodes
    _err(
        f"building demo slice {args.slice} in {args.root}: {episodes} episodes ({rendered} rendered), "
        f"cameras {spec.size[1]}x{spec.size[0]}, {args.jobs} process(es)"
    )
    t0 = time.perf_counter()
    if args.stage is not None:
        from rayform_server._fleet import stage_demo
        from rayform_server.staging import Shard

        shard = Shard.parse(args.shard) if args.shard is not None else Shard()
        n = stage_demo(
            args.root,
            args.stage,
            shard.index,
            shard.count,
            small=args.small,
            seed=args.seed,
            episodes=args.episodes,
            progress=lambda line: _err("  " + line),
            renditions=args.renditions,
        )
        _err(
            f"staged {n} episodes in batch {args.stage}; when every shard is done run: "
            f"rayform-server commit --root {args.root} --stage {args.stage} --slice {args.slice}"
        )
        return 0
    if args.share_blobs:
        from rayform_server._fleet import build_shared_demo
        from rayform_server.store import Store

        digest = build_shared_demo(
            args.root,
            args.slice,
            episodes,
            small=args.small,
            seed=args.seed,
            jobs=args.jobs,
            progress=lambda line: _err("  " + line),
            renditions=args.renditions,
        )
        manifest = Store(args.root).load_manifest(digest)
    else:
        manifest = build_demo(
            args.root,
            args.slice,
            small=args.small,
            seed=args.seed,
            jobs=args.jobs,
            progress=lambda line: _err("  " + line),
            episodes=args.episodes,
            renditions=args.renditions,
        )
    dt = time.perf_counter() - t0
    summary = getattr(manifest, "summary", None)
    size = summary["nbytes"] if summary else sum(b.size for b in manifest.blobs().values())
    _err(
        f"slice {args.slice} -> manifest {manifest.hash[:12]}...: {len(manifest.segments)} segments, "
        f"{len(manifest.stream_names())} streams, {human_bytes(size)} in {dt:.1f} s"
    )
    _err(
        f"serve it with: rayform-server serve --root {args.root} --token <TOKEN> "
        "[--write-token <WRITE_TOKEN> to label and publish]"
    )
    return 0


def _commit(args: argparse.Namespace) -> int:
    from rayform_server.staging import commit_staged
    from rayform_server.store import Store

    store = Store(args.root)
    description = args.description if args.description is not None else f"staged batch {args.stage}"
    digest = commit_staged(store, args.stage, args.slice, description, expect=args.expect)
    _err(f"slice {args.slice} -> manifest {digest[:12]}... from staging batch {args.stage}")
    return 0


def _renditions(args: argparse.Namespace) -> int:
    from rayform_server._addrenditions import add_renditions
    from rayform_server.store import Store

    root = Path(args.root)
    if not (root / "slices").is_dir():
        _err(
            f"error: {root} is not a Rayform data root (no slices/ folder): give the --root that "
            "`rayform-server serve` serves"
        )
        return 2
    # The backend carries --s3-endpoint (the workers get it from configure_root too).
    blobs = configure_root(root, args.blobs, args.s3_endpoint)
    t0 = time.perf_counter()
    report = add_renditions(
        Store(root, blobs=blobs),
        args.slice,
        args.renditions,
        jobs=args.jobs,
        progress=None if args.quiet else lambda line: _err("  " + line),
    )
    for line in report.skipped:
        _err(f"warning: {line}")
    if report.manifest == report.previous:
        _err(
            f"slice {args.slice} already has every rendition asked for: manifest "
            f"{report.manifest[:12]}... unchanged"
        )
        return 0
    _err(
        f"slice {args.slice} -> manifest {report.manifest[:12]}... (was {report.previous[:12]}..., still "
        f"readable by hash): {report.rendered} rendition(s), {human_bytes(report.added_bytes)}, in "
        f"{time.perf_counter() - t0:.1f} s"
    )
    return 0


def _slices(args: argparse.Namespace) -> int:
    from rayform_server.store import Store

    root = Path(args.root)
    if not (root / "slices").is_dir():
        _err(f"error: {root} is not a Rayform data root (no slices/ folder)")
        return 2
    store = Store(root)
    count = 0
    for slice_id in store.list_slices():
        ref = store.get_slice(slice_id)
        if ref is None:
            continue
        manifest = store.load_manifest(ref["manifest"])
        size = manifest.summary["nbytes"]  # from the root: no page read
        print(
            f"{slice_id}  manifest {ref['manifest'][:12]}  {len(manifest.segments):4d} segments  "
            f"{human_bytes(size):>10}  {ref.get('description', '')}"
        )
        count += 1
    if count == 0:
        _err(f"no slices in {root}")
    return 0


def _add_blob_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--blobs",
        metavar="s3://BUCKET/PREFIX",
        default=None,
        help="keep blobs in S3-compatible object storage (credentials from the AWS_* "
        "environment variables); recorded in ROOT/blobstore.json, so later commands on "
        "this root need not repeat it (default: what the root records, else ROOT/blobs)",
    )
    parser.add_argument(
        "--s3-endpoint",
        metavar="URL",
        default=None,
        help="S3 API endpoint, e.g. http://127.0.0.1:8333 (default: the recorded one, else AWS)",
    )


def _with_blob_root(
    func: Callable[[argparse.Namespace], int],
) -> Callable[[argparse.Namespace], int]:
    """Wrap an ingest leaf: record/open the root's blob store before the ingest opens it."""

    def run(args: argparse.Namespace) -> int:
        configure_root(Path(args.root), args.blobs, args.s3_endpoint)
        return int(func(args) or 0)

    return run


def _ingest_leaf(leaf: argparse.ArgumentParser) -> None:
    """Give an ingest subcommand the S3 options and open the root's blob store first."""
    _add_blob_args(leaf)
    leaf.set_defaults(func=_with_blob_root(leaf.get_default("func")))


def _add_ingest(subparsers: Subparsers) -> None:
    """Register ``ingest`` (with the S3 options) if its optional dependencies are installed."""
    try:
        from rayform_server.ingest import add_parser
    except ImportError:  # pyarrow or mcap missing: serve and demo still work
        return
    add_parser(subparsers, leaf_options=_ingest_leaf)


def build_parser() -> argparse.ArgumentParser:
    """The ``rayform-server`` argument parser (subcommands set ``func``)."""
    parser = argparse.ArgumentParser(
        prog="rayform-server",
        description="Rayform server stub: serve slices (manifests and content-addressed blobs) "
        "over HTTP with bearer-token access control, create a demo slice, ingest recordings.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    serve = sub.add_parser(
        "serve",
        help="serve a data root over HTTP",
        description="Serve the slices of a data root over HTTP (wire protocol: docs/protocol.md). "
        "Prints 'serving DIR on http://HOST:PORT' to stderr once it accepts connections. "
        "Without --token/--tokens-file, RAYFORM_SERVER_TOKEN is used as the token if set.",
    )
    serve.add_argument("--root", required=True, help="data root (blobs/, manifests/, slices/)")
    serve.add_argument(
        "--host",
        default="127.0.0.1",
        help="interface to listen on (default 127.0.0.1; 0.0.0.0 exposes it to the network)",
    )
    serve.add_argument(
        "--port",
        type=int,
        default=_DEFAULT_PORT,
        help=f"TCP port (default {_DEFAULT_PORT}; 0 picks a free port and prints it)",
    )
    access = serve.add_mutually_exclusive_group()
    access.add_argument("--token", metavar="T", help="one bearer token with access to every slice")
    access.add_argument(
        "--tokens-file",
        metavar="F",
        help='JSON {"tokens": [{"name", "token", "slices": ["slc_7c1e*"]}]}: '
        "tokens scoped to slice-ID patterns (see docs/server.md)",
    )
    access.add_argument(
        "--allow-anonymous",
        action="store_true",
        help="serve every slice without any token (only for a trusted network)",
    )
    serve.add_argument(
        "--write-token",
        metavar="T",
        help="also accept this token for writes: labels and new slices, on every slice "
        '(default RAYFORM_SERVER_WRITE_TOKEN; with --tokens-file give entries a "write" list '
        "instead; see docs/curation.md)",
    )
    _add_blob_args(serve)
    serve.add_argument(
        "--store-timeout",
        metavar="SECONDS",
        type=float,
        default=None,
        help="with --blobs: how long one request to the object store may take while "
        "serving before the server answers 503 with Retry-After (default "
        "RAYFORM_SERVER_STORE_TIMEOUT, else 5)",
    )
    serve.add_argument(
        "--presign-expiry",
        metavar="SECONDS",
        type=int,
        default=DEFAULT_PRESIGN_EXPIRY_S,
        help="with --blobs: lifetime of the presigned blob URLs the server redirects to "
        f"(default {DEFAULT_PRESIGN_EXPIRY_S}; clients ask again when one expires)",
    )
    serve.set_defaults(func=_serve)

    from rayform_server.staging import add_stage_arguments

    demo = sub.add_parser(
        "demo",
        help="create the demo slice",
        description="Generate a realistic demo slice (bimanual pick-and-place, two cameras at "
        "30 Hz with jitter and drops, joints at 200 Hz, joint-delta actions at 50 Hz, an "
        "end-effector pose at 100 Hz, two sites, two segment versions). Deterministic per seed.",
    )
    demo.add_argument("--root", required=True, help="data root to write into (created if missing)")
    demo.add_argument(
        "--slice",
        default=None,
        help="slice ID to create (default slc_7c1e04aa; slc_5e1a0a77 with --robot single-arm)",
    )
    demo.add_argument(
        "--robot",
        choices=("bimanual", "single-arm"),
        default="bimanual",
        help="bimanual (default: two arms, two cameras, 14 joints) or single-arm (one wrist "
        "camera, 7 joints, 15 Hz, other stream names)",
    )
    demo.add_argument(
        "--small", action="store_true", help="4 short low-resolution episodes (for tests)"
    )
    demo.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    demo.add_argument(
        "--episodes",
        type=int,
        default=None,
        help="number of episodes (default 20, or 4 with --small)",
    )
    demo.add_argument(
        "--share-blobs",
        action="store_true",
        help="render only a small pool of episodes and list --episodes segments that "
        "reuse its blobs under their own IDs: a 1,000,000-segment slice in seconds",
    )
    demo.add_argument(
        "--jobs",
        type=int,
        default=min(2, os.cpu_count() or 1),
        help="episodes rendered in parallel (default: min(2, CPUs))",
    )
    demo.add_argument(
        "--renditions",
        metavar="HEIGHTS",
        type=heights_argument,
        default=(),
        help="also store each camera at these heights in pixels, comma-separated "
        "(e.g. 48 with --small, 240,120 for the full demo; the width keeps the aspect ratio)",
    )
    add_stage_arguments(demo, "episodes")
    _add_blob_args(demo)
    demo.set_defaults(func=_demo)

    commit = sub.add_parser(
        "commit",
        help="make a slice from a staging batch",
        description="Build one manifest from every segment staged in BATCH (by `ingest ... --stage`, "
        "`demo --stage` or staging.stage_segment on many machines) and point the slice at it; the batch is "
        "then removed. Refuses a batch that names a blob missing from the store.",
    )
    commit.add_argument("--root", required=True, help="data root the workers staged into")
    commit.add_argument("--stage", metavar="BATCH", required=True, help="the staging batch")
    commit.add_argument("--slice", required=True, help="slice ID to create or replace")
    commit.add_argument(
        "--expect",
        type=int,
        default=None,
        help="refuse unless exactly this many segments are staged",
    )
    commit.add_argument(
        "--description", default=None, help="slice description (default: the batch name)"
    )
    commit.set_defaults(func=_commit)

    slices = sub.add_parser(
        "slices",
        help="list the slices of a data root",
        description="List each slice with its manifest hash, segment count and size.",
    )
    slices.add_argument("--root", required=True, help="data root")
    slices.set_defaults(func=_slices)

    rend = sub.add_parser(
        "renditions",
        help="add renditions to a stored slice",
        description="Store smaller copies of every camera video of a slice, rendered from the stored "
        "originals as ingest --renditions renders them (same keyframe interval, rate and frames; the "
        "width keeps the aspect ratio), and point the slice at a new manifest that lists them. The old "
        "manifest stays readable by hash through the slice, so training runs logged against it still "
        "rebuild. Heights a camera already has are kept; heights at or above a camera's own are "
        "skipped with a warning. Works on local and S3-backed roots (--blobs, or what the root records).",
        epilog="example: rayform-server renditions --root data/ --slice slc_7c1e04aa --renditions 120",
    )
    rend.add_argument("--root", required=True, help="the data root holding the slice")
    rend.add_argument("--slice", required=True, help="slice ID, e.g. slc_7c1e04aa")
    rend.add_argument(
        "--renditions",
        metavar="HEIGHTS",
        type=heights_argument,
        required=True,
        help="heights in pixels, comma-separated, e.g. 240,120 (even, below the cameras' own)",
    )
    rend.add_argument(
        "--jobs",
        type=int,
        default=min(2, os.cpu_count() or 1),
        help="videos rendered in parallel (default: min(2, CPUs))",
    )
    rend.add_argument("--quiet", action="store_true", help="no line per rendered video")
    _add_blob_args(rend)
    rend.set_defaults(func=_renditions)

    _add_ingest(sub)
    add_migrate(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``rayform-server``; returns the exit code."""
    args = build_parser().parse_args(argv)
    try:
        code = int(args.func(args) or 0)
        sys.stdout.flush()  # a closed pipe shows up here, inside the try, not at exit
        return code
    except BrokenPipeError:
        # `rayform-server slices --root R | head -1`: end quietly, as coreutils do.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return 141
    except RayformError as exc:
        _err(f"error: {exc}")
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
