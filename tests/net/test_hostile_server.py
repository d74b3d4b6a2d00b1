"""A hostile or broken server cannot crash, exhaust or spoof the client (docs/reliability.md).

Every case scripts one crafted answer on a real loopback server (``support.hostile.HostileServer``;
the rest of the slice is served honestly) and checks that the client ends in a typed
``RayformError`` whose message is one safe line, within the stall bound, with nothing written
outside the cache and no file in it under a name that is not a hash, a slice ID or a documented
temporary name. A few cases run the ``rayform`` command in a subprocess and check what it
prints.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from support import DEMO_SLICE, SCRIPTS, TESTS, TOKEN
from support.hostile import (
    Answer,
    HostileServer,
    cache_names_ok,
    crafted_slice,
    gzip_bomb,
    has_control,
    page_bytes,
    v2_root,
)

import rayform
from rayform.errors import (
    AccessDeniedError,
    IntegrityError,
    ManifestError,
    NotFoundError,
    ProtocolError,
    RayformError,
    TransportError,
)
from rayform.format import (
    ColumnarManifest,
    build_root,
    canonical_json,
    encode_table,
    encode_timestamps,
    hash_bytes,
    load_manifest,
    segments_to_table,
    table_to_pages,
)
from rayform.manifest import BlobRef, Manifest, Segment, upgrade_manifest
from rayform.torch import EpisodeDataset
from rayform_server.store import Store

SLC = "slc_0badc0de"
H = "ab" * 32
ANSI = "\x1b[2J\x1b[31mpwned\x1b]0;title\x07\r\n"
STALL_S = 3.0


@dataclasses.dataclass
class Demo:
    """The demo slice, honestly: as a version 1 document (what an older server sent), its
    root, its segments and their table."""

    v1: dict[str, Any]
    root: dict[str, Any]
    segments: list[Segment]
    table: pa.Table


@pytest.fixture(scope="module")
def demo(demo_root: Path) -> Demo:
    store = Store(demo_root)
    manifest = store.load_manifest(store.get_slice(DEMO_SLICE)["manifest"])
    assert isinstance(manifest, ColumnarManifest)
    segments = list(manifest.segments)
    v1 = {"format": "rayform.manifest", "format_version": 1, **manifest.to_v1().to_json()}
    return Demo(v1, dict(manifest.doc), segments, segments_to_table(segments))


@pytest.fixture
def server(demo_root: Path) -> Iterator[HostileServer]:
    s = HostileServer(demo_root)
    yield s
    s.stop()


@pytest.fixture
def cache(tmp_path: Path) -> Iterator[Path]:
    """The client's cache; afterwards, nothing outside it and only documented names in it."""
    before = _outside(tmp_path)
    cache = tmp_path / "cache"
    yield cache
    assert _outside(tmp_path) == before, "the client wrote outside its cache"
    assert cache_names_ok(cache) == []


def _outside(tmp_path: Path) -> set[str]:
    """Files under ``tmp_path`` but outside the cache and the user state directory (where the
    decoder keeps its verdicts, docs/cache.md: written by whichever test decodes first)."""
    kept = {"cache", "state"}
    return {str(p) for p in tmp_path.rglob("*") if not kept & set(p.relative_to(tmp_path).parts)}


def _client(server: HostileServer, cache: Path, **kw: Any) -> rayform.Client:
    kw.setdefault("stall_timeout", 20.0)
    return rayform.Client(server.url, TOKEN, cache_dir=cache, **kw)


def _fails(
    call: Callable[[], object],
    error: type[RayformError],
    *,
    names_server: str | None = None,
    within_s: float = 30.0,
) -> RayformError:
    """Run ``call``; it must raise ``error`` within ``within_s`` with a safe one-line message."""
    t0 = time.monotonic()
    with pytest.raises(error) as info:
        call()
    assert time.monotonic() - t0 < within_s
    message = str(info.value)
    assert not has_control(message) and "\n" not in message, repr(message[:300])
    assert len(message) < 3000, len(message)
    assert TOKEN not in message
    if names_server is not None:
        assert names_server in message, message
    return info.value


def _v1(demo: Demo, change: Callable[[dict[str, Any]], object]) -> dict[str, Any]:
    doc = json.loads(json.dumps(demo.v1))
    change(doc)
    return doc


def _raw(doc: dict[str, Any], placeholder: str, raw: bytes) -> bytes:
    """Canonical bytes of ``doc`` with the JSON string ``placeholder`` replaced by raw JSON."""
    return canonical_json(doc).replace(json.dumps(placeholder).encode(), raw)


def _seg(doc: dict[str, Any]) -> dict[str, Any]:
    return doc["segments"][0]


def _cam(doc: dict[str, Any]) -> dict[str, Any]:
    return doc["segments"][0]["streams"]["cam0/rgb"]


# -- the slice reference -----------------------------------------------------------------
DEEP = b"[" * 100_000 + b"]" * 100_000
REFERENCES: dict[str, Answer] = {
    "json-array": Answer.json([H]),
    "hash-with-newline": Answer.json({"manifest": H + "\n", "manifest_size": 10}),
    "nested-100000-deep": Answer.json(DEEP),
    "5000-digit-integer": Answer.json(
        b'{"manifest": "%s", "manifest_size": 1%s}' % (H.encode(), b"0" * 5000)
    ),
    "size-infinity": Answer.json(b'{"manifest": "%s", "manifest_size": Infinity}' % H.encode()),
    "size-1e400": Answer.json(b'{"manifest": "%s", "manifest_size": 1e400}' % H.encode()),
    "size-a-string": Answer.json({"manifest": H, "manifest_size": "10"}),
    "size-a-terabyte": Answer.json({"manifest": H, "manifest_size": 10**12}),
    "description-not-a-string": Answer.json(
        {"manifest": H, "manifest_size": 10, "description": {"a": 1}}
    ),
    "html-from-a-proxy": Answer(200, b"<html><body>502 Bad Gateway</body></html>"),
    "endless-body": Answer(200, b'{"manifest": "', endless=True),
    "gzip-bomb": Answer(200, gzip_bomb(64 * 2**20), {"Content-Encoding": "gzip"}),
}


@pytest.mark.parametrize("case", sorted(REFERENCES))
def test_crafted_slice_reference(case: str, server: HostileServer, cache: Path) -> None:
    server.answers[f"/v1/slices/{SLC}"] = REFERENCES[case]
    _fails(lambda: _client(server, cache).slices.get(SLC), ProtocolError, names_server=server.url)
    assert not (cache / "refs").exists() or not list((cache / "refs").rglob(SLC))


# -- a version 1 manifest, correctly hashed: refused by its version; and, where a cache holds
# one, refused field by field by the rewrite (`rayform cache migrate`) ---------------------
V1_CASES: dict[str, Callable[[Demo], bytes]] = {
    "t0-1e400": lambda d: _raw(_v1(d, lambda m: _cam(m).update(t0_ns="@")), "@", b"1e400"),
    "t0-infinity": lambda d: _raw(_v1(d, lambda m: _cam(m).update(t0_ns="@")), "@", b"Infinity"),
    "rate-nan": lambda d: _raw(_v1(d, lambda m: _cam(m).update(rate_hz="@")), "@", b"NaN"),
    "nested-100000-deep": lambda d: _raw(_v1(d, lambda m: m.update(description="@")), "@", DEEP),
    "5000-digit-count": lambda d: _raw(
        _v1(d, lambda m: _cam(m).update(count="@")), "@", b"1" * 5000
    ),
    "count-2**70": lambda d: canonical_json(_v1(d, lambda m: _cam(m).update(count=2**70))),
    "count-a-string": lambda d: canonical_json(_v1(d, lambda m: _cam(m).update(count="3"))),
    "version-true": lambda d: canonical_json(_v1(d, lambda m: _seg(m).update(version=True))),
    "streams-a-list": lambda d: canonical_json(_v1(d, lambda m: _seg(m).update(streams=[1, 2]))),
    "segments-an-object": lambda d: canonical_json(_v1(d, lambda m: m.update(segments={"a": 1}))),
    "segment-id-newline": lambda d: canonical_json(
        _v1(d, lambda m: _seg(m).update(id=_seg(m)["id"] + "\n"))
    ),
    "segment-id-100000-chars": lambda d: canonical_json(
        _v1(d, lambda m: _seg(m).update(id="seg_" + "a" * 100_000))
    ),
    "blob-hash-newline": lambda d: canonical_json(
        _v1(d, lambda m: _cam(m)["blob"].update(hash=H + "\n"))
    ),
    "blob-size-negative": lambda d: canonical_json(
        _v1(d, lambda m: _cam(m)["blob"].update(size=-1))
    ),
    "stream-name-traversal": lambda d: canonical_json(
        _v1(d, lambda m: _seg(m)["streams"].update({"../x": _cam(m)}))
    ),
    "site-an-object": lambda d: canonical_json(_v1(d, lambda m: _seg(m).update(site={"a": 1}))),
    "site-100000-chars": lambda d: canonical_json(
        _v1(d, lambda m: _seg(m).update(site="x" * 100_000))
    ),
    "shape-strings": lambda d: canonical_json(_v1(d, lambda m: _cam(m).update(shape=["a"]))),
    "units-a-list": lambda d: canonical_json(_v1(d, lambda m: _cam(m).update(units=[1]))),
    "video-without-timestamps": lambda d: canonical_json(
        _v1(d, lambda m: _cam(m).pop("timestamps"))
    ),
    "not-an-object": lambda d: b'"just a string"',
    # A lone surrogate is valid JSON but not text: Arrow and a UTF-8 terminal fail on it.
    "site-lone-surrogate": lambda d: _raw(
        _v1(d, lambda m: _seg(m).update(site="@")), "@", b'"\\ud800"'
    ),
    "description-lone-surrogate": lambda d: _raw(
        _v1(d, lambda m: m.update(description="@")), "@", b'"evil \\udc00"'
    ),
    "video-shape-2d": lambda d: canonical_json(_v1(d, lambda m: _cam(m).update(shape=[96, 128]))),
    "video-shape-zero-width": lambda d: canonical_json(
        _v1(d, lambda m: _cam(m).update(shape=[96, 0, 3]))
    ),
    "table-shape-empty": lambda d: canonical_json(
        _v1(d, lambda m: _seg(m)["streams"]["joints/position"].update(shape=[]))
    ),
    "invalid-utf8": lambda d: b'{"format": "rayform.manifest", "description": "\xff"}',
}


@pytest.mark.parametrize("case", sorted(V1_CASES))
def test_crafted_v1_manifest(case: str, demo: Demo, server: HostileServer, cache: Path) -> None:
    data = V1_CASES[case](demo)
    digest = crafted_slice(server, SLC, data)
    _fails(lambda: _client(server, cache).slices.get(SLC), ManifestError, names_server=server.url)
    assert not list(cache.rglob(digest))  # nothing cached under the manifest's name
    with pytest.raises(ManifestError) as info:
        upgrade_manifest(data, digest, lambda refs: [])
    message = str(info.value)
    assert not has_control(message) and "\n" not in message and len(message) < 3000


def test_an_honest_v1_manifest_is_refused_with_the_rewrite_command(
    demo: Demo, server: HostileServer, cache: Path
) -> None:
    data = canonical_json(demo.v1)
    crafted_slice(server, SLC, data)
    error = _fails(lambda: _client(server, cache).slices.get(SLC), ManifestError)
    assert "format_version 1 is an older format" in str(error) and "migrate" in str(error)
    assert tuple(_segments_of(upgrade_manifest(data, None, lambda refs: []))) == tuple(
        demo.segments
    )


# -- a manifest: root and Arrow pages, correctly hashed ----------------------------------
def _crafted(server: HostileServer, slice_id: str, doc: dict[str, Any], **kw: Any) -> bytes:
    """Serve the segments of ``doc`` (an edit of ``Demo.v1``) as a manifest of the one format,
    pages and all; returns the root's bytes."""
    table = segments_to_table(list(Manifest.from_json(doc).segments))
    pages = table_to_pages(table)
    root = build_root(table, pages, doc.get("description", ""))
    crafted_slice(server, slice_id, root, pages={hash_bytes(p): p for p in pages}, **kw)
    return root


def _segments_of(upgraded: Any) -> Any:
    """The segments of a rewritten manifest, opened from a temporary folder."""
    folder = Path(tempfile.mkdtemp(prefix="upgraded-"))
    paths = []
    for page in upgraded.pages:
        (folder / hash_bytes(page)).write_bytes(page)
        paths.append(folder / hash_bytes(page))
    return load_manifest(upgraded.root, upgraded.hash, lambda refs: paths).segments


def _with_column(table: pa.Table, name: str, column: pa.Array) -> pa.Table:
    return table.set_column(table.schema.get_field_index(name), table.schema.field(name), column)


def _site_dictionary(table: pa.Table, indices: list[int], words: pa.Array) -> pa.Table:
    site = pa.DictionaryArray.from_arrays(pa.array(indices, pa.int32()), words, safe=False)
    return _with_column(table, "site", site)


def _segments_changed(d: Demo, **stream: Any) -> pa.Table:
    segs = list(d.segments)
    cam = dataclasses.replace(segs[0].streams["cam0/rgb"], **stream)
    segs[0] = dataclasses.replace(segs[0], streams={**segs[0].streams, cam.name: cam})
    return segments_to_table(segs)


def _one_page(
    d: Demo, table: pa.Table, compression: str | None = None, **root: Any
) -> tuple[bytes, dict[str, bytes]]:
    page = page_bytes(table.combine_chunks(), compression)
    return v2_root(d.root, [page], **root), {hash_bytes(page): page}


BAD_UTF8 = pa.Array.from_buffers(
    pa.string(), 1, [None, pa.py_buffer(bytes([0, 0, 0, 0, 2, 0, 0, 0])), pa.py_buffer(b"\xff\xfe")]
)
V2_CASES: dict[str, Callable[[Demo], tuple[bytes, dict[str, bytes]]]] = {
    "page-ref-without-segments": lambda d: _one_page(d, d.table, pages=[{"hash": H, "size": 10}]),
    "page-ref-size-a-terabyte": lambda d: _one_page(
        d, d.table, pages=[{"hash": H, "size": 10**12, "segments": 4}]
    ),
    "page-ref-hash-newline": lambda d: _one_page(
        d, d.table, pages=[{"hash": H + "\n", "size": 10, "segments": 4}]
    ),
    "pages-an-object": lambda d: _one_page(d, d.table, pages={"a": 1}),
    "summary-streams-a-list": lambda d: _one_page(
        d, d.table, summary={**d.root["summary"], "streams": [1]}
    ),
    "summary-rate-a-string": lambda d: _one_page(
        d,
        d.table,
        summary={
            **d.root["summary"],
            "streams": {
                "cam0/rgb": {**d.root["summary"]["streams"]["cam0/rgb"], "rate_hz": "fast"}
            },
        },
    ),
    "dictionary-index-out-of-range": lambda d: _one_page(
        d, _site_dictionary(d.table, [0, 1, 7, 0], pa.array(["a", "b"]))
    ),
    "dictionary-invalid-utf8": lambda d: _one_page(
        d, _site_dictionary(d.table, [0, 0, 0, 0], BAD_UTF8)
    ),
    "site-with-escape-codes-too-long": lambda d: _one_page(
        d, _site_dictionary(d.table, [0, 0, 0, 0], pa.array([ANSI * 100]))
    ),
    "blob-size-negative": lambda d: _one_page(d, _segments_changed(d, blob=BlobRef(H, -1))),
    "count-negative": lambda d: _one_page(d, _segments_changed(d, count=-3)),
    "stream-name-with-newline": lambda d: _one_page(d, _segments_changed(d, name="cam0/rgb\n")),
    "rate-nan": lambda d: _one_page(d, _segments_changed(d, rate_hz=float("nan"))),
    "rate-infinity": lambda d: _one_page(d, _segments_changed(d, rate_hz=float("inf"))),
    "ends-before-it-starts": lambda d: _one_page(d, _segments_changed(d, t1_ns=-5)),
    "time-2**63-1": lambda d: _one_page(d, _segments_changed(d, t1_ns=2**63 - 1)),
    "zstd-compressed-page": lambda d: _one_page(d, d.table, "zstd"),
    "summary-lists-a-ghost-stream": lambda d: _one_page(
        d,
        d.table,
        summary={
            **d.root["summary"],
            "streams": {
                **d.root["summary"]["streams"],
                "ghost/x": d.root["summary"]["streams"]["joints/position"],
            },
        },
    ),
    "video-shape-4d": lambda d: _one_page(d, _segments_changed(d, shape=(1, 96, 128, 3))),
    "video-shape-zero-height": lambda d: _one_page(d, _segments_changed(d, shape=(0, 128, 3))),
    "page-listed-twice": lambda d: _one_page(
        d,
        d.table,
        pages=[{"hash": H, "size": 10, "segments": d.root["summary"]["segments"]}]
        + [{"hash": H, "size": 10, "segments": 0}],
    ),
    "not-arrow": lambda d: (
        v2_root(d.root, [b"PK\x03\x04 not arrow"]),
        {hash_bytes(b"PK\x03\x04 not arrow"): b"PK\x03\x04 not arrow"},
    ),
}


@pytest.mark.parametrize("case", sorted(V2_CASES))
def test_crafted_v2_manifest(case: str, demo: Demo, server: HostileServer, cache: Path) -> None:
    root, pages = V2_CASES[case](demo)
    digest = crafted_slice(server, SLC, root, pages=pages)
    _fails(lambda: _client(server, cache).slices.get(SLC), ManifestError, names_server=server.url)
    assert not list(cache.rglob(digest))


def test_video_row_without_timestamps_is_a_manifest_error(
    demo: Demo, server: HostileServer, cache: Path
) -> None:
    root, pages = _one_page(demo, _segments_changed(demo, timestamps=None))
    crafted_slice(server, SLC, root, pages=pages)
    slice_ = _client(server, cache).slices.get(SLC)  # a per-row fact: found when the row is read
    _fails(lambda: slice_.segments[0], ManifestError)


# -- bodies: sizes, encodings, time -------------------------------------------------------
def test_manifest_longer_than_declared(demo: Demo, server: HostileServer, cache: Path) -> None:
    root = _crafted(server, SLC, demo.v1)
    server.answers[f"/v1/slices/{SLC}/manifest"] = Answer(200, root, endless=True)
    _fails(lambda: _client(server, cache).slices.get(SLC), ProtocolError, names_server=server.url)


def test_gzip_bomb_manifest(demo: Demo, server: HostileServer, cache: Path) -> None:
    _crafted(server, SLC, demo.v1)
    server.answers[f"/v1/slices/{SLC}/manifest"] = Answer(
        200, gzip_bomb(64 * 2**20), {"Content-Encoding": "gzip"}
    )
    _fails(lambda: _client(server, cache).slices.get(SLC), ProtocolError, names_server=server.url)


def test_page_longer_than_declared(demo: Demo, server: HostileServer, cache: Path) -> None:
    root, pages = _one_page(demo, demo.table)
    crafted_slice(server, SLC, root, pages={h: p + b"\0" * 4096 for h, p in pages.items()})
    _fails(lambda: _client(server, cache).slices.get(SLC), ProtocolError, names_server=server.url)


@pytest.mark.parametrize("what", ["reference", "manifest"])
def test_trickled_metadata_ends_within_the_stall_bound(
    what: str, demo: Demo, server: HostileServer, cache: Path
) -> None:
    _crafted(server, SLC, demo.v1)
    path = f"/v1/slices/{SLC}" + ("/manifest" if what == "manifest" else "")
    server.answers[path] = dataclasses.replace(server.answers[path], trickle_bps=2.0)
    error = _fails(
        lambda: _client(server, cache, stall_timeout=STALL_S).slices.get(SLC),
        TransportError,
        names_server=server.url,
        within_s=4 * STALL_S,
    )  # generous: a loaded CI machine
    assert "incomplete" in str(error)


def test_endless_error_bodies_are_cut(server: HostileServer, cache: Path) -> None:
    server.answers[f"/v1/slices/{SLC}"] = Answer(
        404, b'{"error": "not_found", "message": "', endless=True
    )
    _fails(lambda: _client(server, cache).slices.get(SLC), NotFoundError, names_server=server.url)
    server.answers[f"/v1/slices/{SLC}"] = Answer(500, b"x", endless=True)
    _fails(
        lambda: _client(server, cache, attempts=2).slices.get(SLC),
        TransportError,
        names_server=server.url,
    )


# -- what the server says is shown safely -------------------------------------------------
def test_error_messages_are_escaped_and_capped(server: HostileServer, cache: Path) -> None:
    server.answers[f"/v1/slices/{SLC}"] = Answer.json(
        {"error": "forbidden", "message": ANSI + "go away"}, 403
    )
    error = _fails(lambda: _client(server, cache).slices.get(SLC), AccessDeniedError)
    assert "\\x1b[2J" in str(error) and "go away" in str(error)
    server.answers[f"/v1/slices/{SLC}"] = Answer.json(
        {"error": "forbidden", "message": "x" * 50_000}, 403
    )
    error = _fails(lambda: _client(server, cache).slices.get(SLC), AccessDeniedError)
    assert "more characters]" in str(error) and len(str(error)) < 1000
    # 5 MB: read up to the error-body cap only, so not even JSON any more: no message at all.
    server.answers[f"/v1/slices/{SLC}"] = Answer.json(
        {"error": "forbidden", "message": "x" * 5_000_000}, 403
    )
    error = _fails(lambda: _client(server, cache).slices.get(SLC), AccessDeniedError)
    assert len(str(error)) < 1000


LISTINGS = {
    "ids-are-numbers": {"slices": [{"id": 1, "manifest": 2, "description": 3}]},
    "entries-are-strings": {"slices": ["slc_00000000"]},
    "slices-an-object": {"slices": {"a": 1}},
    "a-list": [1, 2, 3],
    "id-with-escape-codes": {
        "slices": [{"id": "slc_00000000" + ANSI, "manifest": H, "description": ""}]
    },
    "description-lone-surrogate": {
        "slices": [{"id": "slc_00000000", "manifest": H, "description": "evil \ud800"}]
    },
    "denser-than-any-document": b'{"slices":[' + b"{}," * 100_000 + b"{}]}",
}


@pytest.mark.parametrize("case", sorted(LISTINGS))
def test_crafted_listing(case: str, server: HostileServer, cache: Path) -> None:
    server.answers["/v1/slices"] = Answer.json(LISTINGS[case])
    _fails(lambda: _client(server, cache).slices.list(), ProtocolError, names_server=server.url)


def test_pages_not_started_are_not_fetched_after_one_failed(
    demo: Demo, server: HostileServer, cache: Path
) -> None:
    # 64 pages, every one trickled: the first page past the stall bound ends the open; the
    # pages queued behind the 8 in flight are never requested.
    n = demo.root["summary"]["segments"]
    pages = [{"hash": f"{i:064x}", "size": 1000, "segments": n if i == 0 else 0} for i in range(64)]
    crafted_slice(server, SLC, canonical_json({**demo.root, "pages": pages}))
    for p in pages:
        server.answers[f"/v1/slices/{SLC}/pages/{p['hash']}"] = Answer(
            200, b"x" * 1000, trickle_bps=4.0
        )
    _fails(
        lambda: _client(server, cache, stall_timeout=STALL_S).slices.get(SLC),
        TransportError,
        within_s=6 * STALL_S,  # generous: a loaded CI machine (all 64 took about 8 bounds)
    )
    assert sum("/pages/" in path for path in server.requests) < 24


def test_times_spanning_more_than_int64_are_a_manifest_error(
    demo: Demo, server: HostileServer, cache: Path
) -> None:
    def extreme(m: dict[str, Any]) -> None:
        for seg in m["segments"]:
            for stream in seg["streams"].values():
                stream.update(t0_ns=-(2**62), t1_ns=2**62)

    _crafted(server, SLC, _v1(demo, extreme))
    slice_ = _client(server, cache).slices.get(SLC)  # in range one by one: a valid manifest
    _fails(
        lambda: EpisodeDataset(slice_, obs=["joints/position"], action=None, fps=10), ManifestError
    )


# -- blobs ---------------------------------------------------------------------------------
def _garbage_video(demo: Demo, server: HostileServer) -> str:
    garbage = b"this is not a video, but it matches its hash" * 100
    digest = hash_bytes(garbage)

    def swap(m: dict[str, Any]) -> None:
        for seg in m["segments"]:
            seg["streams"]["cam0/rgb"]["blob"] = {"hash": digest, "size": len(garbage)}

    _crafted(server, SLC, _v1(demo, swap))
    server.answers[f"/v1/slices/{SLC}/blobs/{digest}"] = Answer(200, garbage)
    return digest


def test_undecodable_video_with_matching_hash(
    demo: Demo, server: HostileServer, cache: Path
) -> None:
    digest = _garbage_video(demo, server)
    ds = EpisodeDataset(
        _client(server, cache).slices.get(SLC),
        obs=["cam0/rgb"],
        action="joints/position_delta",
        fps=15,
        horizon=4,
    )
    error = _fails(lambda: ds[0], IntegrityError)
    assert digest in str(error) and "cam0/rgb" in str(error)


def _swap_blob(demo: Demo, server: HostileServer, stream: str, key: str, data: bytes) -> None:
    """Serve a slice whose ``stream`` has ``key`` (``blob``/``timestamps``) = ``data`` everywhere."""

    def swap(m: dict[str, Any]) -> None:
        for seg in m["segments"]:
            seg["streams"][stream][key] = {"hash": hash_bytes(data), "size": len(data)}

    _crafted(server, SLC, _v1(demo, swap))
    server.answers[f"/v1/slices/{SLC}/blobs/{hash_bytes(data)}"] = Answer(200, data)


def test_table_unlike_its_manifest(demo: Demo, server: HostileServer, cache: Path) -> None:
    t0 = _seg(demo.v1)["streams"]["joints/position"]["t0_ns"]
    narrow = encode_table(
        t0 + np.arange(400, dtype=np.int64) * 5_000_000, np.zeros((400, 3), np.float32)
    )
    _swap_blob(demo, server, "joints/position", "blob", narrow)
    ds = EpisodeDataset(
        _client(server, cache).slices.get(SLC),
        obs=["joints/position"],
        action="joints/position_delta",
        fps=15,
        horizon=4,
    )
    error = _fails(lambda: ds[0], IntegrityError)
    assert hash_bytes(narrow) in str(error) and "joints/position" in str(error)


def test_more_timestamps_than_frames(demo: Demo, server: HostileServer, cache: Path) -> None:
    t0 = _cam(demo.v1)["t0_ns"]
    many = encode_timestamps(t0 + np.arange(10_000, dtype=np.int64) * 1000)
    _swap_blob(demo, server, "cam0/rgb", "timestamps", many)
    ds = EpisodeDataset(
        _client(server, cache).slices.get(SLC),
        obs=["cam0/rgb"],
        action="joints/position_delta",
        fps=15,
        horizon=4,
    )
    error = _fails(lambda: ds[len(ds) - 1], IntegrityError)
    assert "cam0/rgb" in str(error)


def test_blob_with_content_encoding(demo: Demo, server: HostileServer, cache: Path) -> None:
    digest = _garbage_video(demo, server)
    server.answers[f"/v1/slices/{SLC}/blobs/{digest}"] = Answer(
        200, gzip_bomb(2**20), {"Content-Encoding": "gzip"}
    )
    _fails(
        lambda: _client(server, cache).pull(SLC, streams=["cam0/rgb"]),
        ProtocolError,
        names_server=server.url,
    )
    assert not list(cache.rglob(digest))


def test_redirect_to_an_invalid_url(demo: Demo, server: HostileServer, cache: Path) -> None:
    digest = _garbage_video(demo, server)
    # httpx refuses the Location header itself (a protocol error on the connection): retried.
    server.answers[f"/v1/slices/{SLC}/blobs/{digest}"] = Answer(
        307, headers={"Location": "http://[::1\x1b[31m"}
    )
    _fails(
        lambda: _client(server, cache, attempts=2).pull(SLC, streams=["cam0/rgb"]),
        TransportError,
        names_server=server.url,
    )


# -- the command line, in a subprocess ----------------------------------------------------
def _rayform(server: HostileServer, cache: Path, *args: str) -> subprocess.CompletedProcess[str]:
    checkout = [str(TESTS.parent / "sdk"), str(TESTS.parent / "server_stub")]
    env = {
        **os.environ,
        "RAYFORM_ENDPOINT": server.url,
        "RAYFORM_TOKEN": TOKEN,
        "RAYFORM_CACHE_DIR": str(cache),
        "PYTHONPATH": os.pathsep.join([*checkout, os.environ.get("PYTHONPATH", "")]).rstrip(
            os.pathsep
        ),
    }
    done = subprocess.run(
        [sys.executable, "-m", "rayform", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    for stream in (done.stdout, done.stderr):
        assert not has_control(stream), repr(stream[:300])
        assert all(len(line) < 5000 for line in stream.splitlines())
        assert "Traceback" not in stream and TOKEN not in stream
    return done


def test_cli_prints_no_escape_codes(demo: Demo, server: HostileServer, cache: Path) -> None:
    server.answers[f"/v1/slices/{SLC}"] = Answer.json(
        {"error": "forbidden", "message": ANSI * 1000}, 403
    )
    denied = _rayform(server, cache, "slices", "show", SLC)
    assert denied.returncode == 1 and "access denied" in denied.stderr

    server.answers["/v1/slices"] = Answer.json(
        {"slices": [{"id": 1, "manifest": [], "description": None}]}
    )
    listing = _rayform(server, cache, "slices", "ls")
    assert listing.returncode == 1 and "rayform: error:" in listing.stderr

    other = "slc_00c0ffee"
    doc = _v1(demo, lambda m: [seg.update(site=ANSI) for seg in m["segments"]])
    _crafted(server, other, doc, description=ANSI + "x" * 10_000)
    server.answers["/v1/slices"] = Answer.json(
        {
            "slices": [
                {
                    "id": other,
                    "manifest": hash_bytes(canonical_json(doc)),
                    "description": ANSI + "x" * 10_000,
                }
            ]
        }
    )
    shown = _rayform(server, cache, "slices", "show", other)
    assert shown.returncode == 0 and "\\x1b[2J" in shown.stdout
    listed = _rayform(server, cache, "slices", "ls")
    assert listed.returncode == 0 and "more characters]" in listed.stdout


def test_cli_json_is_capped_like_the_rest(demo: Demo, server: HostileServer, cache: Path) -> None:
    # --json printed a server's description whole: a megabyte in one line.
    other = "slc_00c0ffee"
    doc = _crafted(server, other, demo.v1, description=ANSI + "y" * 50_000)
    server.answers["/v1/slices"] = Answer.json(
        {"slices": [{"id": other, "manifest": hash_bytes(doc), "description": "x" * 2**20}]}
    )
    listed = _rayform(server, cache, "slices", "ls", "--json")
    assert listed.returncode == 0 and len(listed.stdout) < 10_000
    (entry,) = json.loads(listed.stdout)
    assert entry["description"].endswith(f"... [{2**20 - 4096} more characters]")
    assert entry["description"].startswith("x" * 4096)
    # The description remembered in the cache (from the slice's reference), listed offline.
    assert _rayform(server, cache, "slices", "show", other, "--json").returncode == 0
    offline = _rayform(server, cache, "slices", "ls", "--offline", "--json")
    assert offline.returncode == 0 and len(offline.stdout) < 10_000
    (entry,) = json.loads(offline.stdout)
    assert entry["description"].startswith(ANSI) and "more characters]" in entry["description"]


# The peak resident memory of the process (VmHWM: ru_maxrss would count the RSS of the pytest
# process this one was forked from).
MEASURE = str(SCRIPTS / "peak_memory.py")  # prints the error's type and the peak memory in MiB


@pytest.mark.parametrize(
    "case",
    [
        "endless-manifest-declared-64-MiB",
        "gzip-bomb-manifest",
        "endless-page",
        "24-MiB-of-empty-objects",
    ],
)
def test_peak_memory_stays_bounded(
    case: str, demo: Demo, server: HostileServer, cache: Path
) -> None:
    manifest = f"/v1/slices/{SLC}/manifest"
    expected = "ProtocolError"
    if case == "24-MiB-of-empty-objects":  # correctly hashed; as Python objects, gigabytes
        n = 8 * 2**20
        crafted_slice(
            server, SLC, b'{"format":"rayform.manifest","segments":[' + b"{}," * n + b"{}]}"
        )
        expected = "ManifestError"
    elif case == "endless-page":
        root, pages = _one_page(demo, demo.table)
        crafted_slice(server, SLC, root, pages={h: b"" for h in pages})
        server.answers.update(
            {f"/v1/slices/{SLC}/pages/{h}": Answer(200, b"", endless=True) for h in pages}
        )
    else:
        _crafted(server, SLC, demo.v1)
        server.answers[f"/v1/slices/{SLC}"] = Answer.json(
            {"manifest": H, "manifest_size": 64 * 2**20}
        )
        server.answers[manifest] = (
            Answer(200, b"", endless=True)
            if case.startswith("endless")
            else Answer(200, gzip_bomb(64 * 2**20), {"Content-Encoding": "gzip"})
        )
    checkout = os.pathsep.join(
        [str(TESTS.parent / "sdk"), os.environ.get("PYTHONPATH", "")]
    ).rstrip(os.pathsep)
    done = subprocess.run(
        [sys.executable, MEASURE, server.url, TOKEN, str(cache), SLC],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": checkout},
    )
    kind, peak_mib = done.stdout.split()
    assert kind == expected and int(peak_mib) < 300, (done.stdout, done.stderr[-2000:])
