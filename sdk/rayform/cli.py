"""The ``rayform`` command line: pull slices, show them, manage the cache.

Exit codes: 0 success, 1 a Rayform error (one clear line on stderr), 2 bad usage.
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import sys
from collections.abc import Mapping, Sequence
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rayform import __version__
from rayform._cliargs import ListOption, Parser, SizeOption
from rayform._export_cli import add_export_parser
from rayform._ids import check_stream_name
from rayform._limits import parse_bytes
from rayform._resolution import RESIZE_MODES, check_size_value, parse_image_size
from rayform._untrusted import shown
from rayform.curation import add_curation_parsers, create_slice
from rayform.errors import InvalidArgumentError, RayformError
from rayform.units import human_bytes

if TYPE_CHECKING:
    from rayform.slice import Slice

__all__ = ["main", "parse_size"]

#: Characters of an error message printed (a message quotes server text, capped on its own).
ERROR_CHARS = 4000


def parse_size(text: str) -> int:
    """``"10GB"`` -> ``10_000_000_000`` bytes; ``"1.5GiB"``, ``"500M"``, ``"123"`` also work."""
    return parse_bytes(text, "size")


def _client(args: argparse.Namespace) -> Any:
    from rayform.client import Client

    client = Client(
        endpoint=args.endpoint,
        cache_dir=args.cache_dir,
        offline=True if args.offline else None,
        shared=args.shared,
    )
    if client.endpoint is None and not client.offline:
        # Checked here, before any work, with the command line's own spelling of the fix
        # (the client's message speaks Python).
        raise InvalidArgumentError(
            "no server endpoint: pass --endpoint https://... or set RAYFORM_ENDPOINT "
            "(or --offline to read only the cache)"
        )
    return client


#: Characters of one string kept in ``--json`` output (a server's description may run to
#: megabytes); as many as a local path may hold, so no path is ever cut.
JSON_TEXT_CHARS = 4096


def _capped(value: object) -> object:
    """``value`` with every string longer than :data:`JSON_TEXT_CHARS` cut, as text output
    cuts it (``... [N more characters]``); JSON's own encoding escapes control characters."""
    if isinstance(value, str):
        if len(value) <= JSON_TEXT_CHARS:
            return value
        return f"{value[:JSON_TEXT_CHARS]}... [{len(value) - JSON_TEXT_CHARS} more characters]"
    if isinstance(value, Mapping):
        return {_capped(k): _capped(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_capped(v) for v in value]
    return value


def _print_json(doc: Mapping[str, Any] | Sequence[Any]) -> None:
    print(json.dumps(_capped(doc), indent=2, sort_keys=True, default=str))


def _stream_names(given: Sequence[str] | None) -> list[str] | None:
    """``--streams`` as names: separated by spaces or commas (``--image-size`` takes commas,
    so a first try often does too; no stream name holds one)."""
    if given is None:
        return None
    names = [name.strip() for item in given for name in item.split(",") if name.strip()]
    if not names:
        raise InvalidArgumentError(
            f"--streams {' '.join(given)!r} names no stream: give names such as "
            "--streams cam0/rgb wrist/rgb, or leave --streams out to pull every stream"
        )
    return [check_stream_name(name) for name in names]  # before any network access


def _cmd_pull(args: argparse.Namespace) -> int:
    if args.resize is not None and args.image_size is None:
        raise InvalidArgumentError(
            f"--resize {args.resize} without --image-size: it says how frames become a training "
            "resolution; add --image-size HxW (e.g. 224x224), or leave --resize out"
        )
    image_size = parse_image_size(args.image_size) if args.image_size else None
    check_size_value(image_size, args.resize or "pad")  # before any network access
    streams = _stream_names(args.streams)
    client = _client(args)
    target = (
        args.slice_id
        if args.manifest is None
        else client.slices.get(args.slice_id, manifest_hash=args.manifest)
    )
    report = client.pull(
        target,
        streams=streams,
        jobs=args.jobs,
        progress=not args.quiet and not args.json,
        max_cache=args.max_cache,
        image_size=image_size,
        resize=args.resize or "pad",
    )
    if args.json:
        _print_json(report.to_json())
    elif not args.quiet:
        print(report.summary())
    return 0


#: ``slices show`` lists the segments of slices up to this size without ``--segments``.
SHOW_SEGMENTS_UP_TO = 100


#: ``slices show`` lists at most this many distinct tasks (``--json`` lists them all).
SHOW_TASKS_UP_TO = 20


def _print_tasks(s: Slice) -> None:
    """The slice's distinct tasks (its ``task`` text stream) with their episode counts."""
    if "task" not in s.text_streams():
        return
    tasks = s.tasks()
    print(f"  tasks: {len(tasks)} distinct")
    for task, n in tasks[:SHOW_TASKS_UP_TO]:
        print(shown(f"    {n:>8} episodes  {task}", 400))
    if len(tasks) > SHOW_TASKS_UP_TO:
        print(f"    ... {len(tasks) - SHOW_TASKS_UP_TO} more: `rayform slices show {s.id} --json`")


def _slice_json(s: Slice, segments: bool) -> dict[str, Any]:
    doc = {
        "id": s.id,
        "manifest": s.manifest_hash,
        "bytes": s.nbytes,
        "duration_s": round(s.duration_s, 3),
        "streams": s.streams,
        "segment_count": len(s.segments),
    }
    if s.lineage is not None:  # a slice published from a selection (docs/curation.md)
        doc["lineage"] = s.lineage
    if "task" in s.text_streams():
        doc["tasks"] = [{"task": t, "segments": n} for t, n in s.tasks()]
    if segments:
        doc["segments"] = [
            {
                "id": g.id,
                "version": g.version,
                "site": g.site,
                "start_ns": g.start_ns,
                "end_ns": g.end_ns,
                "bytes": g.nbytes,
                "streams": {
                    n: {
                        "kind": st.kind,
                        "rate_hz": st.rate_hz,
                        "shape": list(st.shape),
                        "count": st.count,
                        "bytes": st.nbytes,
                    }
                    for n, st in sorted(g.streams.items())
                },
            }
            for g in s.segments
        ]
    return doc


def _cmd_slices(args: argparse.Namespace) -> int:
    if args.slices_cmd == "create":
        return create_slice(args, _client)
    client = _client(args)
    if args.slices_cmd == "show":
        s = client.slices.get(args.slice_id)
        listing = args.segments or len(s.segments) <= SHOW_SEGMENTS_UP_TO
        if args.json:
            _print_json(_slice_json(s, listing))
            return 0
        print(repr(s))
        _print_tasks(s)
        if not listing:
            # A fleet slice: the summary only (it comes from the manifest root, no page read).
            for name, kind, rate, shape, dtype, units, frame in s.stream_rows():
                print(
                    shown(
                        f"  stream {name}: {kind} {rate:g} Hz {shape} {dtype} {units} {frame}".rstrip(),
                        400,
                    )
                )
            print(
                f"  {len(s.segments)} segments; list them with `rayform slices show {s.id} --segments`"
            )
            return 0
        for g in s.segments:
            print(
                f"  {g.id} v{g.version} site={shown(g.site, 80)} {g.duration_s:.1f}s "
                f"{human_bytes(g.nbytes)} streams={','.join(sorted(g.streams))}"
            )
        return 0
    rows = client.slices.list()
    if args.json:
        _print_json(rows)
    elif not rows and client.offline:
        # An empty listing offline means "nothing pulled into this cache", not "no slices".
        print(
            f"no slices are remembered in the cache {client.cache_dir}; with network access, "
            "`rayform pull SLICE_ID` into it first",
            file=sys.stderr,
        )
    elif not rows:
        print(f"your token may read no slices on {client.endpoint}", file=sys.stderr)
    else:
        for r in rows:
            print(
                f"{r['id']}  {shown(str(r.get('manifest', ''))[:12])}  {shown(r.get('description', ''))}"
            )
    return 0


def _cmd_cache(args: argparse.Namespace) -> int:
    from rayform._env import default_cache_dir
    from rayform.cache import Cache

    root = args.cache_dir or default_cache_dir()
    cache = Cache(root, shared=args.shared)
    cmd = args.cache_cmd
    if cmd == "path":
        if args.json:
            _print_json({"path": str(cache.root)})
        else:
            print(cache.root)
        return 0
    if cmd == "ls":
        entries = list(cache.ls())
        if args.json:
            _print_json(
                [
                    {"kind": e.kind, "hash": e.hash, "size": e.size, "atime": e.atime}
                    for e in entries
                ]
            )
        else:
            for e in entries:
                print(f"{e.kind[:-1]:8} {e.hash}  {human_bytes(e.size):>10}")
        return 0
    if cmd == "du":
        from rayform._limits import resolve_cache_limit

        du = cache.du()
        limit = resolve_cache_limit(args.limit)
        if args.json:
            _print_json({**du, "limit": limit})
        else:
            print(
                f"{cache.root}: {du['blobs']} blobs {human_bytes(du['blob_bytes'])}, "
                f"{du['manifests']} manifests {human_bytes(du['manifest_bytes'])}, "
                f"temporary {human_bytes(du['tmp_bytes'])}"
            )
            if limit is None:
                print("limit: none (set RAYFORM_CACHE_LIMIT or --limit to compare)")
            else:
                over = du["blob_bytes"] - limit
                state = f"{human_bytes(over)} over" if over > 0 else "under"
                print(f"limit: {human_bytes(limit)}, blobs {state}")
            print(
                f"pinned: {du['pinned_blobs']} blobs {human_bytes(du['pinned_bytes'])} by "
                f"{du['readers']} live readers; {du['processes']} live processes in the ledger"
            )
        return 0
    if cmd == "migrate":
        from rayform._resolve import migrate_cache

        done = migrate_cache(cache, dry_run=args.dry_run, progress=print)
        print(done.summary(args.dry_run))
        return 1 if done.unable else 0
    if cmd == "verify":
        report = cache.verify()
        if args.json:
            _print_json({"checked": report.checked, "removed": report.removed})
        else:
            print(f"checked {report.checked} objects, removed {len(report.removed)} corrupt")
            for h in report.removed:
                print(f"  removed {h}")
        return 0
    # prune
    evicted = cache.prune(parse_size(args.max_size))
    if args.json:
        _print_json(
            {"evicted": [e.hash for e in evicted], "evicted_bytes": sum(e.size for e in evicted)}
        )
    else:
        print(
            f"evicted {len(evicted)} blobs ({human_bytes(sum(e.size for e in evicted))}); "
            f"cache now {human_bytes(cache.du()['blob_bytes'])}"
        )
    return 0


# -- rayform docs ----------------------------------------------------------------------------
# A message or a --help that names docs/NAME.md must lead somewhere for a user who installed the
# wheel and has no checkout: the wheel installs the pages under share/doc/rayform/ (setuptools
# data-files), and a source checkout (an editable install) reads its own docs/. No site is
# published, so these pages are the reference.

#: Where the wheel puts the pages, relative to the install's data directory.
_DOCS_DIR = "share/doc/rayform"


def _checkout_docs() -> Path | None:
    # sdk/rayform/cli.py -> the checkout's root; only a checkout has docs/cli.md there.
    docs = Path(__file__).resolve().parents[2] / "docs"
    return docs if (docs / "cli.md").is_file() else None


def _installed_pages() -> dict[str, Path]:
    try:
        dist = metadata.distribution("rayform")
    except metadata.PackageNotFoundError:
        return {}
    pages = {}
    for record in dist.files or ():
        posix = record.as_posix()
        if posix.endswith(".md") and f"{_DOCS_DIR}/" in posix:
            path = Path(str(dist.locate_file(record))).resolve()
            if path.is_file():
                pages[path.stem] = path
    return pages


def _doc_pages() -> dict[str, Path]:
    """The pages this install has, by name (``cli`` for ``docs/cli.md``), sorted by name.

    A source checkout's own ``docs/`` wins over installed copies: it is what its code says.
    """
    docs = _checkout_docs()
    found = {p.stem: p for p in docs.glob("*.md")} if docs else _installed_pages()
    return dict(sorted(found.items()))


def _doc_page(name: str) -> Path:
    """The page ``name``: ``cli``, ``cli.md`` or ``docs/cli.md`` all name ``docs/cli.md``.

    Raises:
        InvalidArgumentError: no such page (the message lists the close names, or all), or
            this install has no pages at all.
    """
    pages = _doc_pages()
    if not pages:
        raise InvalidArgumentError(
            "this install of rayform has no documentation pages (installed without its data "
            "files); reinstall it with pip, or read docs/ in the source checkout"
        )
    key = name.strip().removeprefix("docs/").split("#", 1)[0].removesuffix(".md")
    if key in pages:
        return pages[key]
    close = difflib.get_close_matches(key, list(pages), n=3, cutoff=0.6)
    hint = f"did you mean {' or '.join(close)}?" if close else f"pages: {', '.join(pages)}"
    raise InvalidArgumentError(
        f"no documentation page {name!r}: {hint} (`rayform docs` lists them)"
    )


def _page_title(path: Path) -> str:
    """The page's first ``# `` heading, without the marks (the file's name if it has none)."""
    with path.open(encoding="utf-8") as f:
        for line in f:
            if line.startswith("# "):
                return line[2:].strip().replace("`", "")
    return path.stem


def _cmd_docs(args: argparse.Namespace) -> int:
    import pydoc

    if args.page is None:
        pages = _doc_pages()
        if args.path:
            for path in pages.values():
                print(path)
            return 0
        width = max(map(len, pages), default=0)
        for name, path in pages.items():
            print(f"{name:<{width}}  {_page_title(path)}")
        print("\n`rayform docs NAME` shows one page; --path prints where it is.", file=sys.stderr)
        return 0
    path = _doc_page(args.page)
    if args.path:
        print(path)
    else:
        # A pager on a terminal ($MANPAGER, $PAGER or less, as `pydoc` does), plain text in a pipe.
        pydoc.pager(path.read_text(encoding="utf-8"))
    return 0


def _cmd_view(args: argparse.Namespace) -> int:
    try:
        from rayform.view import ViewAPI, ViewServer, is_loopback
    except ImportError as exc:  # PyAV, the view extra's dependency
        raise InvalidArgumentError(
            f"rayform view needs the view extra ({exc}): pip install 'rayform[view]'"
        ) from exc

    client = _client(args)
    slice_ = client.slices.get(args.slice_id)
    try:
        server = ViewServer(
            ViewAPI(slice_, frames=args.frames), args.host, args.port, quiet=not args.verbose
        )
    except (OSError, OverflowError) as exc:  # in use, not an address here, a port out of range
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise InvalidArgumentError(
            f"rayform view cannot listen on {args.host} port {args.port} ({why}): choose "
            "another --port (0 takes a free one) or --host (127.0.0.1: only this machine)"
        ) from None
    if not is_loopback(args.host):
        print(
            f"rayform view: warning: listening on {args.host}, not only this machine: anyone "
            "who has the URL's key can read this slice through it",
            file=sys.stderr,
        )
    print(
        f"rayform view of {slice_.id} ({len(slice_)} episodes"
        f"{', offline' if client.offline else ''}); Ctrl-C stops it",
        file=sys.stderr,
    )
    if args.json:  # one line, for a script that starts the viewer and opens the page itself
        print(
            json.dumps({"url": server.url, "slice": slice_.id, "episodes": len(slice_)}), flush=True
        )
    else:
        print(server.url, flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        print("rayform view: stopped", file=sys.stderr)
    finally:
        server.server_close()
    return 0


_ENV_HELP = """\
environment variables:
  RAYFORM_ENDPOINT       server URL (same as --endpoint)
  RAYFORM_TOKEN          access token; never printed
  RAYFORM_CACHE_DIR      cache directory (same as --cache-dir; default ~/.cache/rayform on Linux)
  RAYFORM_OFFLINE        1: never touch the network (same as --offline)
  RAYFORM_NO_LOCKS       1: no per-blob download claims (for filesystems where they hang)
  RAYFORM_CACHE_LIMIT    bytes the cache may hold, e.g. 50GB (evicts least recently used blobs)
  RAYFORM_STALL_TIMEOUT  seconds a download may make no progress before it fails (default 120)
  RAYFORM_MIN_RATE       slowest body that counts as progress, e.g. 10kB/s (default 1KiB/s; 0: off)
  RAYFORM_CACHE_SHARED   1: team cache, group-writable (same as --shared); 0: never inferred

docs: `rayform docs` lists the guides installed with rayform and `rayform docs cli` shows this
command line's reference (a message that names docs/NAME.md means `rayform docs NAME`);
`rayform COMMAND --help` gives each command's options."""


def _stdout_closed() -> int:
    """The reader of our output went away (``rayform cache ls | head -1``): end quietly.

    Like coreutils, which die of SIGPIPE: no message, exit status 128 + SIGPIPE. stdout is
    pointed at /dev/null so that the interpreter's final flush does not complain either.
    """
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return 141


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``rayform``."""
    common = Parser(add_help=False)
    common.add_argument("--endpoint", help="server URL (default: $RAYFORM_ENDPOINT)")
    common.add_argument(
        "--cache-dir",
        help="cache directory (default: $RAYFORM_CACHE_DIR or "
        "the user cache dir, ~/.cache/rayform on Linux)",
    )
    common.add_argument(
        "--offline", action="store_true", help="never touch the network (also: RAYFORM_OFFLINE=1)"
    )
    common.add_argument("--json", action="store_true", help="machine-readable output")
    common.add_argument(
        "--shared",
        action="store_true",
        default=None,
        help="team cache: what this command writes is group-writable, directories "
        "setgid (default: on when the cache directory is setgid and "
        "group-writable, or RAYFORM_CACHE_SHARED=1)",
    )
    p = Parser(
        prog="rayform",
        description="Rayform: fetch slices of robot data into a shared, verified cache. "
        "The token is read from $RAYFORM_TOKEN and never printed.",
        epilog=_ENV_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--version", action="version", version=f"rayform {__version__}")
    sub = p.add_subparsers(dest="cmd", required=True, metavar="COMMAND")

    pull = sub.add_parser(
        "pull",
        parents=[common],
        help="prefetch a slice into the cache",
        description="Download every blob a training run needs (or only the "
        "named streams) in parallel, verifying every byte. Resumable: run it "
        "again after an interruption.",
    )
    pull.add_argument("slice_id", metavar="SLICE_ID", help="e.g. slc_7c1e04aa")
    pull.add_argument(
        "--streams",
        nargs="+",
        action=ListOption,
        metavar="S",
        help="only these streams, e.g. cam0/rgb wrist/rgb (or cam0/rgb,wrist/rgb)",
    )
    pull.add_argument("--jobs", "-j", type=int, default=8, help="parallel downloads (default 8)")
    pull.add_argument("--quiet", "-q", action="store_true", help="no progress bar or summary")
    pull.add_argument(
        "--max-cache",
        nargs="+",
        action=SizeOption,
        metavar="SIZE",
        default=None,
        help="keep the cache's blobs under SIZE (e.g. 50GB), evicting least recently "
        "used blobs nobody is reading (default RAYFORM_CACHE_LIMIT)",
    )
    pull.add_argument(
        "--image-size",
        metavar="HxW",
        default=None,
        help="pull for training at this resolution (e.g. 224x224, or cam0/rgb:224x224,"
        "wrist/rgb:128x128): per camera only the stored rendition "
        "EpisodeDataset(image_size=..., resize=...) reads",
    )
    pull.add_argument(
        "--resize",
        choices=RESIZE_MODES,
        default=None,
        help="with --image-size: how frames become HxW (default pad)",
    )
    pull.add_argument(
        "--manifest",
        metavar="HASH",
        default=None,
        help="pull the slice as it was at this manifest (e.g. the hash a dataset URI "
        "pins, after the slice changed); default: its current manifest",
    )
    pull.set_defaults(func=_cmd_pull)

    slices = sub.add_parser("slices", help="show or list slices")
    ssub = slices.add_subparsers(dest="slices_cmd", required=True, metavar="SUBCOMMAND")
    show = ssub.add_parser("show", parents=[common], help="segments and streams of a slice")
    show.add_argument("slice_id", metavar="SLICE_ID")
    show.add_argument(
        "--segments",
        action="store_true",
        help=f"list every segment (the default only up to {SHOW_SEGMENTS_UP_TO} segments)",
    )
    ssub.add_parser("ls", parents=[common], help="slices your token may see")
    slices.set_defaults(func=_cmd_slices)

    cache = sub.add_parser("cache", help="inspect and maintain the cache")
    csub = cache.add_subparsers(dest="cache_cmd", required=True, metavar="SUBCOMMAND")
    csub.add_parser("path", parents=[common], help="print the cache directory")
    csub.add_parser("ls", parents=[common], help="list cached blobs and manifests")
    du = csub.add_parser(
        "du",
        parents=[common],
        help="disk usage of the cache, its limit, and what live readers pin",
    )
    du.add_argument(
        "--limit",
        nargs="+",
        action=SizeOption,
        metavar="SIZE",
        default=None,
        help="the limit to compare with (e.g. 10GB); default RAYFORM_CACHE_LIMIT",
    )
    csub.add_parser(
        "verify", parents=[common], help="re-hash every cached object; remove corrupt ones"
    )
    prune = csub.add_parser(
        "prune", parents=[common], help="evict least recently used blobs down to a size"
    )
    prune.add_argument(
        "--max-size",
        nargs="+",
        action=SizeOption,
        required=True,
        metavar="SIZE",
        help="e.g. 10GB, 500MiB, 10 GB",
    )
    migrate = csub.add_parser(
        "migrate",
        parents=[common],
        help="rewrite cached manifests of older formats so they open offline",
        description="Rewrite every cached slice whose manifest is of an older format (version 1 "
        "or 2, from an earlier Rayform) into the current one, from what the cache holds, so "
        "RAYFORM_OFFLINE=1 keeps working on what was pulled. Blobs are not touched; labels "
        "come along when their versions are cached. A slice that cannot be rewritten without "
        "the server is named, with the command to run.",
    )
    migrate.add_argument(
        "--dry-run", action="store_true", help="say what would be rewritten; write nothing"
    )
    cache.set_defaults(func=_cmd_cache)

    view = sub.add_parser(
        "view",
        parents=[common],
        help="look at a slice in a web browser",
        description="Serve a local page that lists the slice's episodes, plays "
        "each episode's cameras in sync with plots of its table streams, and "
        "turns a selection into slice_.select(...). Prints the URL (it holds a "
        "per-run key); Ctrl-C stops it. docs/view.md",
    )
    view.add_argument("slice_id", metavar="SLICE_ID")
    view.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to listen on (default 127.0.0.1: this machine only)",
    )
    view.add_argument("--port", type=int, default=0, help="TCP port (default: a free one)")
    view.add_argument(
        "--frames",
        action="store_true",
        help="serve cameras as decoded JPEG frames instead of their video files",
    )
    view.add_argument("--verbose", "-v", action="store_true", help="log every request to stderr")
    view.set_defaults(func=_cmd_view)
    docs = sub.add_parser(
        "docs",
        help="read the guides installed with rayform (the CLI, the cache, the dataset...)",
        description="List the guides installed with rayform, or show one in a pager. "
        "A message that names docs/NAME.md means `rayform docs NAME`.",
    )
    docs.add_argument("page", nargs="?", metavar="NAME", help="a page: cli, cache, dataset, ...")
    docs.add_argument("--path", action="store_true", help="print the page's file path instead")
    docs.set_defaults(func=_cmd_docs)
    add_export_parser(sub, common, _client)
    add_curation_parsers(sub, ssub, common, _client)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit code."""
    args = build_parser().parse_args(argv)
    try:
        code = int(args.func(args))
        sys.stdout.flush()  # a closed pipe shows up here, inside the try, not at exit
        return code
    except BrokenPipeError:
        return _stdout_closed()
    except RayformError as exc:
        # Messages quote what servers sent (escaped where it entered); escape again, whatever
        # the path, so that nothing printed can drive the terminal.
        print(f"rayform: error: {shown(str(exc), ERROR_CHARS, lines=True)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("rayform: interrupted; run the same command again to resume", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
