"""Where the server keeps blob bytes: a local directory or S3-compatible object storage.

The store's metadata (manifests, slice references) always stays in the local data root; only
blobs go through a :class:`BlobBackend`. With :class:`S3BlobBackend` the HTTP server answers
blob requests with a redirect to a short-lived presigned URL, so clients fetch the bytes
straight from the object store.

A data root remembers where its blobs live in ``ROOT/blobstore.json``
(``{"blobs": "s3://BUCKET/PREFIX", "s3_endpoint": "http://..."}``), written the first time a
command is given ``--blobs``. ``Store(root)`` without an explicit backend reads it, so
``demo``, ``ingest``, ``slices`` and ``serve`` on one root all agree, even in worker
processes. No file means the local directory ``ROOT/blobs``. An endpoint given to
:func:`configure_root` (``--s3-endpoint``) overrides the recorded one for that process and the
worker processes it starts (it travels in the environment variable
:data:`ENDPOINT_OVERRIDES_ENV`, which workers inherit), never for later commands.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlparse

from rayform.errors import AccessDeniedError, InvalidArgumentError, TransportError
from rayform.files import publish, write_atomic
from rayform.format import check_hash, sharded_path

__all__ = [
    "CONFIG_NAME",
    "DEFAULT_PRESIGN_EXPIRY_S",
    "ENDPOINT_OVERRIDES_ENV",
    "BlobBackend",
    "LocalBlobBackend",
    "S3BlobBackend",
    "backend_for_root",
    "blob_backend_from_url",
    "configure_root",
]

#: The file in a data root that says where its blobs live (absent: the local ``blobs/``).
CONFIG_NAME = "blobstore.json"
#: Lifetime of a presigned blob URL in seconds (clients ask again when one expires).
DEFAULT_PRESIGN_EXPIRY_S = 300
#: JSON ``{"/absolute/root": "http://endpoint"}``: the S3 endpoints :func:`configure_root` was
#: given in this process, by root. An environment variable, not a module global, so that
#: worker processes (forked or spawned) open the same endpoint as the command that started them.
ENDPOINT_OVERRIDES_ENV = "RAYFORM_SERVER_S3_ENDPOINT_OVERRIDES"


class BlobBackend(Protocol):
    """The operations the store and the HTTP server need on blob bytes."""

    def exists(self, digest: str) -> bool:
        """Whether the blob ``digest`` is stored."""
        ...

    def size(self, digest: str) -> int:
        """The stored blob's size in bytes."""
        ...

    def add_file(self, src: Path, digest: str) -> None:
        """Take ownership of the verified file ``src`` (hash ``digest``); idempotent."""
        ...

    def local_path(self, digest: str) -> Path | None:
        """A path to read the blob from, or ``None`` when it only lives remotely."""
        ...

    def presigned_url(self, digest: str, expires_s: int) -> str | None:
        """A URL that grants GET (with Range) for ``expires_s`` seconds, or ``None``."""
        ...

    def describe(self) -> str:
        """Where the blobs live, for messages (no credentials)."""
        ...


class LocalBlobBackend:
    """Blobs under ``ROOT/blobs/ab/<hash>``, read-only once written."""

    def __init__(self, root: Path) -> None:
        self.dir = Path(root) / "blobs"
        self.dir.mkdir(parents=True, exist_ok=True)

    def path(self, digest: str) -> Path:
        """The file ``blobs/ab/<hash>`` of blob ``digest`` (it may not exist yet)."""
        return sharded_path(self.dir, digest)

    def exists(self, digest: str) -> bool:
        """Whether the blob's file is in ``blobs/``."""
        return self.path(digest).is_file()

    def size(self, digest: str) -> int:
        """The blob file's size in bytes."""
        return self.path(digest).stat().st_size

    def add_file(self, src: Path, digest: str) -> None:
        """Rename ``src`` into ``blobs/`` read-only, or drop it if the blob is already there."""
        dest = self.path(digest)
        if dest.exists():
            src.unlink(missing_ok=True)
            return
        dest.parent.mkdir(parents=True, exist_ok=True)
        publish(src, dest, mode=0o444)

    def local_path(self, digest: str) -> Path | None:
        """The blob's file: a local store is always read from disk."""
        return self.path(digest)

    def presigned_url(self, digest: str, expires_s: int) -> str | None:
        """Always ``None``: the server sends a local blob's bytes itself."""
        return None

    def describe(self) -> str:
        """``local directory <path>``."""
        return f"local directory {self.dir}"


class S3BlobBackend:
    """Blobs as objects ``s3://BUCKET/PREFIX/ab/<hash>`` on any S3-compatible store.

    Credentials come from the standard AWS environment variables (``AWS_ACCESS_KEY_ID``,
    ``AWS_SECRET_ACCESS_KEY``, ``AWS_REGION``...). Presigned URLs use SigV4 (boto3 would
    default to SigV2 for custom endpoints).

    Requests made while serving (does a blob exist?) use one attempt with a short timeout,
    ``lookup_timeout_s`` (default ``RAYFORM_SERVER_STORE_TIMEOUT``, else 5 s): a stalled store
    must turn into a quick ``503`` with ``Retry-After``, never a request that hangs while the
    client waits. Uploads (ingest) keep botocore's patient defaults.
    """

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        *,
        endpoint_url: str | None = None,
        region: str | None = None,
        create_bucket: bool = True,
        lookup_timeout_s: float | None = None,
    ) -> None:
        import boto3

        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.endpoint_url = endpoint_url
        self._region = region or os.environ.get("AWS_REGION") or "us-east-1"
        self._s3 = boto3.client(
            "s3",
            endpoint_url=endpoint_url,
            region_name=self._region,
            config=self._config(retries={"max_attempts": 5, "mode": "standard"}),
        )
        if lookup_timeout_s is None:
            lookup_timeout_s = float(os.environ.get("RAYFORM_SERVER_STORE_TIMEOUT") or 5.0)
        self.set_lookup_timeout(lookup_timeout_s)
        self._known: set[str] = set()
        if create_bucket:
            self._ensure_bucket()

    @staticmethod
    def _config(**kw: object) -> Any:
        from botocore.config import Config

        return Config(signature_version="s3v4", s3={"addressing_style": "path"}, **kw)

    def set_lookup_timeout(self, seconds: float) -> None:
        """Connect/read timeout in seconds of the requests made while serving (one attempt)."""
        import boto3

        if not seconds > 0:
            raise ValueError(
                f"the object store timeout must be a positive number of seconds, got {seconds!r}"
            )
        self.lookup_timeout_s = float(seconds)
        self._lookup = boto3.client(
            "s3",
            endpoint_url=self.endpoint_url,
            region_name=self._region,
            config=self._config(
                connect_timeout=seconds,
                read_timeout=seconds,
                retries={"max_attempts": 1, "mode": "standard"},
            ),
        )

    def host(self) -> str:
        """``host[:port]`` of the object store (what errors may show of it)."""
        if self.endpoint_url:
            return urlparse(self.endpoint_url).netloc or self.endpoint_url
        return "s3.amazonaws.com"

    def _ensure_bucket(self) -> None:
        from botocore.exceptions import BotoCoreError, ClientError

        fix = (
            "check AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY (or AWS_PROFILE) and --s3-endpoint, "
            "then start again"
        )
        try:
            try:
                self._lookup.head_bucket(Bucket=self.bucket)
            except ClientError as exc:
                if exc.response.get("Error", {}).get("Code") not in (
                    "404",
                    "NoSuchBucket",
                    "NotFound",
                ):
                    raise
                self._s3.create_bucket(Bucket=self.bucket)
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code", "?")
            raise AccessDeniedError(
                f"the object store {self.describe()} refused access to bucket "
                f"{self.bucket!r} (error {code}): {fix}"
            ) from None
        except BotoCoreError as exc:
            raise TransportError(
                f"cannot use the object store {self.describe()} ({exc}): {fix}"
            ) from None

    def key(self, digest: str) -> str:
        """The object key ``PREFIX/ab/<hash>`` of blob ``digest`` (checked to be a hash)."""
        check_hash(digest)
        return f"{self.prefix}/{digest[:2]}/{digest}" if self.prefix else f"{digest[:2]}/{digest}"

    def exists(self, digest: str) -> bool:
        """Whether the object exists (one short ``HEAD``; a yes is remembered)."""
        from botocore.exceptions import ClientError

        if digest in self._known:
            return True
        try:
            self._lookup.head_object(Bucket=self.bucket, Key=self.key(digest))
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                return False
            raise
        self._known.add(digest)
        return True

    def size(self, digest: str) -> int:
        """The object's ``ContentLength`` in bytes."""
        return int(self._s3.head_object(Bucket=self.bucket, Key=self.key(digest))["ContentLength"])

    def add_file(self, src: Path, digest: str) -> None:
        """Upload ``src`` unless the object exists, then delete ``src`` either way."""
        try:
            if not self.exists(digest):
                self._s3.upload_file(str(src), self.bucket, self.key(digest))
                self._known.add(digest)
        finally:
            src.unlink(missing_ok=True)

    def local_path(self, digest: str) -> Path | None:
        """Always ``None``: the blob lives only in the bucket."""
        return None

    def presigned_url(self, digest: str, expires_s: int) -> str | None:
        """A SigV4 presigned ``GET`` URL of the object, valid ``expires_s`` seconds."""
        return self._s3.generate_presigned_url(
            "get_object",
            Params={"Bucket": self.bucket, "Key": self.key(digest)},
            ExpiresIn=expires_s,
        )

    def describe(self) -> str:
        """``s3://BUCKET/PREFIX``, plus the endpoint when it is not AWS's."""
        where = f" at {self.endpoint_url}" if self.endpoint_url else ""
        return f"s3://{self.bucket}/{self.prefix}{where}"


def blob_backend_from_url(
    url: str | None, root: Path, *, endpoint_url: str | None = None
) -> BlobBackend:
    """``None`` or ``file://`` -> local directory under ``root``; ``s3://BUCKET/PREFIX`` -> S3."""
    if not url:
        return LocalBlobBackend(root)
    parsed = urlparse(url)
    if parsed.scheme == "s3" and parsed.netloc:
        return S3BlobBackend(parsed.netloc, parsed.path, endpoint_url=endpoint_url)
    if parsed.scheme == "file":
        return LocalBlobBackend(Path(parsed.path))
    raise InvalidArgumentError(
        f"unsupported blob store {url!r}: use s3://BUCKET/PREFIX or leave it out for the local root"
    )


def _read_config(root: Path) -> dict[str, str] | None:
    try:
        doc = json.loads((root / CONFIG_NAME).read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise InvalidArgumentError(
            f"{root / CONFIG_NAME} is unreadable ({exc}): fix or delete it "
            "(deleting it means the blobs are in ROOT/blobs)"
        ) from None
    if not isinstance(doc, dict) or not isinstance(doc.get("blobs"), str):
        raise InvalidArgumentError(f'{root / CONFIG_NAME} has no "blobs" URL: fix or delete it')
    return doc


def _endpoint_overrides() -> dict[str, str]:
    try:
        doc = json.loads(os.environ.get(ENDPOINT_OVERRIDES_ENV) or "{}")
    except ValueError:
        return {}
    return {str(k): str(v) for k, v in doc.items()} if isinstance(doc, dict) else {}


def _override_endpoint(root: Path, endpoint_url: str) -> None:
    """Make ``endpoint_url`` the S3 endpoint of ``root`` for this process and its workers."""
    overrides = _endpoint_overrides()
    overrides[str(root.resolve())] = endpoint_url
    os.environ[ENDPOINT_OVERRIDES_ENV] = json.dumps(overrides, sort_keys=True)


def backend_for_root(root: str | os.PathLike[str]) -> BlobBackend:
    """The blob backend a data root was configured with (see :func:`configure_root`).

    Without ``ROOT/blobstore.json`` this is the local directory ``ROOT/blobs``. The S3 endpoint
    is the one :func:`configure_root` was given for ``root`` in this process (or the process
    that started this worker), else the recorded one.

    Raises:
        InvalidArgumentError: the configuration file is unreadable or names an unsupported store.
    """
    root = Path(root)
    doc = _read_config(root)
    if doc is None:
        return LocalBlobBackend(root)
    endpoint = _endpoint_overrides().get(str(root.resolve())) or doc.get("s3_endpoint") or None
    return blob_backend_from_url(doc["blobs"], root, endpoint_url=endpoint)


def configure_root(
    root: str | os.PathLike[str], blobs: str | None, endpoint_url: str | None = None
) -> BlobBackend:
    """The blob backend for ``root``, recording ``blobs`` in ``ROOT/blobstore.json`` if new.

    Args:
        root: the data root (created if missing).
        blobs: ``s3://BUCKET/PREFIX``; ``None`` uses what the root recorded (or the local
            directory).
        endpoint_url: the S3 API endpoint, e.g. ``http://127.0.0.1:8333``; it overrides the
            recorded one for this process and the worker processes it starts, not for later
            commands (a server may presign against another name for the same store).

    Raises:
        InvalidArgumentError: ``blobs`` differs from the store the root already records, or is not a
            supported URL.
    """
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    doc = _read_config(root)
    if blobs is None:
        if doc is None:
            if endpoint_url:
                raise InvalidArgumentError(
                    f"an S3 endpoint was given but the data root {root} keeps its blobs "
                    "locally: add --blobs s3://BUCKET/PREFIX"
                )
            return LocalBlobBackend(root)
        if endpoint_url:
            _override_endpoint(root, endpoint_url)
        return blob_backend_from_url(
            doc["blobs"], root, endpoint_url=endpoint_url or doc.get("s3_endpoint") or None
        )
    wanted = blobs.rstrip("/")
    if doc is not None and doc["blobs"].rstrip("/") != wanted:
        raise InvalidArgumentError(
            f"the data root {root} keeps its blobs in {doc['blobs']}, not {blobs}: "
            f"pass --blobs {doc['blobs']} or use another --root"
        )
    if doc is None and any((root / "blobs").rglob("*")):
        raise InvalidArgumentError(
            f"the data root {root} already holds blobs in {root / 'blobs'}: copy them "
            f"to {blobs} and start from a fresh --root, or leave --blobs out"
        )
    backend = blob_backend_from_url(wanted, root, endpoint_url=endpoint_url)
    if endpoint_url and not isinstance(backend, LocalBlobBackend):
        _override_endpoint(root, endpoint_url)
    if doc is None and not isinstance(backend, LocalBlobBackend):
        record = {"blobs": wanted, "s3_endpoint": endpoint_url or ""}
        write_atomic(
            root / CONFIG_NAME, (json.dumps(record, indent=2, sort_keys=True) + "\n").encode()
        )
    return backend
