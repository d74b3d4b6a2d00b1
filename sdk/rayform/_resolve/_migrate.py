"""``rayform cache migrate``: rewrite a client cache's older-format manifests.

The SDK reads one manifest format (``format_version`` 3). A cache filled by an earlier SDK
holds the manifests it pulled as they were served, version 1 or 2, and refuses to open them,
offline too. This rewrites, for every slice the cache remembers (``refs/<server>/<slice>``),
an older manifest into the one format from what the cache holds (a version 1 document alone;
a version 2 root and its cached pages), with ``rayform.manifest.upgrade_manifest``: the same
segments, so the same manifest (and hash) that ``rayform-server migrate`` gives on the server.
The new pages and root are stored (checked against their hashes) before the slice's reference
moves to them, each write atomic, so an interrupted run leaves the old reference (run it again)
or the new one. The labels cached on the old manifest are carried over when the cache holds
their whole chain of versions (what the server's migrate writes, byte for byte); otherwise
they are fetched again the next time the slice is opened online. Blobs are not touched.

A manifest whose pages are not all cached cannot be rewritten without the server: the line
for that slice says to run ``rayform pull SLICE`` online once the server has been migrated.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rayform._hashing import hash_bytes
from rayform.cache import Cache
from rayform.errors import ManifestError
from rayform.manifest import canonical_json, old_version, upgrade_manifest

__all__ = ["CacheMigration", "migrate_cache"]


@dataclass
class CacheMigration:
    """What ``rayform cache migrate`` did (or would do, in a dry run).

    Attributes:
        lines: one progress line per remembered slice.
        rewritten: old manifest hash -> new hash.
        unable: slices that need the server (their lines say what to run).
    """

    lines: list[str] = field(default_factory=list)
    rewritten: dict[str, str] = field(default_factory=dict)
    unable: list[str] = field(default_factory=list)

    def summary(self, dry_run: bool) -> str:
        """The last line of the command."""
        if not self.rewritten and not self.unable:
            return "nothing to migrate: every cached slice is in the current manifest format"
        verb = "would rewrite" if dry_run else "rewrote"
        left = f"; {len(self.unable)} slice(s) need the server (see above)" if self.unable else ""
        return f"{verb} {len(self.rewritten)} cached manifest(s), 0 blob bytes{left}"


def migrate_cache(
    cache: Cache, *, dry_run: bool = False, progress: Callable[[str], None] | None = None
) -> CacheMigration:
    """Rewrite the older-format manifests the cache's slice references name (module doc).

    Args:
        cache: the client cache.
        dry_run: only say what would be rewritten; write nothing.
        progress: called with one line per remembered slice.
    """
    out = CacheMigration()
    for ref in cache.refs():
        line = _one(cache, ref, out, dry_run)
        out.lines.append(line)
        if progress is not None:
            progress(line)
    return out


def _one(cache: Cache, ref: dict[str, Any], out: CacheMigration, dry_run: bool) -> str:
    key, slice_id, old = str(ref["endpoint_key"]), str(ref["id"]), str(ref["manifest"])
    where = f"{slice_id} ({key})"
    data = cache.get_manifest(old)
    version = None if data is None else old_version(data)
    if data is None or version is None:
        return f"{where}: nothing to do"
    new = out.rewritten.get(old)
    if new is None:
        missing: list[str] = []

        def pages(refs: list[dict[str, Any]]) -> list[Path]:
            paths = [cache.manifest_path(str(r["hash"])) for r in refs]
            missing.extend(
                str(r["hash"]) for r, p in zip(refs, paths, strict=True) if not p.is_file()
            )
            if missing:
                raise ManifestError("pages missing")
            return paths

        try:
            upgraded = upgrade_manifest(data, old, pages)
        except ManifestError as exc:
            out.unable.append(slice_id)
            why = f"{len(missing)} of its pages are not cached" if missing else str(exc)
            return (
                f"{where}: manifest {old[:12]}... (v{version}) cannot be rewritten here ({why}): "
                f"after `rayform-server migrate` on the server, run `rayform pull {slice_id}` online"
            )
        new = upgraded.hash
        if not dry_run:
            for page in upgraded.pages:
                cache.put_manifest(page, hash_bytes(page))
            cache.put_manifest(upgraded.root, new)
        out.rewritten[old] = new
    labels = 0 if dry_run else _carry_labels(cache, key, slice_id, old, new)
    if not dry_run:  # the reference moves last
        doc = {k: v for k, v in ref.items() if k != "endpoint_key"}
        cache.put_file(
            f"refs/{key}/{slice_id}", json.dumps({**doc, "manifest": new}, sort_keys=True).encode()
        )
    verb = "would rewrite" if dry_run else "rewrote"
    carried = (
        f", labels carried over ({labels} versions)"
        if labels > 0
        else ", its labels are fetched again when the slice is next opened online"
        if labels < 0
        else ""
    )
    return f"{where}: {verb} manifest {old[:12]}... (v{version}) -> {new[:12]}...{carried}"


def _carry_labels(cache: Cache, key: str, slice_id: str, old: str, new: str) -> int:
    """Copy the cached label chain on ``old`` onto ``new`` as the server's migrate does;
    returns the versions copied (0: no labels cached; -1: the cache lacks part of the chain,
    so they are fetched again online)."""
    head_path = cache.root / "labels" / key / slice_id / old
    try:
        head = json.loads(head_path.read_bytes())
    except (OSError, ValueError):
        return 0
    chain = []
    digest = head.get("hash")
    while digest is not None:
        data = cache.get_manifest(str(digest))
        if data is None:
            return -1  # fetched again online
        doc = json.loads(data)
        chain.append(doc)
        digest = doc.get("parent")
    parent: str | None = None
    size = 0
    for doc in reversed(chain):
        copy = canonical_json({**doc, "manifest": new, "parent": parent})
        parent = hash_bytes(copy)
        cache.put_manifest(copy, parent)
        size = len(copy)
    new_head = {**head, "hash": parent, "size": size}
    cache.put_file(f"labels/{key}/{slice_id}/{new}", json.dumps(new_head).encode())
    return len(chain)
