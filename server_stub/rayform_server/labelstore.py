"""Label sets in the data root: content-addressed versions, a head per manifest, an audit log.

Layout (see ``docs/layout.md``)::

    ROOT/labelsets/ab/abcdef...            label sets, named by the BLAKE3 of their bytes
    ROOT/labels/slc_xxxxxxxx/<manifest>.json  {"hash", "version"}: the latest version of the
                                           labels on that manifest of the slice
    ROOT/labels/.lock                      flock held while a head moves (see ``write``)
    ROOT/audit.log                         one JSON line per accepted write: who, when, what

A write stores the new version under its hash (temporary file, then rename), then moves the
head (the same way), then appends its audit line, all under the lock: a writer killed at any
point leaves the previous head in place, or the new one complete. A killed append leaves at
most a partial last line, which a reader of the log skips (:func:`read_audit`).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from rayform.curation import (
    LIMITS,
    check_changes,
    check_spans_within,
    empty_labelset,
    labelset_bytes,
    merge,
    parse_labelset,
)
from rayform.errors import InvalidArgumentError, ManifestError, NotFoundError
from rayform.files import write_atomic
from rayform.format import check_hash, check_slice_id, hash_bytes, sharded_path
from rayform.manifest import Segments
from rayform_server.store import Store

__all__ = ["LabelStore", "audit", "read_audit"]


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """Hold ``flock`` on ``path`` (blocks until free); on a filesystem without ``flock`` go on
    unlocked, as the slice lock of :class:`~rayform_server.store.Store` does."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError as exc:
            if exc.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
                raise
        yield
    finally:
        os.close(fd)


def audit(store: Store, event: Mapping[str, Any]) -> None:
    """Append one line to ``ROOT/audit.log`` (``at`` added; written whole and synced)."""
    line = json.dumps({"at": _now(), **event}, sort_keys=True, separators=(",", ":")) + "\n"
    fd = os.open(store.root / "audit.log", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
        os.fsync(fd)
    finally:
        os.close(fd)


def read_audit(root: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Every complete line of ``ROOT/audit.log``, oldest first (a torn last line is skipped)."""
    try:
        lines = (Path(root) / "audit.log").read_bytes().splitlines()
    except FileNotFoundError:
        return []
    out = []
    for line in lines:
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


class LabelStore:
    """The label sets of a data root (see the module docstring for the layout)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.root = store.root

    def object_path(self, digest: str) -> Path:
        """The file ``labelsets/ab/<hash>`` of label set ``digest``."""
        return sharded_path(self.root / "labelsets", check_hash(digest))

    def head_path(self, slice_id: str, manifest_hash: str) -> Path:
        """The file naming the latest label set of that slice's manifest."""
        return self.root / "labels" / check_slice_id(slice_id) / f"{check_hash(manifest_hash)}.json"

    def head(self, slice_id: str, manifest_hash: str) -> dict[str, Any]:
        """``{"hash", "version", "size"}`` of the latest label set on that manifest, or
        ``{"hash": None, "version": 0, "size": 0}`` when nobody labelled it yet."""
        try:
            doc = json.loads(self.head_path(slice_id, manifest_hash).read_bytes())
        except FileNotFoundError:
            return {"hash": None, "version": 0, "size": 0}
        size = self.object_path(doc["hash"]).stat().st_size
        return {"hash": doc["hash"], "version": doc["version"], "size": size}

    def read(self, slice_id: str, digest: str) -> bytes:
        """The bytes of label set ``digest`` if it labels a manifest of ``slice_id``.

        Raises:
            NotFoundError: no such label set, or it labels another slice.
        """
        try:
            data = self.object_path(digest).read_bytes()
        except FileNotFoundError:
            raise NotFoundError(f"no label set {digest[:12]}... on this server") from None
        if json.loads(data).get("slice") != slice_id:
            raise NotFoundError(f"label set {digest[:12]}... does not label slice {slice_id}")
        return data

    def load(self, slice_id: str, manifest_hash: str, digest: str | None) -> dict[str, Any]:
        """The parsed label set ``digest`` of that manifest (the empty one for ``None``)."""
        if digest is None:
            return empty_labelset(slice_id, manifest_hash)
        try:
            return parse_labelset(self.read(slice_id, digest), digest, slice_id, manifest_hash)
        except (NotFoundError, ManifestError):
            raise InvalidArgumentError(
                f"label set {digest[:12]}... is not a version of the labels on manifest "
                f"{manifest_hash[:12]}... of slice {slice_id}: read the labels again"
            ) from None

    def write(
        self,
        slice_id: str,
        manifest_hash: str,
        segments: Segments,
        body: Mapping[str, Any],
        by: str,
    ) -> dict[str, Any]:
        """Apply one write (``{"base", "set", "kinds"?}``) to the labels of that manifest.

        Returns:
            The new head ``{"hash", "version", "size", "changed"}`` (``changed`` false: the
            write set nothing new, and no version was made).

        Raises:
            InvalidArgumentError: a malformed write, an episode the manifest lacks, a value of
                the wrong kind, a write over the limits.
            ConflictError: a key it sets was changed by someone else since ``base``.
        """
        unknown = set(body) - {"base", "set", "kinds"}
        if unknown or "set" not in body or "base" not in body:
            raise InvalidArgumentError(
                'a label write is {"base": hash or null, "set": {episode: {key: value}}, '
                f'"kinds"?: {{key: kind}}}}; got keys {sorted(body)}'
            )
        base_hash = body["base"]
        if base_hash is not None and not isinstance(base_hash, str):
            raise InvalidArgumentError(
                f"base={base_hash!r}: the hash of the version you read, or null"
            )
        with _locked(self.root / "labels" / ".lock"):
            head = self.head(slice_id, manifest_hash)
            head_doc = self.load(slice_id, manifest_hash, head["hash"])
            base_doc = (
                head_doc
                if base_hash == head["hash"]
                else self.load(slice_id, manifest_hash, base_hash)
            )
            changes, kinds = check_changes(body["set"], head_doc["kinds"], body.get("kinds"))
            ids = list(changes)
            found = segments.find(ids)
            missing = [ids[i] for i in range(len(ids)) if found[i] < 0]
            if missing:
                raise InvalidArgumentError(
                    f"{len(missing)} episode(s) are not in manifest {manifest_hash[:12]}... of "
                    f"slice {slice_id}, e.g. {missing[0]}: label episodes of this slice "
                    "(slice_.segments.ids())"
                )
            check_spans_within(changes, kinds, segments)
            new = merge(base_doc, head_doc, head["hash"], changes, kinds, by=by, at=_now())
            if new is None:
                return {**head, "changed": False}
            data = labelset_bytes(new)
            if len(data) > LIMITS["labelset_bytes"]:
                raise InvalidArgumentError(
                    f"the labels would take {len(data)} bytes, over the {LIMITS['labelset_bytes']} "
                    "a label set may hold: shorten texts or publish a smaller slice to label"
                )
            digest = hash_bytes(data)
            dest = self.object_path(digest)
            dest.parent.mkdir(parents=True, exist_ok=True)
            if not dest.exists():
                write_atomic(dest, data, mode=0o444, tmp_dir=self.root / "tmp")
            ref = {"hash": digest, "version": new["version"]}
            head_file = self.head_path(slice_id, manifest_hash)
            head_file.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(head_file, json.dumps(ref).encode(), mode=0o644, tmp_dir=self.root / "tmp")
            entry = new["history"][-1]
            audit(
                self.store,
                {
                    "action": "labels",
                    "by": by,
                    "slice": slice_id,
                    "manifest": manifest_hash,
                    "labels": digest,
                    "version": new["version"],
                    "episodes": entry["episodes"],
                    "keys": entry["keys"],
                },
            )
        return {**ref, "size": len(data), "changed": True}
