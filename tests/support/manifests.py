"""Manifests for tests: a served one read over plain HTTP (no SDK client, no cache), an
in-memory one written and opened from a folder."""

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
    """The manifest of ``slice_id``, its pages fetched from ``/pages/{hash}`` into a temp dir
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
    """The same segments as an in-memory manifest."""
    return manifest if isinstance(manifest, Manifest) else manifest.to_v1()


def written(manifest: Manifest, folder: Path) -> tuple[bytes, list[Path]]:
    """``manifest`` written in the one format into ``folder``: ``(root bytes, page paths)``."""
    table = wire.segments_to_table(manifest.segments)
    pages = wire.table_to_pages(table)
    paths = []
    for page in pages:
        path = folder / wire.hash_bytes(page)
        path.write_bytes(page)
        paths.append(path)
    return wire.build_root(table, pages, manifest.description), paths


def open_written(manifest: Manifest, folder: Path) -> Any:
    """``manifest`` written into ``folder`` and opened (a :class:`ColumnarManifest`)."""
    root, paths = written(manifest, folder)
    return wire.load_manifest(root, wire.hash_bytes(root), lambda refs: paths)
