"""Open a manifest from the cache, fetching its pages.

A root lists its pages by hash; each page is fetched (in parallel), checked against its
hash and size before it enters the cache (:meth:`~rayform.cache.Cache.put_manifest`), and then
memory-mapped from there. Pages already cached (a slice version sharing most segments with one
opened before) are not fetched again, and pages this user has opened before are not checked
again (marks in ``<cache>/checked/u<uid>/``, :mod:`rayform.manifest._checkmarks`).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from rayform.cache import Cache
from rayform.errors import CacheError, IntegrityError, OfflineError
from rayform.manifest import CheckMarks, ColumnarManifest, load_manifest

__all__ = ["PAGE_JOBS", "open_manifest"]

#: Where in the cache each user's marks of checked manifests live (``checked/u<uid>/<hash>``).
CHECKED_DIR = "checked"
#: Pages fetched at once.
PAGE_JOBS = 8
#: bytes of pages (as their references declare) fetched at once: each is held in memory
#: whole, so the bound is on bytes, not on the number of fetches
PAGE_BYTES_IN_FLIGHT = 128 * 1024 * 1024


class _Budget:
    """Bytes in flight, at most ``limit`` (one item larger than that runs alone)."""

    def __init__(self, limit: int) -> None:
        self.limit, self.used = limit, 0
        self._cond = threading.Condition()

    @contextlib.contextmanager
    def holding(self, n: int) -> Iterator[None]:
        with self._cond:
            self._cond.wait_for(lambda: self.used == 0 or self.used + n <= self.limit)
            self.used += n
        try:
            yield
        finally:
            with self._cond:
                self.used -= n
                self._cond.notify_all()


def open_manifest(
    cache: Cache,
    slice_id: str,
    digest: str,
    data: bytes,
    fetch_page: Callable[[str, int], bytes] | None,
    jobs: int = PAGE_JOBS,
    pull: str | None = None,
) -> ColumnarManifest:
    """Parse manifest bytes ``data`` (already named ``digest``); fetch missing pages.

    Args:
        cache: where pages are cached and mapped from.
        slice_id: for messages.
        digest: the manifest's hash (checked against ``data``).
        data: the root's bytes.
        fetch_page: downloads a page's bytes by hash, reading at most its declared size
            (``fetch_page(hash, size)``); ``None`` offline.
        jobs: pages fetched in parallel.
        pull: offline, the command that fetches what is missing (default
            ``rayform pull SLICE_ID``).

    Raises:
        ManifestError: malformed manifest or page.
        IntegrityError: a fetched page does not match its hash or size (nothing cached).
        OfflineError: offline and a page is not cached.
    """

    def pages(refs: list[dict[str, Any]]) -> list[Path]:
        paths = [cache.manifest_path(str(r["hash"])) for r in refs]
        missing = [r for r, p in zip(refs, paths, strict=True) if not p.is_file()]
        if missing and fetch_page is None:
            raise OfflineError(
                f"{len(missing)} of {len(refs)} manifest pages of slice {slice_id} are not in the "
                f"cache {cache.root} and offline mode is on (RAYFORM_OFFLINE=1); with network "
                f"access run `{pull or f'rayform pull {slice_id}'}`"
            )
        if missing and fetch_page is not None:
            get = fetch_page

            budget, failed = _Budget(PAGE_BYTES_IN_FLIGHT), threading.Event()

            def one(ref: dict[str, Any]) -> None:
                size = int(ref["size"])
                with budget.holding(size):
                    if failed.is_set():
                        return
                    page = get(str(ref["hash"]), size)
                    if len(page) != size:
                        raise IntegrityError(
                            f"manifest page {str(ref['hash'])[:12]}... of slice {slice_id} is "
                            f"{len(page)} bytes, the manifest says {size}; nothing was cached. "
                            "Retry, and report it to the data owners if it persists."
                        )
                    cache.put_manifest(page, str(ref["hash"]))  # refuses bytes that fail the hash

            pool = ThreadPoolExecutor(max_workers=max(1, min(jobs, len(missing))))
            try:
                for fut in [pool.submit(one, r) for r in missing]:
                    fut.result()
            except BaseException:
                failed.set()
                raise
            finally:
                # After a failure no page not yet started is fetched: the manifest is lost
                # anyway, and each fetch could take a whole stall bound.
                pool.shutdown(wait=True, cancel_futures=True)
        return paths

    # The marks' folder is shared by every user of a team cache (each writes its own
    # subfolder), so the cache makes it with its team mode; marks are best effort, so a
    # read-only cache just checks every page.
    with contextlib.suppress(CacheError):
        cache.make_dir(CHECKED_DIR)
    return load_manifest(data, digest, pages, CheckMarks(cache.root / CHECKED_DIR))
