"""Read a served manifest of either version over plain HTTP (no SDK client, no cache)."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import httpx

from rayform import format as wire
from rayform.manifest import Manifest


def served_manifest(
    base_url: str,
    slice_id: str,
    headers: dict[str, str],
    data: bytes | None = None,
    expected_hash: str | None = None,
) -> Any:
    """The manifest of ``slice_id``, its v2 pages fetched from ``/pages/{hash}`` into a temp dir
    (kept for the life of the process, since the pages are memory-mapped)."""
    base = f"{base_url}/v1/slices/{slice_id}"
    if data is None:
        r = httpx.get(base + "/manifest", headers=headers)
        assert r.status_code == 200, r.text
        data = r.content
    folder = Path(tempfile.mkdtemp(prefix="served-pages-"))

    def pages(refs: list[dict[str, Any]]) -> list[Path]:
        out = []
        for ref in refs:
            r = httpx.get(f"{base}/pages/{ref['hash']}", headers=headers)
            assert r.status_code == 200, r.text
            path = folder / ref["hash"]
            path.write_bytes(r.content)
            out.append(path)
        return out

    return wire.load_manifest(data, expected_hash, pages)


def as_v1(manifest: Any) -> Manifest:
    """The same segments as a version 1 manifest."""
    return manifest if isinstance(manifest, Manifest) else manifest.to_v1()
