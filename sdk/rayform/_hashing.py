"""BLAKE3 helpers: every blob and manifest is named by the hex digest of its bytes."""

from __future__ import annotations

import os
from pathlib import Path

import blake3

__all__ = ["hash_bytes", "hash_file", "new_hasher"]

_CHUNK = 1 << 20


def new_hasher() -> blake3.blake3:
    """A fresh incremental BLAKE3 hasher (``update(bytes)``, ``hexdigest()``)."""
    return blake3.blake3()


def hash_bytes(data: bytes) -> str:
    """BLAKE3 hex digest (64 chars) of ``data``."""
    return blake3.blake3(data).hexdigest()


def hash_file(path: str | os.PathLike[str]) -> str:
    """BLAKE3 hex digest of a file's bytes, read in 1 MiB chunks."""
    h = blake3.blake3()
    with Path(path).open("rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()
