"""``rayform labels {show,set,import,history}``, ``rayform slices create`` and ``rayform slices
stats``: curation from the command line (docs/curation.md). Kept apart from ``rayform.cli`` so
that its core stays small.

``slices stats`` computes through ``EpisodeDataset.stats()`` (so its numbers are a dataset's,
by construction), which needs torch: ``rayform.torch`` is loaded by name when the command
runs, as ``rayform export`` loads its module (``import rayform`` never needs torch).
"""

from __future__ import annotations

import argparse
import csv
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rayform._cliargs import ListOption, Parser, torch_module
from rayform._untrusted import shown
from rayform.errors import InvalidArgumentError

__all__ = ["add_curation_parsers", "create_slice", "slice_stats"]

#: The numbers ``slices stats`` prints per vector component, in this order.
STAT_COLUMNS = ("mean", "std", "min", "max", "q01", "q99")

_WHERE_HELP = (
    "a filter on episode fields (site, version, duration_s, start_ns, ...) and labels, e.g. "
    "\"success and quality >= 0.7 and site in ['lab-zurich']\" (docs/curation.md)"
)


def _value(text: str) -> Any:
    """A value typed on the command line: JSON if it parses (true, 0.8, ["a","b"], null),
    else the text itself (a category)."""
    try:
        return json.loads(text)
    except ValueError:
        return text


def _pair(text: str) -> tuple[str, Any]:
    key, eq, value = text.partition("=")
    if not eq or not key:
        raise argparse.ArgumentTypeError(
            f"{text!r}: write KEY=VALUE, e.g. success=true, quality=0.8, grade=good, "
            "tags='[\"regrasp\"]', note=null (removes it)"
        )
    return key, _value(value)


def _read_table(path: Path) -> Any:
    """``{episode: {key: value}}`` from a JSON object, JSON lines, a CSV with an ``episode``
    column, or a Parquet file (read with pyarrow)."""
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq  # noqa: PLC0415  (only this format needs it)

        return pq.read_table(path)
    text = path.read_text()
    if path.suffix == ".csv":
        rows = list(csv.DictReader(text.splitlines()))
        if rows and "episode" not in rows[0]:
            raise InvalidArgumentError(f"{path}: a label CSV needs an 'episode' column")
        return {r.pop("episode"): {k: _value(v) for k, v in r.items() if v != ""} for r in rows}
    if path.suffix == ".jsonl":
        out: dict[str, Any] = {}
        for line in text.splitlines():
            if line.strip():
                row = json.loads(line)
                out.setdefault(row.pop("episode"), {}).update(row)
        return out
    doc = json.loads(text)
    if not isinstance(doc, dict):
        raise InvalidArgumentError(f"{path}: expected a JSON object {{episode: {{key: value}}}}")
    return doc


def _labels(args: argparse.Namespace, client_of: Callable[[argparse.Namespace], Any]) -> int:
    slice_ = client_of(args).slices.get(args.slice_id)
    if args.labels_cmd == "set":
        kinds = dict(args.kind) if args.kind else None
        labels = slice_.label(args.episode, kinds=kinds, **dict(args.values))
    elif args.labels_cmd == "import":
        labels = slice_.label_all(_read_table(Path(args.file)), kinds=dict(args.kind or []) or None)
    else:
        labels = slice_.labels
    if args.labels_cmd == "history":
        entries = labels.history()
        if args.json:
            print(json.dumps(entries, indent=2))
        for e in [] if args.json else entries:
            print(
                f"v{e['version']}  {e['at']}  {shown(e['by'], 64)}  {e['episodes']} episodes  "
                f"{','.join(e['keys'])}"
            )
        return 0
    if args.json:
        print(
            json.dumps(
                {"version": labels.version, "hash": labels.hash, "episodes": dict(labels.items())},
                indent=2,
            )
        )
        return 0
    print(repr(labels))
    if args.labels_cmd == "show":
        shown_rows = list(labels.items())
        if args.episode:
            shown_rows = [(args.episode, labels[args.episode])]
        for episode, row in shown_rows:
            values = " ".join(f"{k}={json.dumps(v)}" for k, v in sorted(row.items()))
            print(f"  {episode}  {shown(values, 400)}")
    return 0


def create_slice(args: argparse.Namespace, client_of: Callable[[argparse.Namespace], Any]) -> int:
    """``rayform slices create --from SLICE ...``."""
    if args.where is None and not args.sites and not args.segments:
        raise InvalidArgumentError(
            "slices create needs a selection: --where FILTER, --sites or --segments"
        )
    client = client_of(args)
    parent = client.slices.get(args.parent)
    view = parent.select(sites=args.sites, segments=args.segments, where=args.where)
    new = client.slices.create(view, description=args.description, slice_id=args.id)
    if args.json:
        print(
            json.dumps(
                {
                    "id": new.id,
                    "manifest": new.manifest_hash,
                    "segments": len(new),
                    "lineage": new.lineage,
                },
                indent=2,
            )
        )
    else:
        print(
            f"slice {new.id} -> manifest {new.manifest_hash[:12]}: {len(new)} of {len(parent)} episodes of {parent.id}"
        )
    return 0


def _selection(args: argparse.Namespace, slice_: Any) -> Any:
    if args.where is None and not args.sites and not args.segments:
        return slice_
    return slice_.select(sites=args.sites, segments=args.segments, where=args.where)


def _stats_streams(args: argparse.Namespace, slice_: Any) -> tuple[list[str], float]:
    """The streams the statistics read (default: every table stream) and the grid rate (Hz;
    default: the fastest of the named table streams, so every record counts)."""
    rows = {row[0]: row for row in slice_.stream_rows()}
    names = [n.strip() for item in args.streams or [] for n in item.split(",") if n.strip()]
    if not names:
        names = [name for name, row in rows.items() if row[1] == "table"]
    if args.action is not None and args.action not in names:
        names.append(args.action)
    if args.fps is not None:
        return names, float(args.fps)
    rates = [float(rows[n][2]) for n in names if n in rows and rows[n][1] == "table"]
    if not rates:
        raise InvalidArgumentError(
            f"--streams {' '.join(names)} names no table stream of {slice_.id}: name one "
            f"({', '.join(n for n, r in rows.items() if r[1] == 'table')}) or pass --fps"
        )
    return names, max(rates)


def slice_stats(args: argparse.Namespace, client_of: Callable[[argparse.Namespace], Any]) -> int:
    """``rayform slices stats SLICE ...``: a selection's table statistics."""
    torch_side = torch_module("rayform.torch", "rayform slices stats")
    slice_ = client_of(args).slices.get(args.slice_id)
    view = _selection(args, slice_)
    names, fps = _stats_streams(args, slice_)
    obs = [n for n in names if n != args.action]
    ds = torch_side.EpisodeDataset(
        view, obs=obs, action=args.action, fps=fps, frame=args.frame, action_mode=args.action_mode
    )
    stats = ds.stats()
    cameras = [n for n in names if n not in stats and ds.spec.kind(n) == "video"]
    doc = {
        "slice": slice_.id,
        "manifest": slice_.manifest_hash,
        "select": view.selection if view is not slice_ else None,
        "episodes": len(view.segments),
        "samples": len(ds),
        "fps": fps,
        "frame": args.frame,
        "action": args.action,
        "action_mode": args.action_mode,
        "streams": stats,
        "cameras_without_statistics": cameras,
    }
    if args.json:
        print(json.dumps(doc, indent=2, sort_keys=True))
        return 0
    print(
        f"{slice_.id}: {len(view.segments)} episodes, {len(ds)} samples at {fps:g} Hz"
        + (f" (of {len(slice_.segments)} episodes)" if view is not slice_ else "")
    )
    for name, entry in stats.items():
        role = "action" if name == args.action else "obs"
        print(f"{shown(name, 200)} ({role}, {entry['count']} samples)")
        print("  " + f"{'i':>3}" + "".join(f"{c:>12}" for c in STAT_COLUMNS))
        for i in range(len(entry["mean"])):
            values = "".join(f"{entry[c][i]:>12.5g}" for c in STAT_COLUMNS)
            print(f"  {i:>3}{values}")
    if cameras:
        print(
            f"cameras ({', '.join(cameras)}): no statistics; normalise images with fixed "
            "constants (docs/curation.md#statistics-of-a-selection)"
        )
    return 0


def add_curation_parsers(
    sub: argparse._SubParsersAction[Parser],
    slices_sub: argparse._SubParsersAction[Parser],
    common: Parser,
    client_of: Callable[[argparse.Namespace], Any],
) -> None:
    """Add ``labels`` to the ``rayform`` subcommands ``sub`` and ``create`` to ``slices``."""
    p = sub.add_parser(
        "labels",
        help="show, set, import and trace episode labels",
        description="Episode labels of a slice: versioned, content-addressed, never changing "
        "the slice's manifest. Writing needs a write token ($RAYFORM_TOKEN). docs/curation.md",
    )
    lsub = p.add_subparsers(dest="labels_cmd", required=True, metavar="SUBCOMMAND")
    show = lsub.add_parser("show", parents=[common], help="the latest labels (offline: as pulled)")
    show.add_argument("slice_id", metavar="SLICE_ID")
    show.add_argument("episode", metavar="EPISODE", nargs="?", help="only this episode")
    kind_help = "the kind of a new key: bool, number, category, text or tags (repeatable)"
    st = lsub.add_parser(
        "set",
        parents=[common],
        help="label one episode",
        description="Set labels of one episode, e.g. `rayform labels set slc_7c1e04aa "
        "seg_26294da5e6984c17 success=true quality=0.8 grade=good`. Values are read as JSON "
        '(true, 0.8, ["a","b"], null removes the key), else as text.',
    )
    st.add_argument("slice_id", metavar="SLICE_ID")
    st.add_argument("episode", metavar="EPISODE")
    st.add_argument("values", metavar="KEY=VALUE", nargs="+", type=_pair)
    st.add_argument(
        "--kind",
        action="append",
        type=lambda t: tuple(t.split("=", 1)),
        metavar="KEY=KIND",
        help=kind_help,
    )
    imp = lsub.add_parser(
        "import",
        parents=[common],
        help="label many episodes from a file, in one write",
        description="Label many episodes in one write (one new version) from FILE: a JSON "
        "object {episode: {key: value}}, JSON lines with an 'episode' key, a CSV with an "
        "'episode' column, or Parquet with one (empty cells are skipped).",
    )
    imp.add_argument("slice_id", metavar="SLICE_ID")
    imp.add_argument("file", metavar="FILE")
    imp.add_argument(
        "--kind",
        action="append",
        type=lambda t: tuple(t.split("=", 1)),
        metavar="KEY=KIND",
        help=kind_help,
    )
    hist = lsub.add_parser("history", parents=[common], help="every version: who, when, what")
    hist.add_argument("slice_id", metavar="SLICE_ID")
    p.set_defaults(func=lambda args: _labels(args, client_of))

    create = slices_sub.add_parser(
        "create",
        parents=[common],
        help="publish a selection of a slice as a new slice (no data copied)",
        description="Publish the episodes of SLICE that match --where/--sites/--segments as "
        "a new slice: a new manifest referencing the parent's blobs, recording its lineage. "
        "The same selection gives the same slice ID. Needs a write token. docs/curation.md",
    )
    create.add_argument(
        "--from", dest="parent", required=True, metavar="SLICE", help="the parent slice"
    )
    create.add_argument("--where", default=None, metavar="FILTER", help=_WHERE_HELP)
    create.add_argument("--sites", nargs="+", metavar="SITE", help="only episodes of these sites")
    create.add_argument("--segments", nargs="+", metavar="ID", help="only these episodes")
    create.add_argument("--description", default="", help="the new slice's description")
    create.add_argument(
        "--id",
        default=None,
        metavar="SLICE_ID",
        help="publish under this ID (default: from the manifest hash)",
    )

    stats = slices_sub.add_parser(
        "stats",
        parents=[common],
        help="exact table statistics of a slice or a selection of it",
        description="Per-component mean, std, min, max, q01, q99 and count of the table "
        "streams over every grid sample of the selected episodes: the numbers "
        "EpisodeDataset(view, obs=..., action=..., fps=..., frame=...).stats() gives. Each "
        "episode's samples are kept in the cache the first time, so another selection of "
        "the same episodes reads no table blob again. Cameras get none. Needs the torch "
        "extra. docs/curation.md",
    )
    stats.add_argument("slice_id", metavar="SLICE_ID")
    stats.add_argument("--where", default=None, metavar="FILTER", help=_WHERE_HELP)
    stats.add_argument("--sites", nargs="+", metavar="SITE", help="only episodes of these sites")
    stats.add_argument("--segments", nargs="+", metavar="ID", help="only these episodes")
    stats.add_argument(
        "--streams",
        nargs="+",
        action=ListOption,
        metavar="S",
        help="the streams a dataset reads (default: every table stream); cameras get no "
        "statistics but shape the grid, as in the dataset (its first sample is where every "
        "stream has started)",
    )
    stats.add_argument(
        "--action",
        default=None,
        metavar="STREAM",
        help="the action stream, aligned with --action-mode (default: none)",
    )
    stats.add_argument(
        "--fps",
        type=float,
        default=None,
        metavar="HZ",
        help="the grid rate (default: the fastest named table stream's rate)",
    )
    stats.add_argument(
        "--frame",
        choices=("ros", "opencv"),
        default=None,
        help="coordinate convention of Cartesian streams (default: as stored)",
    )
    stats.add_argument(
        "--action-mode",
        choices=("hold", "nearest", "linear"),
        default="hold",
        help="how the action is aligned to the grid (default hold)",
    )
    stats.set_defaults(func=lambda args: slice_stats(args, client_of))
