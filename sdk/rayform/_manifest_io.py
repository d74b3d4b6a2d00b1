"""Open a manifest of either version from the cache, fetching a v2 manifest's pages.

A v2 root lists its pages by hash; each page is fetched (in parallel), checked against its
hash and size before it enters the cache (:meth:`~rayform.cache.Cache.put_manifest`), and then
memory-mapped from there. Pages already cached (a slice version sharing most segments with one
opened before) are not fetched again.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from rayform.cache import Cache
from rayform.errors import IntegrityError, OfflineError
from rayform.manifest import ColumnarManifest, Manifest, load_manifest

__all__ = ["PAGE_JOBS", "open_manifest"]

#: Pages fetched at once.
PAGE_JOBS = 8


def open_manifest(
    cache: Cache,
    slice_id: str,
    digest: str,
    data: bytes,
    fetch_page: Callable[[str, int], bytes] | None,
    jobs: int = PAGE_JOBS,
) -> Manifest | ColumnarManifest:
    """Parse manifest bytes ``data`` (already named ``digest``); fetch missing v2 pages.

    Args:
        cache: where pages are cached and mapped from.
        slice_id: for messages.
        digest: the manifest's hash (checked against ``data``).
        data: v1 JSON or a v2 root.
        fetch_page: downloads a page's bytes by hash, reading at most its declared size
            (``fetch_page(hash, size)``); ``None`` offline.
        jobs: pages fetched in parallel.

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
                f"access run `rayform pull {slice_id}`"
            )
        if missing and fetch_page is not None:
            get = fetch_page

            def one(ref: dict[str, Any]) -> None:
                page = get(str(ref["hash"]), int(ref["size"]))
                if len(page) != int(ref["size"]):
                    raise IntegrityError(
                        f"manifest page {str(ref['hash'])[:12]}... of slice {slice_id} is "
                        f"{len(page)} bytes, the manifest says {ref['size']}; nothing was cached. "
                        "Retry, and report it to the data owners if it persists."
                    )
                cache.put_manifest(page, str(ref["hash"]))  # refuses bytes that fail the hash

            with ThreadPoolExecutor(max_workers=max(1, min(jobs, len(missing)))) as pool:
                for fut in [pool.submit(one, r) for r in missing]:
                    fut.result()
        return paths

    return load_manifest(data, digest, pages)
