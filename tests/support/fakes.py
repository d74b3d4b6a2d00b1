"""The tests' one stand-in for ``rayform.Client`` behind a ``Slice``: blobs from a server store.

:class:`StoreBlobs` satisfies :class:`rayform._seams.BlobFetcher` (``ensure_blob``,
``cache_dir``, ``pull``, ``cache_limit``, ``would_fetch``), so ``Slice(..., StoreBlobs(store))``
is a slice whose blobs come straight from a data root: no server, no network, no cache. It
records what it was asked for.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rayform.manifest import BlobRef, ColumnarManifest, Manifest, manifest_hash
from rayform.slice import Slice
from rayform_server.store import Store

__all__ = ["StoreBlobs", "store_slice"]


class StoreBlobs:
    """Blobs straight from ``store`` (a :class:`rayform._seams.BlobFetcher`).

    Args:
        store: the server's data root; ``None`` for a slice whose blobs must never be read
            (any request fails the test).
        cache_dir: where statistics are kept (``None``: nowhere).

    Attributes:
        cache_dir: as given (a test may change it).
        calls: how many blobs were asked for.
        asked: the hashes of the blobs asked for.
    """

    def __init__(self, store: Store | None, cache_dir: Path | None = None) -> None:
        self.store = store
        self.cache_dir = cache_dir
        self.calls = 0
        self.asked: set[str] = set()

    def ensure_blob(self, slice_id: str, ref: BlobRef) -> Path:
        self.calls += 1
        self.asked.add(ref.hash)
        if self.store is None:
            raise AssertionError(
                f"blob {ref.hash[:12]} of {slice_id} was read; this test reads none"
            )
        return self.store.blob_path(ref.hash)

    def pull(
        self,
        slice_id: Any,
        streams: Sequence[str] | None = None,
        jobs: int = 8,
        progress: bool = False,
    ) -> None:
        """Nothing to do: every blob of a store is already local."""

    @property
    def cache_limit(self) -> int | None:
        """No limit: blobs stay in the store."""
        return None

    def would_fetch(self, ref: BlobRef) -> bool:
        """Never: every blob of a store is already local."""
        return False


def store_slice(
    slice_id: str,
    manifest: Manifest | ColumnarManifest,
    store: Store | None,
    cache_dir: Path | None = None,
) -> Slice:
    """A :class:`~rayform.Slice` of ``manifest`` whose blobs come from ``store``."""
    return Slice(slice_id, manifest_hash(manifest), manifest, StoreBlobs(store, cache_dir))
