"""Rayform: captured robot data to PyTorch training batches.

Public API::

    client = rayform.Client()                  # endpoint/token/cache from args or env
    slice_ = client.slices.get("slc_7c1e04aa")  # -> rayform.Slice
    dataset = rayform.torch.EpisodeDataset(slice_, obs=[...], action="...", fps=15)
    dataset.uri                                 # the dataset as trained (rayform.DatasetURI)

``rayform.torch`` is imported lazily so that ``import rayform`` does not need torch.
"""

from __future__ import annotations

import importlib
from typing import Any

from rayform import errors
from rayform.errors import (
    AccessDeniedError,
    CacheError,
    ConflictError,
    IntegrityError,
    InvalidArgumentError,
    ManifestError,
    NotFoundError,
    OfflineError,
    ProtocolError,
    RayformError,
    SliceChangedError,
    TransportError,
)
from rayform.manifest import BlobRef, Manifest, Segment, Segments, Stream
from rayform.uri import DatasetURI, MixtureURI

__version__ = "0.1.0"

__all__ = [
    "AccessDeniedError",
    "BlobRef",
    "CacheError",
    "ConflictError",
    "Client",
    "IntegrityError",
    "InvalidArgumentError",
    "Manifest",
    "ManifestError",
    "MixtureURI",
    "NotFoundError",
    "OfflineError",
    "ProtocolError",
    "RayformError",
    "DatasetURI",
    "Segment",
    "Segments",
    "Slice",
    "SliceChangedError",
    "Stream",
    "TransportError",
    "__version__",
    "errors",
]


def __getattr__(name: str) -> Any:
    # Lazy: `rayform.torch` needs torch, `Client`/`Slice` pull in httpx.
    if name == "torch":
        return importlib.import_module("rayform.torch")
    if name == "Client":
        from rayform.client import Client

        return Client
    if name == "Slice":
        from rayform.slice import Slice

        return Slice
    raise AttributeError(f"module 'rayform' has no attribute {name!r}")


def __dir__() -> list[str]:
    # Tab completion in a notebook: the public names (incl. the lazy ones), not `Any` etc.
    return sorted({*__all__, "torch"})
