"""What an offline error says to run: the ``rayform pull`` command that fetches what is missing.

A plain ``rayform pull SLICE_ID`` fetches what the slice's current manifest lists. A slice bound
to another version by hash (``client.slices.get(..., manifest_hash=)``, a dataset URI,
``rayform pull --manifest``) needs ``--manifest HASH`` as well, or the pull fetches the other
version's blobs and the missing one stays missing. Which version is "current" offline is the one
the cache remembers the slice resolving to (its ref).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from rayform.cache import Cache
from rayform.errors import OfflineError
from rayform.manifest import BlobRef, ColumnarManifest, Manifest, segments_of

__all__ = ["missing_blobs", "remembered"]

#: Manifests a client opened, by hash (and the last one per slice ID).
Opened = Mapping[str, Manifest | ColumnarManifest]


def remembered(cache: Cache, endpoint_key: str | None, slice_id: str) -> str | None:
    """The manifest ``slice_id`` last resolved to in ``cache`` (what a plain pull fetched)."""
    ref = cache.get_ref(endpoint_key, slice_id) or cache.get_ref(None, slice_id)
    return None if ref is None else str(ref["manifest"])


def _streams(opened: Opened, key: str | None, blob: str) -> list[str]:
    manifest = opened.get(key) if key is not None else None
    return [] if manifest is None else segments_of(manifest).streams_with_blob(blob)


def _holding(opened: Opened, bound: Iterable[str], blob: str, current: str | None) -> str | None:
    """The manifest bound by hash that ``blob`` comes from (the latest bound first), or
    ``None`` when the current one holds it too (a plain pull fetches it)."""
    if _streams(opened, current, blob):
        return None
    return next(
        (digest for digest in reversed(list(bound)) if _streams(opened, digest, blob)), None
    )


def missing_blobs(
    slice_id: str,
    refs: Sequence[BlobRef],
    cache_dir: Path,
    *,
    opened: Opened,
    current: str | None,
    bound: Iterable[str] = (),
    manifest_hash: str | None = None,
) -> OfflineError:
    """The error for blobs ``refs`` of ``slice_id`` missing offline, naming the pull that
    fetches them.

    Args:
        slice_id: the slice they belong to.
        refs: the missing blobs (at least one).
        cache_dir: the cache, for the message.
        opened: the manifests the client opened.
        current: what the slice resolves to as far as the cache knows (:func:`remembered`).
        bound: manifests of ``slice_id`` bound by hash, oldest first.
        manifest_hash: the version the blobs come from, when the caller knows it.
    """
    if manifest_hash is None:
        manifest_hash = _holding(opened, bound, refs[0].hash, current)
    streams: set[str] = set()
    for ref in refs:
        streams.update(_streams(opened, manifest_hash or slice_id, ref.hash))
    cmd = (
        f"rayform pull {slice_id}"
        + (f" --manifest {manifest_hash}" if manifest_hash not in (None, current) else "")
        + (f" --streams {' '.join(sorted(streams))}" if streams else "")
    )
    what = f"blob {refs[0].hash[:12]}..." if len(refs) == 1 else f"{len(refs)} blobs"
    return OfflineError(
        f"{what} of slice {slice_id} not in the cache {cache_dir} and offline mode is "
        f"on (RAYFORM_OFFLINE=1); with network access run `{cmd}`"
    )
