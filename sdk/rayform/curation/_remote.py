"""The client side of the label and publish endpoints (docs/protocol.md, "Writes").

Everything a server answers is checked before use (:mod:`rayform._untrusted`): a label-set head
field by field, a label set against its hash and then its format
(:func:`~rayform.curation.parse_labelset`), a published slice's reference against the slice ID
rule. Label sets are cached content-addressed beside the manifests, and the head last read
under ``labels/<endpoint-key>/<slice>/<manifest hash>``, so ``slice_.labels`` works offline
after ``rayform pull``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

from rayform._ids import HASH_RE, SLICE_ID_RE
from rayform._net import REFERENCE_CAP, Transport
from rayform._untrusted import shown
from rayform.cache import Cache
from rayform.curation._labels import Labels
from rayform.curation._labelset import LIMITS, empty_labelset, parse_labelset
from rayform.errors import ManifestError, NotFoundError, OfflineError, ProtocolError
from rayform.manifest import Segments

__all__ = ["LabelHost", "LabelRemote"]


def _head(doc: object, where: str) -> tuple[str | None, int]:
    """``(hash or None, size)`` of a label-set head answer, checked."""
    if isinstance(doc, dict):
        digest, version, size = doc.get("hash"), doc.get("version"), doc.get("size")
        if digest is None and version == 0:
            return None, 0
        if (
            isinstance(digest, str)
            and HASH_RE.fullmatch(digest) is not None
            and isinstance(version, int)
            and isinstance(size, int)
            and not isinstance(size, bool)
            and 0 < size <= LIMITS["labelset_bytes"]
        ):
            return digest, size
    raise ProtocolError(
        f"{where}: the label-set head {shown(repr(doc), 120)} is not "
        '{"hash": 64 hex digits, "version": int, "size": bytes} or {"hash": null, "version": 0}'
    )


class LabelRemote:
    """Reads and writes the labels of a client's slices.

    Args:
        transport: the client's transport (``None`` offline).
        cache: the client's cache.
        key: the server's endpoint key (``None`` offline: any server's cached head).
    """

    def __init__(self, transport: Transport | None, cache: Cache, key: str | None) -> None:
        self.transport = transport
        self.cache = cache
        self.key = key

    def _ref_path(self, slice_id: str, manifest_hash: str) -> str:
        return f"labels/{self.key}/{slice_id}/{manifest_hash}"

    def read(
        self, slice_id: str, manifest_hash: str, segments: Segments, digest: str | None = None
    ) -> Labels:
        """The labels on that manifest: the latest version (``digest`` ``None``) or the
        version ``digest`` (a pinned one, read from the cache if it holds it).

        Raises:
            OfflineError: offline and not cached (names the ``rayform pull`` that fixes it).
            NotFoundError: the server has no such label set for this slice.
        """
        if digest is None:
            digest = self._head(slice_id, manifest_hash)
        if digest is None:
            return Labels(empty_labelset(slice_id, manifest_hash), None, segments)
        return Labels(self._labelset(slice_id, manifest_hash, digest), digest, segments)

    def _head(self, slice_id: str, manifest_hash: str) -> str | None:
        if self.transport is None:
            paths = sorted(self.cache.root.glob(f"labels/*/{slice_id}/{manifest_hash}"))
            for path in paths:
                try:
                    doc = json.loads(path.read_bytes())
                    return _head(doc, "cached labels")[0]
                except (OSError, ValueError, ProtocolError):
                    continue
            raise OfflineError(
                f"the labels of slice {slice_id} (manifest {manifest_hash[:12]}...) are not in the "
                f"cache {self.cache.root} and offline mode is on (RAYFORM_OFFLINE=1); with network "
                f"access run `rayform pull {slice_id}` into this cache first"
            )
        what = f"reading the labels of slice {slice_id}"
        try:
            doc = self.transport.get_json(
                f"v1/slices/{slice_id}/labels/{manifest_hash}", what, limit=REFERENCE_CAP
            )
        except NotFoundError as exc:
            raise NotFoundError(
                f"{exc} (a server older than labels answers this for every slice)"
            ) from None
        digest, _ = _head(doc, f"{what}: {self.transport.server}")
        self.remember(slice_id, manifest_hash, doc)
        return digest

    def remember(self, slice_id: str, manifest_hash: str, head: Mapping[str, Any]) -> None:
        """Keep a head in the cache (what ``slice_.labels`` reads offline)."""
        if self.key is not None:
            doc = {k: head.get(k) for k in ("hash", "version", "size")}
            self.cache.put_file(self._ref_path(slice_id, manifest_hash), json.dumps(doc).encode())

    def _labelset(self, slice_id: str, manifest_hash: str, digest: str) -> dict[str, Any]:
        data = self.cache.get_manifest(digest)
        if data is not None:
            return parse_labelset(data, digest, slice_id, manifest_hash)
        if self.transport is None:
            raise OfflineError(
                f"label set {digest[:12]}... of slice {slice_id} is not in the cache "
                f"{self.cache.root} and offline mode is on (RAYFORM_OFFLINE=1); with network "
                f"access run `rayform pull {slice_id}` into this cache first"
            )
        data = self.transport.get_bytes(
            f"v1/slices/{slice_id}/labelsets/{digest}",
            f"fetching label set {digest[:12]}... of slice {slice_id}",
            limit=LIMITS["labelset_bytes"],
        )
        try:
            doc = parse_labelset(data, digest, slice_id, manifest_hash)
        except ManifestError as exc:
            raise ManifestError(f"{self.transport.server}: {exc}") from None
        self.cache.put_manifest(data, digest)
        return doc

    def write(
        self,
        slice_id: str,
        manifest_hash: str,
        segments: Segments,
        base: str | None,
        changes: Mapping[str, Mapping[str, Any]],
        kinds: Mapping[str, str] | None,
    ) -> Labels:
        """Send one write (the server merges it, docs/curation.md) and read the new version."""
        if self.transport is None:
            raise OfflineError(
                f"labelling slice {slice_id} needs the server, and offline mode is on "
                "(RAYFORM_OFFLINE=1): label with network access"
            )
        body: dict[str, Any] = {"base": base, "set": {k: dict(v) for k, v in changes.items()}}
        if kinds:
            body["kinds"] = dict(kinds)
        what = f"labelling episodes of slice {slice_id}"
        head = self.transport.post_json(
            f"v1/slices/{slice_id}/labels/{manifest_hash}", body, what, limit=REFERENCE_CAP
        )
        digest, _ = _head(head, f"{what}: {self.transport.server}")
        self.remember(slice_id, manifest_hash, head)
        return self.read(slice_id, manifest_hash, segments, digest)

    def create(self, body: Mapping[str, Any]) -> str:
        """Publish a selection (``POST /v1/slices``); returns the new slice's ID."""
        if self.transport is None:
            raise OfflineError(
                "publishing a slice needs the server, and offline mode is on (RAYFORM_OFFLINE=1)"
            )
        what = f"publishing a selection of slice {body.get('parent')}"
        doc = self.transport.post_json("v1/slices", dict(body), what, limit=REFERENCE_CAP)
        if not isinstance(doc, dict) or not SLICE_ID_RE.fullmatch(str(doc.get("id"))):
            raise ProtocolError(
                f"{what}: {self.transport.server} answered {shown(repr(doc), 120)}, not "
                '{"id": "slc_...", "manifest": hash}'
            )
        return str(doc["id"])


@runtime_checkable
class LabelHost(Protocol):
    """What :attr:`rayform.Slice.labels` and its writes need from the client that resolved the
    slice: its server's label endpoints and its cache (:class:`~rayform.Client` is one)."""

    def label_remote(self) -> LabelRemote:
        """Reads and writes labels through this client (online or offline)."""
        ...
