"""``rayform-server migrate ROOT``: rewrite a data root's older-format manifests.

Rayform reads one manifest format (``format_version`` 3). A data root written before holds
manifests of version 1 (one JSON document) or 2 (pages without renditions), which the server
can no longer serve to this SDK. For every slice whose current manifest or history names such
a manifest, this rewrites each one into the one format (``rayform.manifest.upgrade_manifest``:
the same segments, so the same bytes a fresh commit of them gives) and then:

* carries the label sets on the old manifest over to the new one (a label set annotates
  episodes by ID, and the IDs do not change): every version of the chain, re-parented;
* moves the slice's history markers and, if the current manifest was rewritten, the slice's
  reference to the new hashes;
* records ``migrated/ab/<old> -> <new>``, so the server can tell a client that asks for an old
  hash which hash it became (``GET /v1/slices/{id}/manifests/{old}`` answers 404 naming it).

Blobs are never read or written: the manifests name the same blobs. Per slice, every new
object (pages, root, label sets, the old -> new record) is written first, each to a temporary
file renamed into place, and the slice's reference moves last (atomically, under the slice
lock, only if it still names the manifest that was rewritten): a run killed at any point
leaves the slice naming its old manifest, intact, or its new one, complete, and the next run
finishes the work. A slice with nothing older to rewrite is left alone, so a second run
writes nothing and says so.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rayform.curation import labelset_bytes
from rayform.files import write_atomic
from rayform.format import hash_bytes
from rayform.manifest import Upgraded, old_version, upgrade_manifest
from rayform_server.labelstore import LabelStore
from rayform_server.store import SliceMovedError, Store

__all__ = ["MigrateReport", "SliceMigration", "migrate_root"]


@dataclass
class SliceMigration:
    """What migrating one slice did (or, in a dry run, would do).

    Attributes:
        slice_id: the slice.
        rewritten: old manifest hash -> new hash, for each older-format manifest it named.
        versions: old manifest hash -> its format version.
        current: the slice's manifest after the run (the new hash if it was rewritten).
        labels: label-set versions carried over to the new manifests.
        nbytes: bytes of manifests and label sets written (0 in a dry run).
    """

    slice_id: str
    rewritten: dict[str, str] = field(default_factory=dict)
    versions: dict[str, int] = field(default_factory=dict)
    current: str = ""
    labels: int = 0
    nbytes: int = 0

    def line(self, dry_run: bool) -> str:
        """The progress line of this slice."""
        if not self.rewritten:
            return f"{self.slice_id}: already in the current format, nothing to do"
        verb = "would rewrite" if dry_run else "rewrote"
        olds = ", ".join(
            f"{old[:12]}... (v{self.versions[old]}) -> {new[:12]}..."
            for old, new in self.rewritten.items()
        )
        labels = f", {self.labels} label set version(s) carried over" if self.labels else ""
        return f"{self.slice_id}: {verb} {len(self.rewritten)} manifest(s): {olds}{labels}"


@dataclass
class MigrateReport:
    """What a run did: one :class:`SliceMigration` per slice, in slice order."""

    slices: list[SliceMigration]
    dry_run: bool

    @property
    def changed(self) -> int:
        """Slices with at least one manifest rewritten (or to rewrite)."""
        return sum(1 for s in self.slices if s.rewritten)

    def summary(self) -> str:
        """The last line of the command."""
        if not self.changed:
            return (
                f"nothing to migrate: the {len(self.slices)} slice(s) of this root are all in "
                "the current manifest format"
            )
        written = sum(s.nbytes for s in self.slices)
        if self.dry_run:
            return (
                f"dry run: {self.changed} of {len(self.slices)} slice(s) would be rewritten; "
                "nothing was written (run again without --dry-run)"
            )
        return (
            f"migrated {self.changed} of {len(self.slices)} slice(s): {written} bytes of "
            "manifests and label sets written, 0 blob bytes"
        )


def migrate_root(
    root: str | Path, *, dry_run: bool = False, progress: Callable[[str], None] | None = None
) -> MigrateReport:
    """Rewrite every older-format manifest of the data root ``root`` (see the module doc).

    Args:
        root: the data root.
        dry_run: only say what would be rewritten; write nothing.
        progress: called with one line per slice.

    Raises:
        ManifestError: a manifest is neither of the current format nor a readable older one.
    """
    store = Store(root)
    report = MigrateReport([], dry_run)
    for slice_id in list(store.list_slices()):
        result = _migrate_slice(store, slice_id, dry_run)
        report.slices.append(result)
        if progress is not None:
            progress(result.line(dry_run))
    return report


def _migrate_slice(store: Store, slice_id: str, dry_run: bool) -> SliceMigration:
    ref = store.get_slice(slice_id)
    out = SliceMigration(slice_id)
    if ref is None:  # deleted meanwhile
        return out
    out.current = ref["manifest"]
    for old in store.manifest_history(slice_id):
        data = store.read_manifest_bytes(old)
        version = old_version(data)
        if version is None:
            continue
        out.versions[old] = version
        new = store.migrated_to(old)
        if new is None or not store.manifest_path(new).exists():
            upgraded = upgrade_manifest(data, old, lambda refs: _page_paths(store, refs))
            new = upgraded.hash
            if not dry_run:
                out.nbytes += _write(store, upgraded)
        out.rewritten[old] = new
        if not dry_run:
            out.labels += _carry_labels(store, slice_id, old, new, out)
            store.record_migration(old, new)
    if dry_run or not out.rewritten:
        return out
    # The reference moves last: before it, the slice still names its old manifest, intact.
    current = ref["manifest"]
    if current in out.rewritten:
        try:
            store.set_slice(
                slice_id, out.rewritten[current], ref.get("description", ""), expect=current
            )
        except SliceMovedError:
            # Committed meanwhile: its new manifest is of the current format; the history
            # below still moves.
            pass
        out.current = out.rewritten[current]
    for old, new in out.rewritten.items():  # new markers first: the history is never empty
        store.remember(slice_id, new)
        store.forget(slice_id, old)
    return out


def _page_paths(store: Store, refs: list[dict[str, Any]]) -> list[Path]:
    return [store.manifest_path(str(r["hash"])) for r in refs]


def _write(store: Store, upgraded: Upgraded) -> int:
    """Store the rewritten manifest (pages first, root last); returns the bytes written."""
    nbytes = sum(
        len(b)
        for b in [*upgraded.pages, upgraded.root]
        if not store.manifest_path(hash_bytes(b)).exists()
    )
    store.put_pages_and_root(upgraded.root, upgraded.pages)
    return nbytes


def _carry_labels(store: Store, slice_id: str, old: str, new: str, out: SliceMigration) -> int:
    """Copy the label-set chain on manifest ``old`` onto ``new``; returns versions copied.

    Each version is the same document with ``manifest`` set to ``new`` and ``parent`` to the
    copy of its parent, so the chain (and its history of who labelled what) is kept. A head
    already on ``new`` (labels written after an earlier, interrupted run) is left as it is.
    """
    labels = LabelStore(store)
    head_file = labels.head_path(slice_id, old)
    new_head = labels.head_path(slice_id, new)
    if not head_file.exists() or new_head.exists():
        return 0
    chain = []
    digest: str | None = json.loads(head_file.read_bytes())["hash"]
    while digest is not None:
        doc = json.loads(labels.object_path(digest).read_bytes())
        chain.append(doc)
        digest = doc.get("parent")
    parent: str | None = None
    head: dict[str, Any] = {}
    for doc in reversed(chain):  # oldest first: each copy names its parent's copy
        copy = {**doc, "manifest": new, "parent": parent}
        data = labelset_bytes(copy)
        parent = hash_bytes(data)
        dest = labels.object_path(parent)
        if not dest.exists():
            dest.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(dest, data, mode=0o444, tmp_dir=store.root / "tmp")
            out.nbytes += len(data)
        head = {"hash": parent, "version": copy["version"]}
    new_head.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(new_head, json.dumps(head).encode(), mode=0o644, tmp_dir=store.root / "tmp")
    return len(chain)


def add_parser(sub: Any) -> None:
    """Add ``migrate`` to the ``rayform-server`` subcommands (``sub``, argparse's)."""
    p = sub.add_parser(
        "migrate",
        help="rewrite a data root's older-format manifests into the current format",
        description="Rewrite every manifest of format version 1 (one JSON document) or 2 "
        "(pages without renditions) that a slice of ROOT names, now or in its history, into "
        "the current format (version 3), which is the only one this server and SDK read. Each "
        "slice's reference and history move to the new manifest hashes; label sets on an old "
        "manifest are carried over to its new one; blobs are not touched. Per slice, the new "
        "objects are written first and the reference moves last, so a run stopped at any point "
        "leaves every slice readable by the old or the new manifest; run it again to finish. "
        "A second run changes nothing. A client that asks for an old manifest hash is told the "
        "new one; client caches are rewritten with `rayform cache migrate`.",
        epilog="example: rayform-server migrate data/ --dry-run, then rayform-server migrate data/",
    )
    p.add_argument("root", metavar="ROOT", help="the data root (blobs/, manifests/, slices/)")
    p.add_argument(
        "--dry-run", action="store_true", help="say what would be rewritten; write nothing"
    )
    p.set_defaults(func=_main)


def _main(args: Any) -> int:
    root = Path(args.root)
    if not (root / "slices").is_dir():
        print(f"error: {root} is not a Rayform data root (no slices/ folder)", file=sys.stderr)
        return 2
    report = migrate_root(root, dry_run=args.dry_run, progress=print)
    print(report.summary())
    return 0
