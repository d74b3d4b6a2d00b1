"""Download URLs of many blobs in one request, for the blobs this process will fetch next.

With blobs in an object store, each blob request to the server answers ``307`` to a presigned
URL: two requests and two round trips per blob. What read-ahead and ``rayform pull`` are about
to fetch is known in advance, so they announce it (:meth:`BlobUrls.expect`), and the first
download that needs a URL asks ``POST /v1/slices/{id}/blob-urls`` for its own and those of the
other blobs announced (up to :data:`BATCH` at once), as Git LFS's batch API does: the
downloads then go to the store directly, one request each.

Only a saving, never a dependency: a server without the path (older; ``404``/``405``), with a
local blob store (``"expires_in": 0``), an answer that fails any check, a failed request (three
in a row: stop asking), or a blob nobody announced: the download takes the blob path as before. A URL is used until a
margin before its expiry; a store that refuses it (expired, or no such object) sends that
download back to the blob path (:meth:`~rayform._net.Transport.download`). The state is
per process: a forked DataLoader worker starts with none.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import Any

from rayform._net._retry import RetryableError
from rayform._process import PerProcess
from rayform.errors import RayformError
from rayform.format import HASH_RE

__all__ = ["BATCH", "BlobUrls"]

log = logging.getLogger("rayform.fetch")

#: Most blobs asked for in one request (the server takes up to 1,024).
BATCH = 256
#: Announced blobs remembered per slice at most; later ones are not (each batch asked for
#: makes room again). About 6 MB at most: a pull of a large slice announces all its blobs.
_PENDING_CAP = 65536
#: Longest URL accepted from the server, in characters.
_URL_CAP = 8192
#: Longest lifetime accepted, in seconds (7 days: SigV4's own maximum).
_EXPIRY_CAP = 7 * 86400
#: Failed requests in a row after which this process stops asking.
_MAX_FAILURES = 3
#: How long a download waits for another thread's request that covers its blob, in seconds.
_WAIT_S = 10.0

#: ``post(path, doc)``: the server's parsed JSON answer (one attempt).
Post = Callable[[str, dict[str, Any]], Any]


class _State:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.urls: dict[str, tuple[str, float]] = {}  # hash -> (URL, monotonic use-by)
        self.pending: dict[str, OrderedDict[str, None]] = {}  # slice -> announced hashes
        self.asking: dict[str, threading.Event] = {}  # hash -> set when its request ends
        self.off = False  # the server has no batch URLs: stop asking
        self.failures = 0  # requests in a row that failed


class BlobUrls:
    """Presigned URLs of the blobs of one server's slices, asked for a batch at a time.

    Args:
        post: sends ``POST path`` with a JSON document in one attempt and returns the parsed
            answer (:meth:`~rayform._net.Transport.post_json_once`).
    """

    def __init__(self, post: Post) -> None:
        self._post = post
        self._state: PerProcess[_State] = PerProcess(_State)

    def expect(self, slice_id: str, hashes: Iterable[str]) -> None:
        """Announce blobs of ``slice_id`` that this process will download soon."""
        st = self._state.get()
        with st.lock:
            if st.off:
                return
            pending = st.pending.setdefault(slice_id, OrderedDict())
            for h in hashes:
                if len(pending) >= _PENDING_CAP:
                    break
                if h not in st.urls:
                    pending[h] = None

    def url(self, slice_id: str, digest: str) -> str | None:
        """A presigned URL for blob ``digest`` of ``slice_id``, or ``None``: use the blob path.

        Asks the server when the blob was announced and no fresh URL is known, together with
        the other announced blobs; a single blob is not worth a request of its own.
        """
        st = self._state.get()
        with st.lock:
            known = self._fresh(st, digest)
            if known is not None or st.off:
                return known
            waiting = st.asking.get(digest)
            if waiting is None:
                pending = st.pending.get(slice_id)
                if pending is None or digest not in pending or len(pending) < 2:
                    return None
                batch = [digest, *(h for h in pending if h != digest and h not in st.asking)]
                batch = batch[:BATCH]
                for h in batch:
                    pending.pop(h, None)
                done = threading.Event()
                st.asking.update(dict.fromkeys(batch, done))
        if waiting is not None:  # another thread asked for it: its answer serves us too
            waiting.wait(_WAIT_S)
            with st.lock:
                return self._fresh(st, digest)
        try:
            self._ask(st, slice_id, batch)
        finally:
            with st.lock:
                for h in batch:
                    st.asking.pop(h, None)
            done.set()
        with st.lock:
            return self._fresh(st, digest)

    @staticmethod
    def _fresh(st: _State, digest: str) -> str | None:
        hit = st.urls.get(digest)
        if hit is None:
            return None
        if hit[1] <= time.monotonic():
            del st.urls[digest]
            return None
        return hit[0]

    def _ask(self, st: _State, slice_id: str, batch: list[str]) -> None:
        t0 = time.monotonic()
        try:
            answer = self._post(f"v1/slices/{slice_id}/blob-urls", {"hashes": batch})
        except RetryableError as exc:  # busy or down: this batch takes the blob path
            log.debug("no blob URLs for %d blobs of %s: %s", len(batch), slice_id, exc)
            st.failures += 1
            st.off = st.failures >= _MAX_FAILURES  # (a proxy that answers 501 to every POST)
            return
        except RayformError as exc:  # refused (an older server has no such path): stop asking
            log.debug("the server gives no blob URLs (%s); using the blob path", exc)
            st.off = True
            return
        checked = _checked(answer, set(batch))
        if checked is None:
            log.debug("ignoring a malformed answer for the blob URLs of %s", slice_id)
            st.off = True
            return
        urls, expires_in = checked
        st.failures = 0
        if expires_in == 0:  # the server sends the bytes itself
            st.off = True
            return
        # Used until a quarter of its life (at most a minute) is left: a download that starts
        # just before the end could otherwise see its URL expire mid-body.
        use_by = t0 + expires_in - min(expires_in / 4, 60.0)
        with st.lock:
            st.urls.update((h, (u, use_by)) for h, u in urls.items())
            if len(st.urls) > 2 * _PENDING_CAP:  # forget the expired ones
                now = time.monotonic()
                st.urls = {h: v for h, v in st.urls.items() if v[1] > now}


def _checked(answer: object, asked: set[str]) -> tuple[dict[str, str], float] | None:
    """``(urls, expires_in)`` of a well-formed answer to a request for ``asked``, else None."""
    if not isinstance(answer, dict):
        return None
    urls, expires_in = answer.get("urls"), answer.get("expires_in")
    if not isinstance(urls, dict) or isinstance(expires_in, bool):
        return None
    if not isinstance(expires_in, int) or not 0 <= expires_in <= _EXPIRY_CAP:
        return None
    for h, u in urls.items():
        if h not in asked or not HASH_RE.fullmatch(h) or not isinstance(u, str):
            return None
        if len(u) > _URL_CAP or not u.startswith(("https://", "http://")):
            return None
    return urls, float(expires_in)
