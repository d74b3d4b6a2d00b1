"""The server's data root on disk.

Layout (see ``docs/layout.md``)::

    ROOT/blobs/ab/abcdef...        content-addressed blobs (video, timestamps, tables), BLAKE3
    ROOT/manifests/ab/abcdef...    manifests, named by the BLAKE3 of their canonical bytes
    ROOT/slices/slc_xxxxxxxx.json  {"id", "manifest", "description"}: a named reference
    ROOT/slices/.lock              flock held while a reference moves (see ``set_slice``)
    ROOT/history/slc_xxxxxxxx/<hash>  one empty file per manifest the slice has named
    ROOT/migrated/ab/<old hash>    the hash an older-format manifest was rewritten as
                                   (``rayform-server migrate``)
    ROOT/tmp/                      staging for atomic writes (same filesystem)

Every write goes to a unique temporary file under ``tmp/`` and is renamed into place, so a
crash never leaves a partial object under a content name.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

from rayform import format as wire
from rayform.errors import RayformError
from rayform.files import write_atomic
from rayform.format import check_hash, check_slice_id, hash_bytes, new_hasher, sharded_path
from rayform.manifest import BlobRef, Manifest, canonical_json
from rayform_server.blobstore import BlobBackend, backend_for_root

__all__ = ["SliceMovedError", "Store"]


class SliceMovedError(RayformError):
    """A slice no longer names the manifest a change was planned against (another commit of
    the same slice came first); nothing was changed."""


class Store:
    """A data root: manifests and slice references under ``root``; blobs in ``blobs``.

    Args:
        root: the data root directory (created if missing).
        blobs: where blob bytes live; default what ``root/blobstore.json`` records, else the
            local directory ``root/blobs`` (see :mod:`rayform_server.blobstore`).
    """

    def __init__(self, root: str | os.PathLike[str], blobs: BlobBackend | None = None) -> None:
        self.root = Path(root).resolve()
        for sub in ("manifests", "slices", "tmp"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        self.blobs: BlobBackend = blobs if blobs is not None else backend_for_root(self.root)

    # -- paths -----------------------------------------------------------------------------
    def blob_path(self, digest: str) -> Path:
        """Local path of the blob with BLAKE3 ``digest`` (validated: no traversal possible).

        Raises:
            FileNotFoundError: the blobs live in remote object storage, not on this disk.
        """
        check_hash(digest)
        path = self.blobs.local_path(digest)
        if path is None:
            raise FileNotFoundError(
                f"blob {digest} lives in {self.blobs.describe()}, not on local disk"
            )
        return path

    def manifest_path(self, digest: str) -> Path:
        """The file ``manifests/ab/<hash>`` of manifest (or page) ``digest``."""
        return sharded_path(self.root / "manifests", digest)

    def slice_path(self, slice_id: str) -> Path:
        """The file ``slices/<id>.json`` naming the slice's current manifest."""
        check_slice_id(slice_id)
        return self.root / "slices" / f"{slice_id}.json"

    def history_path(self, slice_id: str, manifest_hash: str) -> Path:
        """The marker that ``slice_id`` once named manifest ``manifest_hash`` (both validated)."""
        check_slice_id(slice_id)
        check_hash(manifest_hash)
        return self.root / "history" / slice_id / manifest_hash

    # -- writes ----------------------------------------------------------------------------
    def _tmp(self) -> tuple[int, Path]:
        fd, name = tempfile.mkstemp(dir=self.root / "tmp", prefix="put-")
        return fd, Path(name)

    def put_bytes(self, data: bytes) -> BlobRef:
        """Store ``data`` as a blob; idempotent. Returns its hash and size."""
        digest = hash_bytes(data)
        if not self.blobs.exists(digest):
            fd, tmp = self._tmp()
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            self.blobs.add_file(tmp, digest)
        return BlobRef(digest, len(data))

    def put_file(self, path: str | os.PathLike[str], *, move: bool = False) -> BlobRef:
        """Store a file's bytes as a blob (hashing while copying); idempotent."""
        h = new_hasher()
        fd, tmp = self._tmp()
        size = 0
        try:
            with os.fdopen(fd, "wb") as out, Path(path).open("rb") as src:
                while chunk := src.read(1 << 20):
                    h.update(chunk)
                    out.write(chunk)
                    size += len(chunk)
            digest = h.hexdigest()
            self.blobs.add_file(tmp, digest)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        if move:
            Path(path).unlink()
        return BlobRef(digest, size)

    def put_manifest(self, manifest: Manifest) -> str:
        """Store an in-memory manifest's segments as a manifest (pages, then the root);
        returns its hash."""
        table = wire.segments_to_table(manifest.segments)
        pages = wire.table_to_pages(table)
        return self.put_pages_and_root(wire.build_root(table, pages, manifest.description), pages)

    def put_pages_and_root(self, root: bytes, pages: list[bytes]) -> str:
        """Store a manifest: its pages first, then the root that names them; returns the
        root's hash. Pages live beside manifests (metadata stays on the stub, whatever the
        blob backend), each under the hash of its bytes."""
        for page in pages:
            self._put_object(page)
        return self._put_object(root)

    def _put_object(self, data: bytes) -> str:
        digest = hash_bytes(data)
        dest = self.manifest_path(digest)
        if not dest.exists():
            dest.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(dest, data, mode=0o444, tmp_dir=self.root / "tmp")
        return digest

    def set_slice(
        self,
        slice_id: str,
        manifest_hash: str,
        description: str = "",
        *,
        expect: str | None = None,
    ) -> None:
        """Point ``slice_id`` at a stored manifest (atomically replaces an older reference).

        Every manifest the slice has named stays readable by hash through the slice
        (``GET /v1/slices/{id}/manifests/{hash}``): the old reference's manifest and the new
        one are recorded under ``history/<slice>/`` before the reference moves.

        Args:
            slice_id: the slice to create or move.
            manifest_hash: a manifest already in the store.
            description: the slice's description.
            expect: if given, move the slice only if it still names this manifest. Every
                ``set_slice`` of the root holds one lock while it reads and writes the
                reference, so no other commit can slip in between the check and the move.

        Raises:
            SliceMovedError: ``expect`` was given and the slice names another manifest (or
                none); the reference is left as it is.
        """
        check_hash(manifest_hash)
        if not self.manifest_path(manifest_hash).exists():
            raise FileNotFoundError(f"manifest {manifest_hash} is not in the store")
        with self._slices_locked():
            self._move(slice_id, manifest_hash, description, self._expect(slice_id, expect))

    def commit_slice(
        self, slice_id: str, write: Callable[[], str], description: str = "", *, expect: str
    ) -> str:
        """Store a manifest with ``write`` (which returns its hash) and point ``slice_id`` at
        it, only if the slice still names ``expect``; returns the hash.

        The check, the write and the move happen under the lock :meth:`set_slice` holds, so
        a refused commit writes no manifest that no slice names (a check, then
        ``write``, then ``set_slice(expect=)`` left one behind whenever the slice had moved).

        Raises:
            SliceMovedError: the slice names another manifest (or none); nothing is written.
        """
        with self._slices_locked():
            old = self._expect(slice_id, expect)
            digest = write()
            self._move(slice_id, digest, description, old)
        return digest

    def _expect(self, slice_id: str, expect: str | None) -> dict[str, str] | None:
        """The slice's reference; if ``expect`` is given it must name that manifest (held
        under the slice lock)."""
        old = self.get_slice(slice_id)
        if expect is not None and (old is None or old["manifest"] != expect):
            now = "no manifest (it was deleted)" if old is None else old["manifest"]
            raise SliceMovedError(
                f"slice {slice_id} moved from manifest {expect} to {now} meanwhile "
                "(another commit of the same slice); nothing was changed: run again"
            )
        return old

    def _move(
        self, slice_id: str, manifest_hash: str, description: str, old: dict[str, str] | None
    ) -> None:
        """Move the reference from ``old`` (held under the slice lock)."""
        for digest in ([old["manifest"]] if old is not None else []) + [manifest_hash]:
            self._remember(slice_id, digest)
        doc = {"id": slice_id, "manifest": manifest_hash, "description": description}
        write_atomic(
            self.slice_path(slice_id),
            canonical_json(doc),
            mode=0o644,
            tmp_dir=self.root / "tmp",
        )

    @contextlib.contextmanager
    def _slices_locked(self) -> Iterator[None]:
        """Hold the root's slice lock (``flock`` on ``slices/.lock``; blocks until free).

        Processes on other machines sharing the root over a filesystem without working
        ``flock`` are not serialised by it; on one machine (and on filesystems that honour it)
        every reference move is."""
        fd = os.open(self.root / "slices" / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
            except OSError as exc:
                # A filesystem without flock (some NFS mounts): move the reference unlocked,
                # as before there was a lock, rather than refuse every commit.
                if exc.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
                    raise
            yield
        finally:
            os.close(fd)  # releases the flock

    def _remember(self, slice_id: str, manifest_hash: str) -> None:
        marker = self.history_path(slice_id, manifest_hash)
        if not marker.exists():
            marker.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(marker, b"", mode=0o444, tmp_dir=self.root / "tmp")

    def remember(self, slice_id: str, manifest_hash: str) -> None:
        """Mark that ``slice_id`` names or once named ``manifest_hash`` (its history)."""
        self._remember(slice_id, manifest_hash)

    def forget(self, slice_id: str, manifest_hash: str) -> None:
        """Remove the marker that ``slice_id`` once named ``manifest_hash`` (the manifest
        stays); ``rayform-server migrate`` moves a slice's history to the rewritten hashes."""
        self.history_path(slice_id, manifest_hash).unlink(missing_ok=True)

    def migrated_path(self, manifest_hash: str) -> Path:
        """The file ``migrated/ab/<old hash>`` holding the hash an older-format manifest was
        rewritten as by ``rayform-server migrate``."""
        return sharded_path(self.root / "migrated", check_hash(manifest_hash))

    def record_migration(self, old: str, new: str) -> None:
        """Remember that manifest ``old`` was rewritten as ``new`` (atomically)."""
        path = self.migrated_path(old)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, check_hash(new).encode(), mode=0o644, tmp_dir=self.root / "tmp")

    def migrated_to(self, manifest_hash: str) -> str | None:
        """The hash manifest ``manifest_hash`` was rewritten as, or ``None``."""
        try:
            new = self.migrated_path(manifest_hash).read_text().strip()
        except FileNotFoundError:
            return None
        return check_hash(new)

    def delete_slice(self, slice_id: str) -> None:
        """Remove the slice reference and its history (the manifests and blobs stay)."""
        self.slice_path(slice_id).unlink(missing_ok=True)
        shutil.rmtree(self.root / "history" / check_slice_id(slice_id), ignore_errors=True)

    # -- reads -----------------------------------------------------------------------------
    def get_slice(self, slice_id: str) -> dict[str, str] | None:
        """The slice reference (``id``, ``manifest``, ``description``) or ``None``."""
        try:
            return json.loads(self.slice_path(slice_id).read_bytes())
        except FileNotFoundError:
            return None

    def manifest_history(self, slice_id: str) -> list[str]:
        """Hashes of every manifest ``slice_id`` has named (the current one included, also for
        a reference written before the history was kept), sorted."""
        ref = self.get_slice(slice_id)
        folder = self.root / "history" / check_slice_id(slice_id)
        named = (
            {p.name for p in folder.iterdir() if wire.HASH_RE.fullmatch(p.name)}
            if folder.is_dir()
            else set()
        )
        if ref is not None:
            named.add(ref["manifest"])
        return sorted(named)

    def has_named(self, slice_id: str, manifest_hash: str) -> bool:
        """Whether ``slice_id`` names or once named manifest ``manifest_hash``."""
        ref = self.get_slice(slice_id)
        if ref is not None and ref["manifest"] == manifest_hash:
            return True
        return (
            self.history_path(slice_id, manifest_hash).exists()
            and self.manifest_path(manifest_hash).exists()
        )

    def read_manifest_bytes(self, digest: str) -> bytes:
        """The stored bytes of manifest (or page) ``digest``."""
        return self.manifest_path(digest).read_bytes()

    def load_manifest(self, digest: str) -> wire.ColumnarManifest:
        """The manifest ``digest``, its pages mapped from disk.

        Raises:
            ManifestError: not a manifest of the one format (an older version names
                ``rayform-server migrate``), or it breaks the schema.
        """

        def pages(refs: list[dict[str, object]]) -> list[Path]:
            return [self.manifest_path(str(r["hash"])) for r in refs]

        return wire.load_manifest(self.read_manifest_bytes(digest), digest, pages)

    def page_hashes(self, digest: str) -> frozenset[str]:
        """Hashes of the pages of manifest ``digest`` (empty for bytes of an older version)."""
        return frozenset(str(r["hash"]) for r in wire.page_refs(self.read_manifest_bytes(digest)))

    def has_blob(self, digest: str) -> bool:
        """Whether the blob backend holds blob ``digest``."""
        return self.blobs.exists(digest)

    def list_slices(self) -> Iterator[str]:
        """The IDs of the data root's slices, in sorted order."""
        for p in sorted((self.root / "slices").glob("slc_*.json")):
            yield p.stem

    def clean_tmp(self) -> None:
        """Empty ``tmp/``, the staging directory of atomic writes."""
        shutil.rmtree(self.root / "tmp", ignore_errors=True)
        (self.root / "tmp").mkdir(exist_ok=True)
