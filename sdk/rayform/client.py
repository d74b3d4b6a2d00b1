"""``rayform.Client``: resolve slices, fetch blobs into the shared cache, work offline.

::

    client = rayform.Client()                     # RAYFORM_ENDPOINT / RAYFORM_TOKEN / ...
    slice_ = client.slices.get("slc_7c1e04aa")    # -> rayform.Slice
    path = slice_.blob_path(ref)                  # verified, read-only file in the cache

The client is picklable and fork-safe: it holds no connection, socket or file handle until it
is first used in a process (PyTorch DataLoader workers each open their own).
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from rayform._boundary import argument_errors
from rayform._env import default_cache_dir, env_flag
from rayform._ids import check_hash, check_slice_id, check_stream_names
from rayform._limits import resolve_cache_limit, resolve_min_rate, resolve_stall_timeout
from rayform._net import (
    LISTING_CAP,
    REFERENCE_CAP,
    BlobUrls,
    Outages,
    PullReport,
    Transport,
    check_listing,
    check_reference,
    fetch_log,
    run_pull,
)
from rayform._resolve import missing_blobs, open_manifest, remembered
from rayform._seams import BlobSource, DownloadSink, ProgressCallback
from rayform.cache import HOST, Cache, Evictor, Pins, check_fits
from rayform.curation import LabelRemote
from rayform.errors import (
    InvalidArgumentError,
    ManifestError,
    NotFoundError,
    OfflineError,
    TransportError,
)
from rayform.manifest import MAX_MANIFEST_BYTES, BlobRef, ColumnarManifest
from rayform.slice import Slice
from rayform.uri import selection_expression

__all__ = ["Client", "PullReport", "SliceAPI"]

log = logging.getLogger("rayform.client")


def _has_code(selection: dict[str, Any] | None) -> bool:
    """Whether a view's selection (or one it was made within) holds a Python predicate."""
    while selection is not None:
        if "where" in selection:
            return True
        selection = selection.get("within")
    return False


def endpoint_key(endpoint: str) -> str:
    """A directory-safe name for a server, e.g. ``127.0.0.1_8765-1a2b3c4d``."""
    readable = re.sub(r"^[a-z]+://", "", endpoint.rstrip("/"))
    readable = re.sub(r"[^A-Za-z0-9.-]+", "_", readable)[:60]
    return f"{readable}-{hashlib.sha256(endpoint.rstrip('/').encode()).hexdigest()[:8]}"


class SliceAPI:
    """``client.slices``: resolve and list slices.

    Args:
        resolve: ``resolve(slice_id) -> Slice`` for a well-formed ID (online or offline).
        list_all: ``list_all() -> [{"id", "manifest", "description"}, ...]``.
        owner: what the API belongs to (shown in its repr).
        resolve_at: ``resolve_at(slice_id, manifest_hash) -> Slice``: the slice bound to one
            manifest it names or once named (``get(..., manifest_hash=)``); ``None``: not offered.
    """

    def __init__(
        self,
        resolve: Callable[[str], Slice],
        list_all: Callable[[], list[dict[str, Any]]],
        owner: object = None,
        resolve_at: Callable[[str, str], Slice] | None = None,
        create: Callable[[Slice, str, str | None], Slice] | None = None,
    ) -> None:
        self._resolve = resolve
        self._list_all = list_all
        self._owner = owner
        self._resolve_at = resolve_at
        self._create = create

    @argument_errors
    def get(self, slice_id: str, *, manifest_hash: str | None = None) -> Slice:
        """Resolve ``slice_id`` to its manifest and return the :class:`~rayform.Slice`.

        Online, the server says which manifest the slice points at; the manifest bytes are
        verified against their BLAKE3 hash and cached, and the resolution is remembered so the
        slice works offline later. Offline, the remembered resolution is used.

        With ``manifest_hash`` (e.g. a dataset URI's), the slice is bound to exactly that
        manifest, whichever one the slice names now: online the server hands it out if the
        slice names it or ever named it (``GET /v1/slices/{id}/manifests/{hash}``), and its
        blobs stay readable through the slice; offline it is read from the cache by its hash.
        The bytes are verified against the hash and cached; what the slice resolves to without
        ``manifest_hash`` is not changed.

        Raises:
            InvalidArgumentError: malformed ID or hash (no request is made).
            NotFoundError: unknown slice, one your token may not see, or (with
                ``manifest_hash``) a manifest the slice never named on this server.
            AccessDeniedError: missing or wrong token.
            OfflineError: offline mode and the slice (or that manifest) was never cached here.
            TransportError: the server cannot be reached.
        """
        slice_id = check_slice_id(slice_id)
        if manifest_hash is None:
            return self._resolve(slice_id)
        manifest_hash = check_hash(manifest_hash)
        if self._resolve_at is None:
            raise InvalidArgumentError(
                f"{self._owner!r} cannot resolve a slice at a given manifest hash"
            )
        return self._resolve_at(slice_id, manifest_hash)

    @argument_errors
    def create(self, view: Slice, *, description: str = "", slice_id: str | None = None) -> Slice:
        """Publish a selection (``slice_.select(...)``) as a new slice, without copying data.

        The server rebuilds the selection from the parent's manifest (and, for a filter, the
        label-set version the view pinned), writes a manifest that lists the selected
        episodes and references the parent's blobs (no blob is written, copied or uploaded),
        and records the parent, the selection and the label set in it (:attr:`Slice.lineage`).
        The same selection gives the same manifest, hence the same ID: publishing twice is a
        no-op. Needs a write token whose scope covers the new ID (docs/curation.md).

        Args:
            view: a view made with :meth:`Slice.select` (a text ``where=``, not a function).
            description: the new slice's description (not part of its manifest).
            slice_id: the ID to publish under (must be in the token's write scope); default
                ``slc_`` and 16 hex digits of the new manifest's hash.

        Returns:
            The new :class:`~rayform.Slice`, resolved.

        Raises:
            InvalidArgumentError: not a view, a view made with a Python ``where=`` function,
                or a malformed ``slice_id``.
            AccessDeniedError: the token may not write the new slice.
            ConflictError: ``slice_id`` names another slice already.
        """
        if not isinstance(view, Slice) or view.selection is None:
            raise InvalidArgumentError(
                f"slices.create() publishes a selection: pass slice_.select(...), got {view!r}"
            )
        if not isinstance(description, str) or len(description) > 1000:
            raise InvalidArgumentError("description= is a string of at most 1000 characters")
        if slice_id is not None:
            slice_id = check_slice_id(slice_id)
        if self._create is None:
            raise InvalidArgumentError(f"{self._owner!r} cannot publish slices")
        return self._create(view, description, slice_id)

    def list(self) -> list[dict[str, Any]]:
        """Slices this token may see: ``[{"id", "manifest", "description"}, ...]``.

        Offline, the slices remembered in the cache.
        """
        return self._list_all()

    def __repr__(self) -> str:
        return f"<SliceAPI of {self._owner!r}>"


class Client:
    """Access to one Rayform server and the local (possibly shared) cache.

    Args:
        endpoint: server base URL; default ``RAYFORM_ENDPOINT``.
        token: bearer token; default ``RAYFORM_TOKEN``. Never shown in reprs, logs or errors.
        cache_dir: cache directory; default ``RAYFORM_CACHE_DIR``, else the user cache dir
            (``~/.cache/rayform`` on Linux).
        offline: never open a network connection; default ``RAYFORM_OFFLINE=1``.
        locks: one download claim per blob against duplicate downloads, on this host and
            across nodes (``RAYFORM_NO_LOCKS=1`` disables them); correctness never depends
            on them.
        shared: group-writable cache for a team (directories setgid ``0o2775``).
        timeout: per-request timeout in seconds (connect, and each read).
        attempts: attempts per request before giving up (retries back off exponentially).
        stall_timeout: seconds any network operation may go without progress, retries
            included, before it fails with a :class:`~rayform.errors.TransportError` naming the
            side that failed (the server or its object store); default
            ``RAYFORM_STALL_TIMEOUT``, else 120.
        cache_limit: bytes the cache's blobs may take, an ``int`` or a size such as ``"10GB"``;
            default ``RAYFORM_CACHE_LIMIT``, else no limit. Each fetch evicts least recently
            used blobs that no process is using (``docs/cache.md``).
    """

    def __init__(
        self,
        endpoint: str | None = None,
        token: str | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
        offline: bool | None = None,
        *,
        locks: bool = True,
        shared: bool | None = None,
        timeout: float = 30.0,
        attempts: int = 5,
        stall_timeout: float | None = None,
        cache_limit: int | str | None = None,
    ) -> None:
        endpoint = endpoint or os.environ.get("RAYFORM_ENDPOINT") or None
        if endpoint is not None and not re.match(r"^https?://[^\s/]+", endpoint):
            raise InvalidArgumentError(
                f"endpoint {endpoint!r} is not an http(s) URL; pass e.g. "
                "endpoint='https://rayform.example.com' or set RAYFORM_ENDPOINT"
            )
        self.endpoint: str | None = endpoint.rstrip("/") if endpoint else None
        self._token = token or os.environ.get("RAYFORM_TOKEN") or None
        if cache_dir is None:
            cache_dir = default_cache_dir()
        if offline is None:
            offline = env_flag("RAYFORM_OFFLINE")
        self.offline = bool(offline)
        self.cache = Cache(cache_dir, shared=shared, locks=locks)
        self.timeout = timeout
        self.attempts = attempts
        self.stall_timeout = resolve_stall_timeout(stall_timeout)
        self._min_rate = resolve_min_rate()
        self.cache_limit = resolve_cache_limit(cache_limit)
        # Only from a fetch until the reader pins it itself: flock alone (a marker file per
        # fetch cost a network round trip or two on a shared cache; the reader's pin has one).
        self._pins = Pins(4, across_nodes=False)
        self._evictor = Evictor(self.cache.root)
        self._transport_obj: Transport | None = None
        self._blob_urls = BlobUrls(self._post_once)
        self._manifests: dict[str, ColumnarManifest] = {}
        #: Slice ID -> manifests bound by hash (``slices.get(..., manifest_hash=)``), in order:
        #: what an offline error names a pull of.
        self._bound: dict[str, tuple[str, ...]] = {}
        self.slices = SliceAPI(
            self._get_slice, self._list_slices, self, self._get_slice_at, self._create_slice
        )

    @property
    def cache_dir(self) -> Path:
        """The cache directory."""
        return self.cache.root

    def __repr__(self) -> str:
        token = "***" if self._token else None
        return (
            f"Client(endpoint={self.endpoint!r}, token={token}, cache_dir='{self.cache_dir}', "
            f"offline={self.offline})"
        )

    def __getstate__(self) -> dict[str, Any]:
        # Connections are dropped by the transport's PerProcess holder. The parsed manifests
        # travel (a spawned worker need not re-parse them), copied in one step because another
        # thread may resolve a slice while a DataLoader pickles this client.
        state = self.__dict__.copy()
        state["_manifests"] = dict(self._manifests)
        state["_bound"] = dict(self._bound)
        return state

    # -- plumbing --------------------------------------------------------------------------
    def _transport(self) -> Transport:
        if self.offline:  # defensive: every caller checks first, with a better message
            raise OfflineError("offline mode (RAYFORM_OFFLINE=1): no network access is allowed")
        if self.endpoint is None:
            raise InvalidArgumentError(
                "no server endpoint: pass Client(endpoint='https://...') or set RAYFORM_ENDPOINT"
            )
        if self._transport_obj is None:
            self._transport_obj = Transport(
                self.endpoint,
                self._token,
                timeout=self.timeout,
                attempts=self.attempts,
                stall_timeout=self.stall_timeout,
                min_rate=self._min_rate,
                watch=Outages(
                    self.cache, f"{endpoint_key(self.endpoint)}.{HOST}.outage", self.stall_timeout
                ),
            )
        return self._transport_obj

    def _key(self) -> str | None:
        return endpoint_key(self.endpoint) if self.endpoint else None

    @property
    def connected(self) -> bool:
        """Whether this process holds network connections (opened on first use, per process:
        a forked or unpickled copy holds none until it makes a request)."""
        return self._transport_obj is not None and self._transport_obj.connected

    def close(self) -> None:
        """Close network connections held by this process (reopened on next use)."""
        if self._transport_obj is not None:
            self._transport_obj.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- slices ----------------------------------------------------------------------------
    def _list_slices(self) -> list[dict[str, Any]]:
        if self.offline:
            return [
                {"id": r["id"], "manifest": r["manifest"], "description": r.get("description", "")}
                for r in self.cache.refs()
            ]
        t = self._transport()
        return check_listing(t.get_json("v1/slices", "listing slices", limit=LISTING_CAP), t.server)

    def _get_slice(self, slice_id: str) -> Slice:
        if self.offline:
            ref = self.cache.get_ref(self._key(), slice_id) or self.cache.get_ref(None, slice_id)
            if ref is None:
                raise OfflineError(
                    f"slice {slice_id} is not in the cache {self.cache_dir} and offline mode is "
                    f"on (RAYFORM_OFFLINE=1); on a machine with network access run "
                    f"`rayform pull {slice_id}` into this cache first"
                )
            digest = str(ref["manifest"])
            data = self.cache.get_manifest(digest)
            if data is None:
                raise OfflineError(
                    f"the manifest of slice {slice_id} is missing from the cache {self.cache_dir}; "
                    f"run `rayform pull {slice_id}` with network access"
                )
            return self._make_slice(slice_id, digest, data)
        t = self._transport()
        what = f"resolving slice {slice_id}"
        try:
            doc = t.get_json(f"v1/slices/{slice_id}", what, limit=REFERENCE_CAP)
        except NotFoundError:
            raise NotFoundError(
                f"slice {slice_id} was not found on {self.endpoint} (or your token may not see "
                "it); check the ID with `rayform slices ls`"
            ) from None
        digest, size, description = check_reference(doc, f"{what}: {t.server}")
        data = self.cache.get_manifest(digest)
        if data is None:
            data = t.get_bytes(
                f"v1/slices/{slice_id}/manifest", f"fetching the manifest of {slice_id}", limit=size
            )
            try:
                slice_ = self._make_slice(slice_id, digest, data)  # verifies before caching
            except ManifestError as exc:
                raise ManifestError(
                    f"the server {self.endpoint} sent an unusable manifest for slice {slice_id}: "
                    f"{exc} Nothing was cached; if it persists, report it to the data owners."
                ) from None
            self.cache.put_manifest(data, digest)
        else:
            slice_ = self._make_slice(slice_id, digest, data)
        self.cache.set_ref(
            self._key() or "", slice_id, digest, endpoint=self.endpoint, description=description
        )
        return slice_

    def _get_slice_at(self, slice_id: str, digest: str) -> Slice:
        """``slice_id`` bound to manifest ``digest`` (``slices.get(..., manifest_hash=)``)."""
        slice_ = self._open_at(slice_id, digest)
        # Replaced, not changed in place: a DataLoader may pickle this client meanwhile.
        earlier = tuple(d for d in self._bound.get(slice_id, ()) if d != digest)
        self._bound[slice_id] = (*earlier, digest)
        return slice_

    def _open_at(self, slice_id: str, digest: str) -> Slice:
        if self.offline:
            data = self.cache.get_manifest(digest)
            if data is None:
                raise OfflineError(
                    f"manifest {digest[:12]}... of slice {slice_id} is not in the cache {self.cache_dir} "
                    f"and offline mode is on (RAYFORM_OFFLINE=1); with network access run "
                    f"`rayform pull {slice_id} --manifest {digest}` while the server still has that version"
                )
            return self._make_slice(slice_id, digest, data)
        # Asked every time online: the server decides whether this slice may hand it out. A
        # copy in the cache is asked about conditionally (ETag: the hash), so it is not
        # downloaded again.
        t = self._transport()
        path = f"v1/slices/{slice_id}/manifests/{digest}"
        what = f"fetching manifest {digest[:12]}... of slice {slice_id}"
        cached = self.cache.get_manifest(digest)
        try:
            if cached is None:
                data = t.get_bytes(path, what, limit=MAX_MANIFEST_BYTES)
            else:
                fresh = t.get_bytes_unless(path, what, digest, limit=MAX_MANIFEST_BYTES)
                if fresh is None:
                    return self._make_slice(slice_id, digest, cached)
                data = fresh
        except NotFoundError as exc:
            raise NotFoundError(
                f"slice {slice_id} on {self.endpoint} does not name manifest {digest[:12]}... now or "
                f"before (or the slice is unknown, your token may not see it, or the server predates "
                f"manifests by hash). {exc}"
            ) from None
        try:
            slice_ = self._make_slice(slice_id, digest, data)  # verifies before caching
        except ManifestError as exc:
            raise ManifestError(
                f"the server {self.endpoint} sent an unusable manifest {digest[:12]}... for slice "
                f"{slice_id}: {exc} Nothing was cached; if it persists, report it to the data owners."
            ) from None
        self.cache.put_manifest(data, digest)
        return slice_

    def _make_slice(self, slice_id: str, digest: str, data: bytes) -> Slice:
        fetch = None
        if not self.offline:

            def fetch(page: str, size: int) -> bytes:
                return self._transport().get_bytes(
                    f"v1/slices/{slice_id}/pages/{page}",
                    f"fetching manifest page {page[:12]}... of {slice_id}",
                    limit=size,
                )

        manifest = self._manifests.get(digest)
        if manifest is None:
            pull = f"rayform pull {slice_id}"  # what fetches a page missing offline
            if self.offline and digest != remembered(self.cache, self._key(), slice_id):
                pull += f" --manifest {digest}"  # a plain pull fetches the current manifest
            manifest = open_manifest(self.cache, slice_id, digest, data, fetch, pull=pull)
        self._manifests[digest] = manifest
        self._manifests[slice_id] = manifest
        return Slice(slice_id, digest, manifest, self)

    # -- curation --------------------------------------------------------------------------
    def label_remote(self) -> LabelRemote:
        """The label endpoints of this client's server, and its cache (``Slice.labels``)."""
        transport = None if self.offline else self._transport()
        return LabelRemote(transport, self.cache, None if self.offline else self._key())

    def _create_slice(self, view: Slice, description: str, slice_id: str | None) -> Slice:
        expr = selection_expression(view.selection)
        if expr is None and not _has_code(view.selection):
            raise InvalidArgumentError(
                "this view keeps every episode of its slice: select some, e.g. "
                'slice_.select(where="success"), before publishing'
            )
        if expr is None:
            raise InvalidArgumentError(
                "this view was made with a Python where= function, which the server cannot "
                'rebuild: filter with text instead, e.g. select(where="success and quality >= 0.7")'
            )
        root = view.parent if view.parent is not None else view
        body: dict[str, Any] = {
            "parent": root.id,
            "manifest": root.manifest_hash,
            "select": expr,
            "segments": len(view),
            "description": description,
        }
        if slice_id is not None:
            body["id"] = slice_id
        return self._get_slice(self.label_remote().create(body))

    # -- blobs -----------------------------------------------------------------------------
    def _offline_missing(
        self, slice_id: str, refs: Sequence[BlobRef], manifest_hash: str | None = None
    ) -> OfflineError:
        return missing_blobs(
            slice_id,
            refs,
            self.cache_dir,
            opened=self._manifests,
            current=remembered(self.cache, self._key(), slice_id),
            bound=self._bound.get(slice_id, ()),
            manifest_hash=manifest_hash,
        )

    def _post_once(self, path: str, doc: dict[str, Any]) -> Any:
        return self._transport().post_json_once(path, doc, "asking for blob URLs")

    def expect_blobs(self, slice_id: str, refs: Sequence[BlobRef]) -> None:
        """Say that this process will download these blobs of ``slice_id`` soon: the server
        is then asked for their download URLs together (one request instead of one per
        blob, with an object-store backend). A hint only: nothing is fetched here."""
        if not self.offline and self.endpoint is not None:
            self._blob_urls.expect(slice_id, (r.hash for r in refs))

    def would_fetch(self, ref: BlobRef) -> bool:
        """True if :meth:`ensure_blob` would download ``ref`` now (online and not cached)."""
        return not self.offline and not self.cache.has_blob(ref.hash)

    def ensure_blob(self, slice_id: str, ref: BlobRef) -> Path:
        """Path of the verified, read-only cached copy of ``ref``, downloading it if missing.

        Raises:
            OfflineError: offline and not cached (names the ``rayform pull`` command).
            IntegrityError: the server's bytes do not match the hash.
            CacheError: the cache cannot be written.
        """
        path: Path | None = None
        for _ in range(3):  # a bounded cache may evict it between the fetch and the pin
            path = self.cache.get_blob(ref.hash)
            if path is None:
                if self.offline:
                    raise self._offline_missing(slice_id, [ref])
                t0 = time.monotonic()
                path, fetched = self._fetch(slice_id, ref)
                if not fetched:  # another thread or process had it on the way
                    fetch_log().waited(time.monotonic() - t0)
            else:
                fetch_log().hit()
            if self.cache_limit is None or self._pins.pin(path):
                return path
        assert path is not None
        return path  # evicted again and again: the caller opens it now or fetches once more

    def _fetch(
        self,
        slice_id: str,
        ref: BlobRef,
        on_bytes: ProgressCallback | None = None,
        *,
        limit: int | None = None,
        keep: frozenset[str] = frozenset(),
    ) -> tuple[Path, int]:
        url = f"v1/slices/{slice_id}/blobs/{ref.hash}"

        what = f"downloading blob {ref.hash[:12]}... of {slice_id}"
        waiting_since = time.time()  # before any wait on another process's download of it

        def download(part: DownloadSink) -> None:
            start = self._blob_urls.url(slice_id, ref.hash)
            self._transport().download(
                url, part, what, on_bytes, waiting_since=waiting_since, start_url=start
            )

        def waiting() -> None:
            # Behind another's download of it: ends when the store is found stalled meanwhile.
            self._transport().check_store(what, waiting_since)

        if not self.cache.has_blob(ref.hash):
            self._transport().check_store(what)  # not behind others' waits if the store stalled

        t0 = time.monotonic()
        path, fetched = self.cache.fetch_blob(ref, download, waiting)
        if fetched:
            fetch_log().fetched(fetched, time.monotonic() - t0)
        limit = limit if limit is not None else self.cache_limit
        if limit is not None and fetched:
            if self.cache_limit is not None:
                self._pins.pin(path)
            report = self._evictor.after_fetch(ref.size, limit, keep | {ref.hash}, path)
            if report is not None and report.evicted:
                fetch_log().evicted(report.evicted, report.evicted_bytes)
        return path, fetched

    def pull(
        self,
        slice_id: str | BlobSource,
        streams: Sequence[str] | None = None,
        jobs: int = 8,
        progress: bool = False,
        max_cache: int | str | None = None,
        image_size: tuple[int, int] | dict[str, tuple[int, int]] | None = None,
        resize: str = "pad",
    ) -> PullReport:
        """Fetch every blob of ``slice_id`` (or of the named streams) into the cache.

        Args:
            slice_id: e.g. ``"slc_7c1e04aa"``, or a :class:`~rayform.Slice` (a
                :meth:`~rayform.Slice.select` view pulls only its own segments' blobs).
            streams: stream names such as ``["cam0/rgb"]``; all streams if None.
            jobs: parallel downloads.
            progress: show a progress bar (bytes, rate, ETA) on stderr.
            max_cache: keep the cache's blobs under this many bytes (``"10GB"`` works),
                evicting least recently used blobs of other work; default ``cache_limit``.
            image_size: pull for training at this resolution, as
                ``EpisodeDataset(image_size=..., resize=...)`` reads it: for each camera only
                the stored rendition the dataset would choose (the original where none covers
                the size), never the other videos. ``None``: every original.
            resize: ``"pad"``, ``"squash"`` or ``"crop"``, with ``image_size``.

        Raises:
            InvalidArgumentError: what was asked for does not fit under ``max_cache``.
            NotFoundError: a named stream is in no segment of the slice.
            OfflineError: offline mode and something is missing.
        """
        if not isinstance(jobs, int) or jobs < 1:
            raise InvalidArgumentError(f"jobs must be a positive integer, got {jobs!r}")
        # Names are checked before the slice is resolved: a typo costs no request and writes
        # nothing into the cache.
        names = None if streams is None else check_stream_names(streams)
        if isinstance(slice_id, Slice):
            slice_ = slice_id
        else:  # an ID (or another BlobSource: its slice, whole)
            slice_ = self.slices.get(slice_id if isinstance(slice_id, str) else slice_id.id)
        slice_id = slice_.id
        if names is not None:
            unknown = sorted(set(names) - set(slice_.streams))
            if unknown:
                raise NotFoundError(
                    f"slice {slice_id} has no stream {', '.join(unknown)}; it has "
                    f"{', '.join(slice_.streams)}"
                )
        # With image_size, each camera's chosen rendition instead of its original.
        refs = list(slice_.blobs(names, image_size=image_size, resize=resize).values())
        limit = resolve_cache_limit(max_cache) if max_cache is not None else self.cache_limit
        check_fits(limit, sum(r.size for r in refs), f"the blobs of {slice_id} to pull")
        keep = frozenset(r.hash for r in refs)

        def fetch(
            sid: str, ref: BlobRef, on_bytes: ProgressCallback | None = None
        ) -> tuple[Path, int]:
            return self._fetch(sid, ref, on_bytes, limit=limit, keep=keep)

        if self.offline:
            missing = [r for r in refs if not self.cache.has_blob(r.hash)]
            if missing:
                raise self._offline_missing(slice_id, missing, slice_.manifest_hash)
        if not self.offline:
            self.expect_blobs(slice_id, [r for r in refs if not self.cache.has_blob(r.hash)])
        report = run_pull(slice_id, refs, self.cache, fetch, jobs=jobs, progress=progress)
        if not self.offline:
            self._pull_labels(slice_.parent if slice_.parent is not None else slice_)
        return report

    def _pull_labels(self, slice_: Slice) -> None:
        """Cache the slice's latest labels, so ``slice_.labels`` (and a filter on them) works
        offline; a server from before labels answers 404, and there is nothing to keep."""
        try:
            self.label_remote().read(slice_.id, slice_.manifest_hash, slice_.segments)
        except NotFoundError:
            pass
        except TransportError as exc:
            # The blobs are in and verified: a pull does not fail for the labels alone. Offline,
            # slice_.labels then names this pull again.
            log.warning("rayform pull %s: the labels were not cached: %s", slice_.id, exc)
