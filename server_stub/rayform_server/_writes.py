"""The label and publish endpoints (``docs/protocol.md``, "Labels and publishing").

Reads (``GET``) check the token's read scope as every slice path does. Writes (``POST``) are
checked in this order, before anything is stored: the guard of ``app.py`` (a write path, a
``Content-Length`` of at most :data:`MAX_BODY_BYTES`, no chunked body), the token (401), the
read scope (404, as for an unknown slice), the write scope (403), the body (JSON of the
documented shape and limits, 400), the episodes and values (400), the merge (409). The work
runs in a thread: it takes a file lock and writes files.
"""

from __future__ import annotations

import json
import re
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from rayform.curation import LIMITS
from rayform.errors import AccessDeniedError, ConflictError, NotFoundError, RayformError
from rayform.format import HASH_RE
from rayform.manifest import Segments, segments_of
from rayform_server._apierror import ApiError
from rayform_server.auth import Grant
from rayform_server.labelstore import LabelStore
from rayform_server.publish import publish
from rayform_server.store import Store

__all__ = ["MAX_BODY_BYTES", "WRITE_PATHS", "Writes", "json_body"]

#: Largest request body accepted, in bytes (a label write or a publish request).
MAX_BODY_BYTES = LIMITS["write_bytes"]
#: Raw paths that accept ``POST`` (checked by the guard before routing): the writes, and the
#: one read that takes a body (download URLs of many blobs at once).
WRITE_PATHS = re.compile(rb"/v1/slices|/v1/slices/[^/]+/(labels/[^/]+|blob-urls)")
_SEGMENTS_CACHE = 4


def _refusal(exc: RayformError) -> ApiError:
    """The answer to an error of a write: 409, 404, 403 or 400, with the error's message."""
    if isinstance(exc, ConflictError):
        return ApiError(409, "conflict", str(exc))
    if isinstance(exc, NotFoundError):
        return ApiError(404, "not_found", str(exc))
    if isinstance(exc, AccessDeniedError):
        return ApiError(403, "forbidden", str(exc))
    return ApiError(400, "invalid_argument", str(exc))


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


async def json_body(request: Request) -> Any:
    """The request's body parsed as plain JSON (no ``NaN``), or a ``400``/``413``."""
    data = await request.body()
    if len(data) > MAX_BODY_BYTES:
        raise ApiError(413, "payload_too_large", f"a request body may hold {MAX_BODY_BYTES} bytes")
    try:
        return json.loads(data, parse_constant=_reject_constant)
    except (ValueError, RecursionError) as exc:
        raise ApiError(400, "invalid_argument", f"the body is not JSON: {str(exc)[:200]}") from None


class Writes:
    """The curation endpoints, bound to a store.

    Args:
        store: the data root.
        grant: the request's authenticated caller (or a 401).
        slice_of: the request's ``{slice_id}`` checked and in the caller's read scope (or a
            400/404), with its reference.
    """

    def __init__(
        self,
        store: Store,
        grant: Callable[[Request], Grant],
        slice_of: Callable[[Request], tuple[str, dict[str, str]]],
    ) -> None:
        self.store = store
        self.labels = LabelStore(store)
        self._grant = grant
        self._slice = slice_of
        self._segments: OrderedDict[str, Segments] = OrderedDict()

    def _manifest(self, request: Request, slice_id: str) -> str:
        digest = str(request.path_params["hash"])
        if not HASH_RE.fullmatch(digest):
            raise ApiError(
                400,
                "invalid_argument",
                f"malformed manifest hash {digest[:80]!r}: expected 64 lowercase hex digits",
            )
        if not self.store.has_named(slice_id, digest):
            raise ApiError(
                404,
                "not_found",
                f"slice {slice_id} never named manifest {digest[:12]}...: label the slice's "
                "manifest (slice_.manifest_hash)",
            )
        return digest

    def _segments_of(self, digest: str) -> Segments:
        segs = self._segments.get(digest)
        if segs is None:
            segs = self._segments[digest] = segments_of(self.store.load_manifest(digest))
            while len(self._segments) > _SEGMENTS_CACHE:
                self._segments.popitem(last=False)
        return segs

    @staticmethod
    async def _body(request: Request) -> Any:
        return await json_body(request)

    async def _run(self, fn: Callable[[], dict[str, Any]]) -> Response:
        try:
            return JSONResponse(await run_in_threadpool(fn))
        except RayformError as exc:
            raise _refusal(exc) from None

    # -- endpoints -------------------------------------------------------------------------
    async def labels_head(self, request: Request) -> Response:
        """``GET /v1/slices/{id}/labels/{manifest}``: the latest label set on that manifest."""
        slice_id, _ = self._slice(request)
        digest = self._manifest(request, slice_id)
        head = await run_in_threadpool(self.labels.head, slice_id, digest)
        return JSONResponse(head, headers={"Cache-Control": "no-cache"})

    async def label_set(self, request: Request) -> Response:
        """``GET /v1/slices/{id}/labelsets/{hash}``: a label set's bytes (immutable)."""
        slice_id, _ = self._slice(request)
        digest = str(request.path_params["hash"])
        if not HASH_RE.fullmatch(digest):
            raise ApiError(
                400, "invalid_argument", f"malformed label-set hash {digest[:80]!r}: 64 hex digits"
            )
        try:
            data = await run_in_threadpool(self.labels.read, slice_id, digest)
        except NotFoundError as exc:
            raise _refusal(exc) from None
        headers = {"ETag": f'"{digest}"', "Cache-Control": "public, max-age=31536000, immutable"}
        return Response(data, media_type="application/json", headers=headers)

    async def write_labels(self, request: Request) -> Response:
        """``POST /v1/slices/{id}/labels/{manifest}``: one label write, merged."""
        grant = self._grant(request)
        slice_id, _ = self._slice(request)
        if not grant.may_write(slice_id):
            raise ApiError(
                403,
                "forbidden",
                f"this token may read slice {slice_id} but not write it: label with a write "
                "token (docs/curation.md)",
            )
        digest = self._manifest(request, slice_id)
        body = await self._body(request)
        if not isinstance(body, dict):
            raise ApiError(
                400, "invalid_argument", 'a label write is a JSON object {"base", "set"}'
            )

        def write() -> dict[str, Any]:
            return self.labels.write(slice_id, digest, self._segments_of(digest), body, grant.name)

        return await self._run(write)

    async def create_slice(self, request: Request) -> Response:
        """``POST /v1/slices``: publish a selection as a new slice."""
        grant = self._grant(request)
        body = await self._body(request)
        if not isinstance(body, dict):
            raise ApiError(
                400, "invalid_argument", 'publishing takes a JSON object {"parent", ...}'
            )
        return await self._run(lambda: publish(self.store, self.labels, grant, body))
