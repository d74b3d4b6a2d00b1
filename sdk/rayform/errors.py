"""Every error Rayform raises, in one hierarchy.

::

    RayformError
    ├── InvalidArgumentError        bad value passed by the caller (also a ValueError)
    │   └── ConflictError           a label write raced another one on the same key (409)
    ├── NotFoundError               unknown slice, stream, segment or blob
    │   └── SliceChangedError       a slice no longer resolves to the manifest a dataset URI pins
    ├── AccessDeniedError           missing/wrong token (401) or out of scope (403)
    ├── OfflineError                offline mode and the object is not cached
    ├── IntegrityError              bytes do not match their BLAKE3 hash, size or format
    │   └── ManifestError           a manifest is malformed or of an unknown format
    ├── TransportError              network failure after all retries, or a 5xx answer
    │   └── ProtocolError           the server's answer breaks the protocol (malformed, oversized)
    └── CacheError                  the cache directory cannot be written (read-only, full disk)

Every message says what went wrong *and* what to do next. No message ever contains the
access token, and text that came from a server is shown escaped and capped
(:func:`rayform._untrusted.shown`).
"""

from __future__ import annotations

__all__ = [
    "AccessDeniedError",
    "CacheError",
    "ConflictError",
    "IntegrityError",
    "InvalidArgumentError",
    "ManifestError",
    "NotFoundError",
    "OfflineError",
    "ProtocolError",
    "RayformError",
    "SliceChangedError",
    "TransportError",
]


class RayformError(Exception):
    """Base class of every error raised by Rayform."""


class InvalidArgumentError(RayformError, ValueError):
    """A caller passed a value that is not allowed (malformed ID, bad fps, ...)."""


class ConflictError(InvalidArgumentError):
    """A write conflicts with another one that landed first: since the label-set version it
    read, someone set the same key of the same episode to another value (HTTP ``409``).
    Nothing was written; the message names the labels and says to read them again."""


class NotFoundError(RayformError, LookupError):
    """The server (or the manifest) has no such slice, stream, segment or blob."""


class SliceChangedError(NotFoundError):
    """The server's slice now resolves to another manifest than the one a dataset URI pins.

    The slice was rebuilt under the same ID, so its samples may differ from those trained on.
    The message names both manifest hashes and how to get the pinned bytes (a cache that holds
    them, used offline) or to train on the current version.
    """


class AccessDeniedError(RayformError, PermissionError):
    """The token is missing, wrong, or not allowed to see this slice."""


class OfflineError(RayformError):
    """Offline mode is on and the object is not in the cache.

    The message names the ``rayform pull`` command that would fetch it.
    """


class IntegrityError(RayformError):
    """Bytes do not match their content hash, declared size or format."""


class ManifestError(IntegrityError):
    """A manifest is malformed, of an unknown format version, or fails its hash."""


class TransportError(RayformError, ConnectionError):
    """The server could not be reached or kept failing after every retry."""


class ProtocolError(TransportError):
    """The server answered something the protocol does not allow: metadata that is not the
    documented JSON, values of the wrong type or range, a body larger than declared or allowed,
    a compressed body. Not retried: the message names the server and the field.
    """


class CacheError(RayformError, OSError):
    """The cache directory cannot be used: read-only, full disk, or not a directory."""
