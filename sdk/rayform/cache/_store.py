"""The content-addressed cache that a whole cluster may share over NFS or Lustre.

Layout (see ``docs/cache.md``)::

    ROOT/blobs/ab/<hash>            verified, read-only blobs named by their BLAKE3 hex digest
    ROOT/manifests/ab/<hash>        verified, read-only manifests (canonical JSON bytes)
    ROOT/refs/<endpoint-key>/<id>   {"manifest": <hash>, ...}: how a slice resolved, per server
    ROOT/tmp/                       partial downloads: <hash>.<host>.<pid>.<random>.part
    ROOT/claims/<hash>.claim        per-blob download claims (an optimisation only, any process)
    ROOT/pins/<hash>.<host>.<pid>.<token>   pins of blobs being read, seen by every node
    ROOT/live/                      the ledger, and what this host saw of others' heartbeats

A blob appears under its content name only complete and verified: it is written to a
process-unique temporary file on the same filesystem, hashed while streaming, fsync'd, made
read-only and atomically renamed. One claim per blob (:mod:`rayform.cache._claims`) only
avoids duplicate downloads, within a host and across nodes; two writers without working
claims still end with one correct blob. Whether another process's file is alive is decided by
one rule (:mod:`rayform.cache._liveness`). This module knows nothing of HTTP: a
``download`` callable fills a :class:`~rayform._seams.DownloadSink` (the cache's
:class:`~rayform.cache._partial.PartialBlob`).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from rayform._env import env_flag
from rayform._hashing import hash_bytes, hash_file
from rayform._ids import HASH_RE, sharded_path
from rayform._process import PerProcess
from rayform._seams import DownloadSink
from rayform.cache import _claims  # the module itself: its functions are patched in tests
from rayform.cache._evict import evict_one
from rayform.cache._live import lease, liveness, read_ledger
from rayform.cache._liveness import observer
from rayform.cache._partial import (
    PartialBlob,
    active,
    drop_dead_partials,
    open_partial,
    owner_dead,
    partial_named,
    tmp_name,
)
from rayform.cache._pinmarks import marked, pinned
from rayform.cache._reread import blob_opens, vanished
from rayform.cache._sharing import CacheModes, shared_mode
from rayform.errors import CacheError, IntegrityError, InvalidArgumentError, RayformError
from rayform.files import write_atomic
from rayform.manifest import BlobRef

__all__ = ["Cache", "CacheEntry", "VerifyReport"]

_KINDS = ("blobs", "manifests")


@dataclass(frozen=True)
class CacheEntry:
    """One cached object: kind (``"blobs"``/``"manifests"``), hash, size in bytes, last use (s)."""

    kind: str
    hash: str
    size: int
    atime: float
    path: Path


@dataclass(frozen=True)
class VerifyReport:
    """Result of :meth:`Cache.verify`: objects checked, and the hashes of those removed."""

    checked: int
    removed: list[str]


def cache_error(exc: OSError, root: Path, action: str) -> CacheError:
    """Turn an OSError from the cache filesystem into a CacheError saying what to do."""
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        hint = (
            f"the disk holding the cache {root} is full: free space with "
            "`rayform cache prune --max-size SIZE` or set RAYFORM_CACHE_DIR to a bigger disk"
        )
    elif exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
        hint = (
            f"the cache directory {root} is not writable: fix its permissions, or set "
            "RAYFORM_CACHE_DIR to a writable directory (read-only caches work offline only "
            "for what is already in them)"
        )
    else:
        hint = f"check the cache directory {root} or set RAYFORM_CACHE_DIR elsewhere"
    return CacheError(f"cannot {action}: {exc.strerror or exc}; {hint}")


def _check_root(root: Path) -> None:
    """Raise CacheError unless ``root`` is, or can become, a directory.

    Checked up front because a file in its place otherwise surfaces later as a bare
    ``NotADirectoryError`` deep inside a read, and listings of it look like an empty cache.
    """
    p = root
    while not p.exists() and p != p.parent:
        p = p.parent
    if not p.is_dir():
        where = "is a file" if p == root else f"is under {p}, which is a file"
        raise CacheError(
            f"the cache directory {root} {where}, not a directory; set RAYFORM_CACHE_DIR "
            "(or --cache-dir, or cache_dir=) to a directory, e.g. ~/.cache/rayform"
        )


class Cache:
    """A content-addressed store of blobs and manifests under ``root``.

    Args:
        root: the cache directory (created on first write).
        shared: group-writable cache for a team: what this process creates gets directories
            ``0o2775`` (setgid), temporary files ``0o664``; cached objects are always read-only
            (``0o444``). ``None`` (default): ``RAYFORM_CACHE_SHARED``, else shared if ``root`` is
            setgid and group-writable (see :mod:`rayform.cache._sharing`).
        locks: take a download claim per blob to avoid duplicate downloads on this host and
            across nodes (``RAYFORM_NO_LOCKS=1`` turns them off). Correctness never depends
            on them.
        stale_s: a temporary file this host has seen unchanged this long (seconds) may be
            adopted or removed even if its owner lives on another host.
        stall_s: stop waiting for another process's lock or claim after this many seconds
            without progress on the blob.
        claim_heartbeat_s: seconds between two rewrites of a claim this process holds.
        claim_stale_s: a claim whose record has not changed for this long, on the waiter's
            own clock, belongs to a dead or frozen process and is taken over, or removed by
            ``clean_tmp`` (it must exceed the heartbeat plus the seconds a network filesystem
            may show an old record).
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        shared: bool | None = None,
        locks: bool = True,
        stale_s: float = 600.0,
        stall_s: float = 10.0,
        claim_heartbeat_s: float = _claims.HEARTBEAT_S,
        claim_stale_s: float = _claims.STALE_S,
    ) -> None:
        if not 0 < 2 * claim_heartbeat_s < claim_stale_s:
            raise InvalidArgumentError(
                f"claim_stale_s ({claim_stale_s}) must exceed twice claim_heartbeat_s ({claim_heartbeat_s}), "
                f"both positive, e.g. the defaults {_claims.STALE_S} and {_claims.HEARTBEAT_S}"
            )
        self.root = Path(root).expanduser().absolute()
        _check_root(self.root)
        self.shared = shared_mode(self.root, shared)
        self._modes = CacheModes(self.root, self.shared)
        self.locks = locks and not env_flag("RAYFORM_NO_LOCKS")
        self.stale_s = stale_s
        self.stall_s = stall_s
        self.claim_heartbeat_s = claim_heartbeat_s
        self.claim_stale_s = claim_stale_s
        #: Blobs whose use this process has recorded (atime is updated once per process).
        self._touched: PerProcess[set[str]] = PerProcess(set)

    def __repr__(self) -> str:
        return f"<Cache {self.root} shared={self.shared} locks={self.locks}>"

    # -- paths -----------------------------------------------------------------------------
    def blob_path(self, digest: str) -> Path:
        """Where blob ``digest`` lives once cached (it may not exist)."""
        return sharded_path(self.root / "blobs", digest)

    def manifest_path(self, digest: str) -> Path:
        """Where manifest ``digest`` lives once cached (it may not exist)."""
        return sharded_path(self.root / "manifests", digest)

    def _mkdir(self, path: Path) -> None:
        try:
            self._modes.make_dirs(path)
        except OSError as exc:
            raise cache_error(exc, self.root, f"create {path}") from exc

    # -- blobs -----------------------------------------------------------------------------
    def has_blob(self, digest: str) -> bool:
        """True if blob ``digest`` is cached."""
        return self._cached(digest)

    def _cached(self, digest: str) -> bool:
        """True if blob ``digest`` is cached: by a ``stat``, or, after a read here found it gone,
        by an ``open`` (a network filesystem may show a removed file's cached stat for seconds)."""
        path = self.blob_path(digest)
        if not vanished(digest):
            return path.is_file()
        if blob_opens(path):
            vanished(digest, forget=True)
            return True
        return False

    def get_blob(self, digest: str) -> Path | None:
        """Path of cached blob ``digest`` (marking it used, once per process), or None."""
        path = self.blob_path(digest)
        if not self._cached(digest):
            return None
        self._touch(path)
        return path

    def _touch(self, path: Path) -> None:
        touched = self._touched.get()
        if path.name in touched:
            return
        touched.add(path.name)
        try:  # record the use in atime (needs ownership; other users' blobs stay as they are)
            os.utime(path, ns=(time.time_ns(), path.stat().st_mtime_ns))
        except OSError:
            pass

    def fetch_blob(
        self,
        ref: BlobRef,
        download: Callable[[DownloadSink], None],
        waiting: Callable[[], None] | None = None,
    ) -> tuple[Path, int]:
        """Return the path of blob ``ref``, running ``download`` to fill it if it is missing.

        ``download(part)`` must write the bytes from ``part.offset`` to the end with
        ``part.write``. If the finished bytes fail their hash the blob is fetched once more
        from scratch; if they fail again nothing is cached and IntegrityError is raised.

        Returns:
            (path, bytes downloaded by this call; 0 if it was already cached).

        Raises:
            IntegrityError: the bytes do not match ``ref.hash`` twice in a row.
            CacheError: the cache cannot be written (read-only, full disk).
        """
        final = self.blob_path(ref.hash)
        if self._cached(ref.hash):
            self._touch(final)
            return final, 0
        self._mkdir(self.root / "tmp")
        self._mkdir(final.parent)
        if self.locks:
            self._mkdir(self.root / "claims")
        with self._claim(ref.hash, waiting) as claim:
            theirs = claim.taken_from.part if claim.taken_from is not None else None
            if self._cached(ref.hash):  # a dead node's partial we took over is garbage now
                self._touch(final)
                drop_dead_partials(
                    self.root / "tmp",
                    ref.hash,
                    self.stale_s,
                    partial_named(self.root / "tmp", ref.hash, theirs),
                )
                return final, 0
            fetched, failed, lost = 0, 0, 0
            while failed < 2:
                part, copied = self._open_partial(
                    ref, adopt=failed == 0 and lost == 0, taken_from=theirs
                )
                claim.track(part)
                start = part.offset
                try:
                    try:
                        if part.remaining > 0:
                            download(part)
                        digest = part.finish()
                    except RayformError as exc:
                        part.close()
                        if isinstance(exc, IntegrityError):
                            self._discard(part.path)
                        raise
                    except OSError as exc:
                        part.close()
                        self._discard(part.path)
                        raise cache_error(exc, self.root, f"write blob {ref.hash[:12]}...") from exc
                    fetched += part.offset - start
                    if digest == ref.hash and part.offset == ref.size:
                        if self._commit(part.path, final, ref.size):
                            drop_dead_partials(self.root / "tmp", ref.hash, self.stale_s, copied)
                            return final, fetched
                        # Our file was removed as abandoned (this process was frozen past the
                        # stale time, or a node with its clock ahead cleaned up): fetch again.
                        lost += 1
                        if lost == 3:
                            raise CacheError(
                                f"blob {ref.hash[:12]}... was downloaded 3 times and each time "
                                f"its temporary file in {self.root / 'tmp'} was removed before it "
                                "could be moved into place: another process is removing live "
                                "temporary files (check the nodes' clocks, and that no job "
                                "deletes the cache's tmp/ directory)"
                            )
                        continue
                    self._discard(part.path)
                    failed += 1
                finally:
                    active().discard(part.path.name)
        raise IntegrityError(
            f"blob {ref.hash[:12]}... failed verification twice (the bytes received do not "
            "match their BLAKE3 hash); nothing was cached. The server or a proxy is serving "
            "corrupted data: retry later or report it to the data owners."
        )

    def _claim_path(self, digest: str) -> Path:
        return self.root / "claims" / f"{digest}.claim"

    def _claim(
        self, digest: str, waiting: Callable[[], None] | None
    ) -> contextlib.AbstractContextManager[_claims.Claimed]:
        if not self.locks:
            return contextlib.nullcontext(_claims.Claimed(None, None))
        return _claims.blob_claim(
            self._claim_path(digest),
            done=lambda: self._cached(digest),
            mode=self._modes.file_mode,
            heartbeat_s=self.claim_heartbeat_s,
            stale_s=self.claim_stale_s,
            stall_s=self.stall_s,
            check=waiting,
        )

    def _open_partial(
        self, ref: BlobRef, *, adopt: bool, taken_from: str | None = None
    ) -> tuple[PartialBlob, Path | None]:
        try:
            return open_partial(
                self.root / "tmp",
                ref.hash,
                ref.size,
                self._modes.file_mode,
                adopt=adopt,
                stale_s=self.stale_s,
                taken_from=taken_from,
            )
        except OSError as exc:
            raise cache_error(
                exc, self.root, f"create a temporary file in {self.root / 'tmp'}"
            ) from exc

    def _commit(self, tmp: Path, final: Path, size: int) -> bool:
        """Move the verified ``tmp`` (``size`` bytes) to ``final``; False if ``tmp`` was removed
        by another process meanwhile and ``final`` is not there either (download again).

        The blob that this call puts in place counts in this process's record of the cache's
        ledger (:mod:`rayform.cache._live`) at once, on every node, whatever its limit."""
        try:
            if not tmp.exists():
                # Frozen past our claim: the taker finished (final is there) or cleaned up.
                return blob_opens(final)
            try:
                os.chmod(tmp, 0o444)
                if self._cached(final.name):  # someone else finished first: theirs is identical
                    os.unlink(tmp)
                else:
                    os.replace(tmp, final)
                    lease(self.root).added(size)
            except FileNotFoundError:
                if not self._renamed_anyway(tmp, final, size):
                    return False
            self._fsync_dir(final.parent)
        except OSError as exc:
            self._discard(tmp)
            raise cache_error(exc, self.root, f"move a blob into {final.parent}") from exc
        self._touched.get().add(final.name)
        return True

    def _renamed_anyway(self, tmp: Path, final: Path, size: int) -> bool:
        """After a rename of ``tmp`` to ``final`` failed with ENOENT: True if ``final`` is in
        place now, False if ``tmp`` is gone (download again). Raises if the cause is real.

        Asked with an ``open``, not a ``stat``: a network filesystem shows a removed file's
        cached attributes for seconds (sshfs: 20 s), so a ``tmp`` taken over and removed by a
        node that judged us frozen still "exists" here. On a FUSE mount (sshfs), a rename onto
        a name this node still holds open (a pin or a decoder of the blob before another node
        evicted it) first moves that file aside, which fails as it is gone: a hard link, which
        moves nothing aside, puts the verified blob in place instead.
        """
        if blob_opens(final):
            return True
        if not blob_opens(tmp):
            return False
        if not blob_opens(final.parent):
            raise FileNotFoundError(errno.ENOENT, "no such directory", str(final.parent))
        try:
            os.link(tmp, final)
            lease(self.root).added(size)
        except FileExistsError:
            pass  # another process finished first: theirs is identical
        except OSError:
            self._discard(tmp)
            return False
        self._discard(tmp)
        return True

    @staticmethod
    def _fsync_dir(path: Path) -> None:
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            return
        try:
            os.fsync(fd)
        except OSError:
            pass
        finally:
            os.close(fd)

    @staticmethod
    def _discard(path: Path) -> None:
        try:
            os.unlink(path)
        except OSError:
            pass

    # -- small objects: manifests and refs -------------------------------------------------
    def _write_atomic(self, dest: Path, data: bytes, mode: int) -> None:
        self._mkdir(self.root / "tmp")
        self._mkdir(dest.parent)
        # A name `rayform cache` recognises: it may clear the leftovers of a killed writer.
        name = tmp_name(hash_bytes(dest.name.encode()), "tmp")
        try:
            write_atomic(dest, data, mode=mode, tmp_dir=self.root / "tmp", tmp_name=name)
        except OSError as exc:
            raise cache_error(exc, self.root, f"write {dest.name}") from exc

    def put_file(self, relpath: str, data: bytes) -> Path:
        """Atomically write a small derived file (e.g. ``stats/<key>.json``) under the root.

        It gets the cache's file mode (group-writable in a shared cache), like a slice reference.

        Raises:
            CacheError: the cache cannot be written (read-only, full disk).
        """
        dest = self.root / relpath
        self._write_atomic(dest, data, self._modes.file_mode)
        return dest

    def make_dir(self, relpath: str) -> Path:
        """Create the folder ``relpath`` under the root (and its parents) if missing.

        It gets the cache's directory mode (a team's ``2775`` in a shared cache), so that
        teammates can create entries in it, as in the cache's own folders.

        Raises:
            CacheError: the cache cannot be written (read-only, full disk).
        """
        path = self.root / relpath
        self._mkdir(path)
        return path

    def put_manifest(self, data: bytes, digest: str) -> Path:
        """Store manifest bytes under their BLAKE3 ``digest`` (checked)."""
        if hash_bytes(data) != digest:
            raise IntegrityError(
                f"manifest bytes do not match their hash {digest[:12]}...; not cached. "
                "Retry, and report it if it persists."
            )
        path = self.manifest_path(digest)
        if not path.is_file():
            self._write_atomic(path, data, 0o444)
        return path

    def get_manifest(self, digest: str) -> bytes | None:
        """Cached manifest bytes for ``digest``, or None."""
        try:
            return self.manifest_path(digest).read_bytes()
        except FileNotFoundError:
            return None

    def set_ref(
        self, endpoint_key: str, slice_id: str, manifest_hash: str, **extra: object
    ) -> None:
        """Remember that ``slice_id`` on the server ``endpoint_key`` resolved to ``manifest_hash``."""
        doc = {"id": slice_id, "manifest": manifest_hash, "resolved_at": time.time(), **extra}
        path = self.root / "refs" / endpoint_key / slice_id
        try:
            if json.loads(path.read_bytes()).get("manifest") == manifest_hash:
                return
        except (OSError, ValueError):
            pass
        self._write_atomic(path, json.dumps(doc, sort_keys=True).encode(), self._modes.file_mode)

    def get_ref(self, endpoint_key: str | None, slice_id: str) -> dict[str, object] | None:
        """How ``slice_id`` last resolved on ``endpoint_key`` (any server if None), or None."""
        refs = self.root / "refs"
        paths = (
            [refs / endpoint_key / slice_id] if endpoint_key else list(refs.glob(f"*/{slice_id}"))
        )
        docs = []
        for p in paths:
            try:
                doc = json.loads(p.read_bytes())
            except (OSError, ValueError):
                continue
            if isinstance(doc, dict) and HASH_RE.fullmatch(str(doc.get("manifest", ""))):
                docs.append(doc)
        return max(docs, key=lambda d: float(d.get("resolved_at", 0))) if docs else None

    def refs(self) -> list[dict[str, object]]:
        """Every remembered slice resolution."""
        out = []
        for p in sorted((self.root / "refs").glob("*/*")):
            try:
                doc = json.loads(p.read_bytes())
            except (OSError, ValueError):
                continue
            if isinstance(doc, dict):
                out.append({**doc, "endpoint_key": p.parent.name})
        return out

    # -- maintenance -----------------------------------------------------------------------
    def ls(self, kind: str | None = None) -> Iterator[CacheEntry]:
        """Every cached object (``kind`` ``"blobs"`` or ``"manifests"``; both if None)."""
        for k in (kind,) if kind else _KINDS:
            for path in sorted((self.root / k).glob("*/*")):
                if not HASH_RE.fullmatch(path.name):
                    continue
                try:
                    st = path.stat()
                except FileNotFoundError:
                    continue
                yield CacheEntry(k, path.name, st.st_size, max(st.st_atime, st.st_mtime), path)

    def du(self) -> dict[str, int]:
        """Counts and bytes: ``{"blobs", "blob_bytes", "manifests", "manifest_bytes",
        "tmp_bytes"}``, and what live readers of any node pin: ``"pinned_blobs"``,
        ``"pinned_bytes"``, ``"readers"`` (processes that pin blobs) and ``"processes"`` (live
        processes in the cache's ledger, :mod:`rayform.cache._live`)."""
        out = {"blobs": 0, "blob_bytes": 0, "manifests": 0, "manifest_bytes": 0, "tmp_bytes": 0}
        held = pinned(self.root)
        out.update(pinned_blobs=0, pinned_bytes=0, readers=held.readers, processes=held.processes)
        for e in self.ls():
            key = "blob" if e.kind == "blobs" else "manifest"
            out[e.kind] += 1
            out[f"{key}_bytes"] += e.size
            if e.kind == "blobs" and e.hash in held.hashes:
                out["pinned_blobs"] += 1
                out["pinned_bytes"] += e.size
        for p in (self.root / "tmp").glob("*"):
            try:
                out["tmp_bytes"] += p.stat().st_size
            except FileNotFoundError:
                pass
        return out

    def verify(self) -> VerifyReport:
        """Re-hash every cached object and remove those whose bytes do not match their name."""
        checked, removed = 0, []
        for e in self.ls():
            checked += 1
            try:
                ok = hash_file(e.path) == e.hash
            except FileNotFoundError:
                continue
            if not ok:
                try:
                    os.unlink(e.path)
                except OSError as exc:
                    raise cache_error(exc, self.root, f"remove corrupt {e.path}") from exc
                removed.append(e.hash)
        self.clean_tmp()
        return VerifyReport(checked, removed)

    def prune(self, max_bytes: int) -> list[CacheEntry]:
        """Evict least recently used blobs until blobs total at most ``max_bytes`` bytes.

        Returns:
            The evicted entries, least recently used first.
        """
        if max_bytes < 0:
            raise InvalidArgumentError(f"max_bytes must be >= 0, got {max_bytes}")
        entries = sorted(self.ls("blobs"), key=lambda e: e.atime)
        pinned = marked(self.root)  # pinned by a reader on any node
        total = sum(e.size for e in entries)
        evicted = []
        for e in entries:
            if total <= max_bytes:
                break
            if e.hash in pinned:
                continue
            try:
                # A blob a running job holds pinned (where flock works) stays, as in eviction.
                if not evict_one(e.path):
                    continue
            except OSError as exc:
                raise cache_error(exc, self.root, f"evict {e.path}") from exc
            total -= e.size
            evicted.append(e)
        self.clean_tmp()
        return evicted

    def clean_tmp(self) -> int:
        """Remove temporary files and claims whose writers are gone, by the one liveness rule
        (:mod:`rayform.cache._liveness`), and claims on complete blobs. What this pass saw of
        the others is kept for the next process of this host. Returns how many were removed."""
        n, keys = _claims.clean_claims(
            self.root / "claims",
            self.claim_stale_s,
            lambda name: bool(HASH_RE.fullmatch(name)) and self.has_blob(name),
        )
        for p in (self.root / "tmp").glob("*"):
            if owner_dead(p, self.stale_s):
                try:
                    os.unlink(p)
                    n += 1
                    continue
                except OSError:
                    pass
            keys.append(f"tmp/{p.name}")
        watch = liveness()
        for rec in read_ledger(self.root):
            watch.alive(rec)
            keys.append(rec.key)
        observer().save(self.root, keys)
        return n
