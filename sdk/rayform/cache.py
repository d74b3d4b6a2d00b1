"""The content-addressed cache that a whole cluster may share over NFS or Lustre.

Layout (see ``docs/cache.md``)::

    ROOT/blobs/ab/<hash>            verified, read-only blobs named by their BLAKE3 hex digest
    ROOT/manifests/ab/<hash>        verified, read-only manifests (canonical JSON bytes)
    ROOT/refs/<endpoint-key>/<id>   {"manifest": <hash>, ...}: how a slice resolved, per server
    ROOT/tmp/                       partial downloads: <hash>.<host>.<pid>.<random>.part
    ROOT/locks/                     per-blob lock files (an optimisation only)

A blob appears under its content name only complete and verified: it is written to a
process-unique temporary file on the same filesystem, hashed while streaming, fsync'd, made
read-only and atomically renamed. Locks only avoid duplicate downloads; two writers without
working locks still end with one correct blob. This module knows nothing of HTTP: a
``download`` callable fills a :class:`~rayform._seams.DownloadSink` (the cache's
:class:`~rayform._partial.PartialBlob`).
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
from rayform._locks import bounded_lock
from rayform._partial import PartialBlob, active, owner_dead, parse_tmp_name, tmp_name
from rayform._process import PerProcess
from rayform._seams import DownloadSink
from rayform._sharing import CacheModes, shared_mode
from rayform.errors import CacheError, IntegrityError, RayformError
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
        hint = (f"the disk holding the cache {root} is full: free space with "
                "`rayform cache prune --max-size SIZE` or set RAYFORM_CACHE_DIR to a bigger disk")
    elif exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
        hint = (f"the cache directory {root} is not writable: fix its permissions, or set "
                "RAYFORM_CACHE_DIR to a writable directory (read-only caches work offline only "
                "for what is already in them)")
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
            setgid and group-writable (see :mod:`rayform._sharing`).
        locks: take per-blob file locks to avoid duplicate downloads (``RAYFORM_NO_LOCKS=1``
            turns them off). Correctness never depends on them.
        stale_s: a temporary file untouched this long (seconds) may be adopted or removed even
            if its owner lives on another host.
        stall_s: stop waiting for another process's lock after this many seconds without
            progress on the blob.
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        shared: bool | None = None,
        locks: bool = True,
        stale_s: float = 600.0,
        stall_s: float = 10.0,
    ) -> None:
        self.root = Path(root).expanduser().absolute()
        _check_root(self.root)
        self.shared = shared_mode(self.root, shared)
        self._modes = CacheModes(self.root, self.shared)
        self.locks = locks and not env_flag("RAYFORM_NO_LOCKS")
        self.stale_s = stale_s
        self.stall_s = stall_s
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
        return self.blob_path(digest).is_file()

    def get_blob(self, digest: str) -> Path | None:
        """Path of cached blob ``digest`` (marking it used, once per process), or None."""
        path = self.blob_path(digest)
        if not path.is_file():
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

    def fetch_blob(self, ref: BlobRef, download: Callable[[DownloadSink], None]) -> tuple[Path, int]:
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
        if final.is_file():
            self._touch(final)
            return final, 0
        self._mkdir(self.root / "tmp")
        self._mkdir(final.parent)
        lock_path = self.root / "locks" / f"{ref.hash}.lock"
        if self.locks:
            self._mkdir(lock_path.parent)
        with self._maybe_lock(ref.hash, lock_path):
            if final.is_file():
                self._touch(final)
                return final, 0
            fetched = 0
            for attempt in range(2):
                part = self._open_partial(ref, adopt=attempt == 0)
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
                        self._commit(part.path, final)
                        self._drop_dead_partials(ref.hash)
                        return final, fetched
                    self._discard(part.path)
                finally:
                    active().discard(part.path.name)
        raise IntegrityError(
            f"blob {ref.hash[:12]}... failed verification twice (the bytes received do not "
            "match their BLAKE3 hash); nothing was cached. The server or a proxy is serving "
            "corrupted data: retry later or report it to the data owners."
        )

    def _maybe_lock(self, digest: str, lock_path: Path) -> contextlib.AbstractContextManager[bool]:
        if not self.locks:
            return contextlib.nullcontext(False)
        return bounded_lock(
            lock_path,
            done=lambda: self.blob_path(digest).is_file(),
            progress=lambda: self._tmp_progress(digest),
            stall_s=self.stall_s,
            mode=self._modes.file_mode,
        )

    def _tmp_progress(self, digest: str) -> tuple[tuple[str, int, int], ...]:
        out = []
        for p in (self.root / "tmp").glob(f"{digest}.*.part"):
            try:
                st = p.stat()
            except FileNotFoundError:
                continue
            out.append((p.name, st.st_size, st.st_mtime_ns))
        return tuple(sorted(out))

    def _open_partial(self, ref: BlobRef, *, adopt: bool) -> PartialBlob:
        tmp = self.root / "tmp"
        mine = tmp / tmp_name(ref.hash)
        active().add(mine.name)  # before the file exists: nobody may adopt it
        try:
            if adopt:
                for cand in sorted(tmp.glob(f"{ref.hash}.*.part")):
                    # Only our own: a published blob is made read-only, which only the owner
                    # of the file may do. Another user's dead partial is removed once complete.
                    if not _owned(cand) or not owner_dead(cand, self.stale_s):
                        continue
                    try:
                        os.rename(cand, mine)  # atomic: only one adopter wins
                    except FileNotFoundError:
                        continue
                    break
            return PartialBlob(mine, ref.hash, ref.size, self._modes.file_mode)
        except OSError as exc:
            active().discard(mine.name)
            raise cache_error(exc, self.root, f"create a temporary file in {tmp}") from exc

    def _drop_dead_partials(self, digest: str) -> None:
        """Remove partial downloads of a blob that is now complete, if their writers are gone.

        Several processes killed while fetching the same blob (e.g. DataLoader workers torn
        down together) leave one partial each; adoption takes only one of them.
        """
        for cand in (self.root / "tmp").glob(f"{digest}.*.part"):
            if owner_dead(cand, self.stale_s):
                with contextlib.suppress(OSError):
                    os.unlink(cand)

    def _commit(self, tmp: Path, final: Path) -> None:
        try:
            os.chmod(tmp, 0o444)
            if final.exists():  # someone else finished first: theirs is identical
                os.unlink(tmp)
            else:
                os.replace(tmp, final)
            self._fsync_dir(final.parent)
        except OSError as exc:
            self._discard(tmp)
            raise cache_error(exc, self.root, f"move a blob into {final.parent}") from exc
        self._touched.get().add(final.name)

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

    def set_ref(self, endpoint_key: str, slice_id: str, manifest_hash: str, **extra: object) -> None:
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
        paths = [refs / endpoint_key / slice_id] if endpoint_key else list(refs.glob(f"*/{slice_id}"))
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
        """Counts and bytes: ``{"blobs", "blob_bytes", "manifests", "manifest_bytes", "tmp_bytes"}``."""
        out = {"blobs": 0, "blob_bytes": 0, "manifests": 0, "manifest_bytes": 0, "tmp_bytes": 0}
        for e in self.ls():
            key = "blob" if e.kind == "blobs" else "manifest"
            out[e.kind] += 1
            out[f"{key}_bytes"] += e.size
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
            from rayform.errors import InvalidArgumentError

            raise InvalidArgumentError(f"max_bytes must be >= 0, got {max_bytes}")
        entries = sorted(self.ls("blobs"), key=lambda e: e.atime)
        total = sum(e.size for e in entries)
        evicted = []
        for e in entries:
            if total <= max_bytes:
                break
            try:
                os.unlink(e.path)
            except FileNotFoundError:
                pass
            except OSError as exc:
                raise cache_error(exc, self.root, f"evict {e.path}") from exc
            total -= e.size
            evicted.append(e)
        self.clean_tmp()
        return evicted

    def clean_tmp(self) -> int:
        """Remove temporary files whose writer is gone. Returns how many were removed."""
        n = 0
        for p in (self.root / "tmp").glob("*"):
            if parse_tmp_name(p.name) is None and time.time() - _mtime(p) < self.stale_s:
                continue
            if owner_dead(p, self.stale_s):
                try:
                    os.unlink(p)
                    n += 1
                except OSError:
                    pass
        return n


def _owned(p: Path) -> bool:
    try:
        return p.stat().st_uid == os.geteuid()
    except OSError:
        return False


def _mtime(p: Path) -> float:
    try:
        return p.stat().st_mtime
    except FileNotFoundError:
        return time.time()
