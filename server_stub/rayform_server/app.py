"""The server stub's HTTP API (``docs/protocol.md``) as a Starlette application.

Request handling, in order, before any file is opened:

1. :class:`_Guard` (raw ASGI, outermost): request target over 2 KiB -> 414; a method other
   than GET/HEAD (POST to the paths of :mod:`rayform_server._writes` excepted) -> 405;
   a request body (a write's over its bound -> 413, without a length -> 411) -> 413;
   ``.``/``..`` segments, encoded slashes, backslashes or NUL in the raw path -> 400.
2. The bearer token -> 401 when missing or wrong (``/v1/health`` needs none).
3. Path parameters against the ``rayform.format`` regexes -> 400.
4. The token's scope -> 404, exactly as for an unknown slice.
5. For blobs (and v2 manifest pages): the hash must be referenced by a manifest the slice names
   or once named -> else 404. For a manifest by hash: the slice must name or once have named it.
   ``POST /v1/slices/{id}/blob-urls`` checks every hash it names the same way.

Blobs are served by Starlette's ``FileResponse`` in 256 KiB chunks, whole or in byte ranges, behind
the checks of :mod:`rayform_server._blobfile` (``Range``, ``If-Range``). With blobs in object
storage (:class:`~rayform_server.blobstore.S3BlobBackend`) a blob request that passed every
check answers ``307`` to a presigned GET URL of short expiry instead; the URL (and its
signature) is never logged. ``POST /v1/slices/{id}/blob-urls`` answers the presigned URLs of
many blobs at once, so a client that knows what it will fetch next makes one request per blob
(to the store) instead of two.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Callable
from importlib import metadata
from typing import Any
from urllib.parse import unquote_to_bytes

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from rayform.errors import InvalidArgumentError
from rayform.format import HASH_RE, SLICE_ID_RE
from rayform_server._apierror import ApiError
from rayform_server._blobfile import BlobFile, check_ranges
from rayform_server._writes import MAX_BODY_BYTES, WRITE_PATHS, Writes, json_body
from rayform_server.auth import Auth, Grant
from rayform_server.blobstore import DEFAULT_PRESIGN_EXPIRY_S, BlobBackend
from rayform_server.store import Store

__all__ = [
    "DEFAULT_PRESIGN_EXPIRY_S",
    "MAX_BLOB_URLS",
    "MAX_TARGET_BYTES",
    "ApiError",
    "create_app",
]

#: Longest request target (path + query) accepted, in bytes.
MAX_TARGET_BYTES = 2048
_REFS_CACHE_SIZE = 64
#: Most blob hashes one ``POST /v1/slices/{id}/blob-urls`` may name.
MAX_BLOB_URLS = 1024
#: The error code of a ``503`` that means the object store behind the server did not answer
#: (clients say so, instead of blaming the server's address).
STORE_UNAVAILABLE = "store_unavailable"


def _version() -> str:
    try:
        return metadata.version("rayform")
    except metadata.PackageNotFoundError:
        return "0+unknown"


class _Guard:
    """Raw ASGI checks that need no routing: target length, method, body, traversal."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        error = self._check(scope)
        if error is not None:
            await error.response()(scope, receive, send)
            return
        await self.app(scope, receive, send)

    @staticmethod
    def _check(scope: Scope) -> ApiError | None:
        raw = scope.get("raw_path") or scope["path"].encode()
        if len(raw) + len(scope.get("query_string", b"")) + 1 > MAX_TARGET_BYTES:
            return ApiError(
                414, "uri_too_long", f"the request target is over {MAX_TARGET_BYTES} bytes"
            )
        headers = dict(scope["headers"])
        length = headers.get(b"content-length", b"0").strip()
        if scope["method"] == "POST" and WRITE_PATHS.fullmatch(raw):
            # A write: its body must say how long it is, and be short (docs/curation.md).
            if b"transfer-encoding" in headers or not length.isdigit():
                return ApiError(
                    411, "length_required", "a write must send Content-Length (no chunked body)"
                )
            if int(length) > MAX_BODY_BYTES:
                return ApiError(
                    413,
                    "payload_too_large",
                    f"a write may send at most {MAX_BODY_BYTES} bytes; this one declares "
                    f"{int(length)}: split it into several writes",
                )
        elif scope["method"] not in ("GET", "HEAD"):
            return ApiError(
                405,
                "method_not_allowed",
                f"{scope['method']} is not allowed here: reads are GET and HEAD; writes POST "
                "to /v1/slices and /v1/slices/{id}/labels/{manifest} only (and "
                "/v1/slices/{id}/blob-urls asks for download URLs)",
                {"Allow": "GET, HEAD"},
            )
        elif b"transfer-encoding" in headers or length not in (b"", b"0"):
            return ApiError(
                413, "payload_too_large", "requests to this API carry no body: send it without one"
            )
        segments = raw.split(b"/")
        decoded = [unquote_to_bytes(s) for s in segments]
        if any(s in (b".", b"..") or b"/" in s or b"\\" in s or b"\x00" in s for s in decoded):
            return ApiError(
                400,
                "invalid_argument",
                "the path contains '.', '..', an encoded slash, "
                "a backslash or NUL: use the plain /v1/... paths of docs/protocol.md",
            )
        return None


class _Api:
    """The endpoint handlers, bound to a store and an access policy."""

    def __init__(
        self, store: Store, auth: Auth, presign_expiry_s: int = DEFAULT_PRESIGN_EXPIRY_S
    ) -> None:
        self.store = store
        self.auth = auth
        self.presign_expiry_s = presign_expiry_s
        self._refs: OrderedDict[str, frozenset[str]] = OrderedDict()
        self._pages: OrderedDict[str, frozenset[str]] = OrderedDict()

    # -- helpers ---------------------------------------------------------------------------
    def _grant(self, request: Request) -> Grant:
        grant = self.auth.authenticate(request.headers.get("authorization"))
        if grant is None:
            raise ApiError(
                401,
                "unauthorized",
                "missing or wrong bearer token: send "
                "'Authorization: Bearer <token>' (set RAYFORM_TOKEN for the SDK)",
                {"WWW-Authenticate": 'Bearer realm="rayform"'},
            )
        return grant

    def _slice(self, request: Request) -> tuple[str, dict[str, str]]:
        grant = self._grant(request)
        slice_id = request.path_params["slice_id"]
        if not SLICE_ID_RE.fullmatch(slice_id):
            raise ApiError(
                400,
                "invalid_argument",
                f"malformed slice ID {slice_id[:80]!r}: expected "
                "'slc_' followed by 8 to 64 lowercase hex digits, e.g. 'slc_7c1e04aa'",
            )
        ref = self.store.get_slice(slice_id) if grant.allows(slice_id) else None
        if ref is None:
            raise ApiError(
                404,
                "not_found",
                f"no slice {slice_id} (or this token may not read it): "
                "check the ID with `rayform-server slices` or ask for access",
            )
        return slice_id, ref

    def _referenced(self, manifest_hash: str) -> frozenset[str]:
        return _memo(
            self._refs, manifest_hash, lambda: _referenced(self.store.load_manifest(manifest_hash))
        )

    def _in_some_version(
        self, slice_id: str, ref: dict[str, str], digest: str, held: Callable[[str], frozenset[str]]
    ) -> bool:
        """Whether ``digest`` is in ``held(manifest)`` of the slice's current manifest or, failing
        that, of any manifest it once named (a run logged before the slice changed reads those)."""
        if digest in held(ref["manifest"]):
            return True
        return any(
            digest in held(m) for m in self.store.manifest_history(slice_id) if m != ref["manifest"]
        )

    def _check_blob_of(self, slice_id: str, ref: dict[str, str], digest: str) -> None:
        """A ``404`` unless a manifest the slice names or once named references ``digest``."""
        if not self._in_some_version(slice_id, ref, digest, self._referenced):
            raise ApiError(
                404,
                "not_found",
                f"blob {digest[:12]}... is not part of slice {slice_id}: "
                "take blob hashes from this slice's manifest",
            )

    def _pages_of(self, manifest_hash: str) -> frozenset[str]:
        return _memo(self._pages, manifest_hash, lambda: self.store.page_hashes(manifest_hash))

    # -- endpoints -------------------------------------------------------------------------
    async def health(self, request: Request) -> Response:
        return JSONResponse({"status": "ok", "version": _version()})

    async def list_slices(self, request: Request) -> Response:
        grant = self._grant(request)
        out: list[dict[str, Any]] = []
        for slice_id in self.store.list_slices():
            if grant.allows(slice_id):
                ref = self.store.get_slice(slice_id)
                if ref is not None:
                    out.append(
                        {
                            "id": slice_id,
                            "manifest": ref["manifest"],
                            "description": ref.get("description", ""),
                        }
                    )
        return JSONResponse({"slices": out})

    async def get_slice(self, request: Request) -> Response:
        slice_id, ref = self._slice(request)
        size = self.store.manifest_path(ref["manifest"]).stat().st_size
        return JSONResponse(
            {
                "id": slice_id,
                "manifest": ref["manifest"],
                "manifest_size": size,
                "description": ref.get("description", ""),
            }
        )

    async def get_manifest(self, request: Request) -> Response:
        _, ref = self._slice(request)
        digest = ref["manifest"]
        headers = {"ETag": f'"{digest}"', "Cache-Control": "no-cache"}
        if _etag_matches(request.headers.get("if-none-match"), digest):
            return Response(status_code=304, headers=headers)
        data = self.store.read_manifest_bytes(digest)
        return Response(data, media_type="application/json", headers=headers)

    async def get_manifest_at(self, request: Request) -> Response:
        """A manifest by hash: the slice's current one or one it named before."""
        slice_id, _ = self._slice(request)
        digest = _hash_param(request, "a manifest hash, e.g. from a dataset URI")
        if not await run_in_threadpool(self.store.has_named, slice_id, digest):
            new = await run_in_threadpool(self.store.migrated_to, digest)
            if new is not None and await run_in_threadpool(self.store.has_named, slice_id, new):
                # Rewritten by `rayform-server migrate`: the old bytes are in a format no
                # SDK of this version reads, and new bytes cannot carry the old name.
                raise ApiError(
                    404,
                    "not_found",
                    f"manifest {digest} of slice {slice_id} was rewritten into the current "
                    f"format as manifest {new} (`rayform-server migrate`): ask for {new} "
                    "(the same segments and blobs; pin dataset URIs to it)",
                )
            raise ApiError(
                404,
                "not_found",
                f"slice {slice_id} never named manifest {digest[:12]}... "
                "on this server (or it was withdrawn): check the hash, or use the slice's "
                "current manifest",
            )
        headers = {"ETag": f'"{digest}"', "Cache-Control": "public, max-age=31536000, immutable"}
        if _etag_matches(request.headers.get("if-none-match"), digest):
            return Response(status_code=304, headers=headers)
        data = await run_in_threadpool(self.store.read_manifest_bytes, digest)
        return Response(data, media_type="application/json", headers=headers)

    async def get_page(self, request: Request) -> Response:
        """A page of a v2 manifest: only the pages a manifest root of the slice lists."""
        slice_id, ref = self._slice(request)
        digest = _hash_param(request, "a page hash from the manifest root")
        if not self._in_some_version(slice_id, ref, digest, self._pages_of):
            raise ApiError(
                404,
                "not_found",
                f"page {digest[:12]}... is not part of the manifest of "
                f"slice {slice_id}: take page hashes from the manifest root",
            )
        headers = {"ETag": f'"{digest}"', "Cache-Control": "public, max-age=31536000, immutable"}
        if _etag_matches(request.headers.get("if-none-match"), digest):
            return Response(status_code=304, headers=headers)
        data = await run_in_threadpool(self.store.read_manifest_bytes, digest)
        return Response(data, media_type="application/vnd.apache.arrow.file", headers=headers)

    async def get_blob(self, request: Request) -> Response:
        slice_id, ref = self._slice(request)
        digest = _hash_param(request, "a BLAKE3 digest from the manifest")
        self._check_blob_of(slice_id, ref, digest)
        if self.store.blobs.local_path(digest) is None:
            return await self._redirect(slice_id, digest)
        path = self.store.blob_path(digest)
        try:
            stat_result = path.stat()
        except FileNotFoundError:
            raise ApiError(
                404,
                "not_found",
                f"blob {digest[:12]}... of slice {slice_id} is missing "
                "from the server's data root: tell the server operator",
            ) from None
        etag = f'"{digest}"'
        headers = {
            "ETag": etag,
            "Accept-Ranges": "bytes",
            "Cache-Control": "public, max-age=31536000, immutable",
        }
        if _etag_matches(request.headers.get("if-none-match"), digest):
            return Response(status_code=304, headers=headers)
        ranges = request.headers.get("range")
        if ranges is not None and request.headers.get("if-range", etag) == etag:
            ranges = check_ranges(ranges, stat_result.st_size)
        else:
            ranges = None  # RFC 9110: no Range, or the client's copy is another blob: all of it
        return BlobFile(path, stat_result, headers, ranges)

    async def blob_urls(self, request: Request) -> Response:
        """``POST /v1/slices/{id}/blob-urls``: presigned GET URLs of many blobs of the slice.

        The body is ``{"hashes": [hash, ...]}`` (1 to :data:`MAX_BLOB_URLS` of them, each
        referenced by the slice as for a blob request); the answer ``{"urls": {hash: url},
        "expires_in": seconds}``. A local blob store sends bytes itself: ``{"urls": {},
        "expires_in": 0}``. A URL does not promise that the object exists (no request per
        blob is made to the store): the client asks the blob path when the store answers 404.
        """
        slice_id, ref = self._slice(request)
        body = await json_body(request)
        hashes = body.get("hashes") if isinstance(body, dict) else None
        if (
            not isinstance(hashes, list)
            or not 1 <= len(hashes) <= MAX_BLOB_URLS
            or not all(isinstance(h, str) and HASH_RE.fullmatch(h) for h in hashes)
        ):
            raise ApiError(
                400,
                "invalid_argument",
                'the body must be {"hashes": [...]} with 1 to '
                f"{MAX_BLOB_URLS} blob hashes of 64 lowercase hex digits",
            )
        for digest in hashes:
            self._check_blob_of(slice_id, ref, digest)
        blobs = self.store.blobs
        expiry = self.presign_expiry_s

        def presign() -> dict[str, str]:  # credential refresh may reach the network
            urls = {d: blobs.presigned_url(d, expiry) for d in dict.fromkeys(hashes)}
            return {d: u for d, u in urls.items() if u is not None}

        try:
            urls = await run_in_threadpool(presign)
        except Exception as exc:  # the store refuses to sign: a server fault, retryable
            raise ApiError(
                503,
                STORE_UNAVAILABLE,
                f"the server could not sign download URLs ({type(exc).__name__}); "
                "retry with backoff",
                {"Retry-After": "1"},
            ) from None
        return JSONResponse(
            {"urls": urls, "expires_in": expiry if urls else 0},
            headers={"Cache-Control": "no-store"},
        )

    async def _redirect(self, slice_id: str, digest: str) -> Response:
        """``307`` to a presigned URL for a blob kept in object storage."""
        blobs = self.store.blobs

        def lookup() -> tuple[bool, str | None]:  # network (and credential refresh): off the loop
            if not blobs.exists(digest):
                return False, None
            return True, blobs.presigned_url(digest, self.presign_expiry_s)

        try:
            present, url = await run_in_threadpool(lookup)
        except Exception as exc:  # the store is down or refuses us: a server fault, retryable
            host = blobs.host() if hasattr(blobs, "host") else "?"
            within = getattr(blobs, "lookup_timeout_s", None)
            when = f" within {within:g} s" if within else ""
            raise ApiError(
                503,
                STORE_UNAVAILABLE,
                f"the object store at {host} did not "
                f"answer{when} ({type(exc).__name__}); retry with backoff",
                {"Retry-After": "1"},
            ) from None
        if not present:
            raise ApiError(
                404,
                "not_found",
                f"blob {digest[:12]}... of slice {slice_id} is missing "
                "from the server's object store: tell the server operator",
            )
        if url is None:
            raise ApiError(500, "internal", "the blob store gives no download URL")
        return Response(
            status_code=307,
            headers={"Location": url, "Cache-Control": "no-store", "ETag": f'"{digest}"'},
        )


def _referenced(manifest: Any) -> frozenset[str]:
    """Every blob hash a manifest names: its streams' blobs and their renditions."""
    return frozenset({*manifest.blobs(), *manifest.rendition_blobs()})


def _etag_matches(header: str | None, digest: str) -> bool:
    if header is None:
        return False
    tags = [t.strip() for t in header.split(",")]
    return "*" in tags or f'"{digest}"' in tags


async def _api_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ApiError)
    return exc.response()


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    if exc.status_code == 404:
        return ApiError(
            404,
            "not_found",
            f"no such endpoint {request.url.path[:200]}: see docs/protocol.md for the /v1 paths",
        ).response()
    if exc.status_code == 405:
        return ApiError(
            405, "method_not_allowed", "only GET and HEAD are allowed", {"Allow": "GET, HEAD"}
        ).response()
    return ApiError(exc.status_code, "invalid_argument", str(exc.detail)).response()


async def _internal(request: Request, exc: Exception) -> Response:
    return ApiError(
        500,
        "internal",
        "the server failed to answer; retry with backoff, and tell "
        "the server operator if it persists",
    ).response()


def create_app(
    root: str | os.PathLike[str],
    *,
    token: str | None = None,
    tokens_file: str | os.PathLike[str] | None = None,
    allow_anonymous: bool = False,
    blobs: BlobBackend | None = None,
    presign_expiry_s: int = DEFAULT_PRESIGN_EXPIRY_S,
    write_token: str | None = None,
) -> Starlette:
    """The ASGI application serving the data root ``root``.

    Args:
        root: data root (see ``docs/layout.md``).
        token: one bearer token with access to every slice.
        tokens_file: JSON file of scoped tokens (see :mod:`rayform_server.auth`).
        allow_anonymous: serve everything without a token (only if neither is given).
        blobs: where the blobs are; default what the root records (``blobstore.json``), else
            ``root/blobs``. With object storage, blob requests answer ``307`` to a presigned URL.
        presign_expiry_s: lifetime of those presigned URLs in seconds (at least 1).
        write_token: a bearer token that reads and writes every slice (labels, new slices),
            beside ``token``; a tokens file gives its entries a ``write`` list instead.

    Raises:
        InvalidArgumentError: the access options are inconsistent or the tokens file is bad.
    """
    auth = Auth.from_options(token, tokens_file, allow_anonymous, write_token)
    if presign_expiry_s < 1:
        raise InvalidArgumentError(
            f"presign_expiry_s must be at least 1 second, got {presign_expiry_s}"
        )
    api = _Api(Store(root, blobs=blobs), auth, presign_expiry_s)
    writes = Writes(api.store, api._grant, api._slice)
    routes = [
        Route("/v1/health", api.health, methods=["GET", "HEAD"]),
        Route("/v1/slices", api.list_slices, methods=["GET", "HEAD"]),
        Route("/v1/slices", writes.create_slice, methods=["POST"]),
        Route("/v1/slices/{slice_id}/labels/{hash}", writes.labels_head, methods=["GET", "HEAD"]),
        Route("/v1/slices/{slice_id}/labels/{hash}", writes.write_labels, methods=["POST"]),
        Route("/v1/slices/{slice_id}/labelsets/{hash}", writes.label_set, methods=["GET", "HEAD"]),
        Route("/v1/slices/{slice_id}", api.get_slice, methods=["GET", "HEAD"]),
        Route("/v1/slices/{slice_id}/manifest", api.get_manifest, methods=["GET", "HEAD"]),
        Route("/v1/slices/{slice_id}/blobs/{hash}", api.get_blob, methods=["GET", "HEAD"]),
        Route("/v1/slices/{slice_id}/blob-urls", api.blob_urls, methods=["POST"]),
        Route("/v1/slices/{slice_id}/pages/{hash}", api.get_page, methods=["GET", "HEAD"]),
        Route(
            "/v1/slices/{slice_id}/manifests/{hash}", api.get_manifest_at, methods=["GET", "HEAD"]
        ),
    ]
    app = Starlette(
        routes=routes,
        middleware=[Middleware(_Guard)],
        exception_handlers={ApiError: _api_error, HTTPException: _http_error, Exception: _internal},
    )
    app.router.redirect_slashes = False  # "/v1/slices/" is an unknown path, not a redirect
    return app


def _hash_param(request: Request, what: str) -> str:
    """The ``{hash}`` of the URL, or a 400 naming what a valid one is (``what``)."""
    digest = str(request.path_params["hash"])
    if not HASH_RE.fullmatch(digest):
        raise ApiError(
            400,
            "invalid_argument",
            f"malformed content hash {digest[:80]!r}: expected 64 lowercase hex digits ({what})",
        )
    return digest


def _memo(
    cache: OrderedDict[str, frozenset[str]], key: str, compute: Callable[[], frozenset[str]]
) -> frozenset[str]:
    """``cache[key]``, computed on a miss; least recently used entries beyond
    ``_REFS_CACHE_SIZE`` are dropped (a server may serve many manifests over its life)."""
    value = cache.get(key)
    if value is None:
        value = cache[key] = compute()
        while len(cache) > _REFS_CACHE_SIZE:
            cache.popitem(last=False)
    else:
        cache.move_to_end(key)
    return value
