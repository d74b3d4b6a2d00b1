"""Renditions in the manifest's pages (format version 3). Round trip and checks, an empty
renditions list where there are none, served, pulled and read at a training resolution,
tampering refused, dataset URIs rebuilt, workers rendering renditions."""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from support import DEMO_SLICE, ServerProcess, forbid_network, make_client
from support.fakes import StoreBlobs

from rayform import format as wire
from rayform.errors import IntegrityError, ManifestError
from rayform.format import hash_bytes
from rayform.manifest import Manifest, Rendition, Segment
from rayform.slice import Slice
from rayform.torch import EpisodeDataset
from rayform_server.demo import build_demo
from rayform_server.store import Store

CAMS = ["cam0/rgb", "wrist/rgb"]
OBS = [*CAMS, "joints/position"]
ACTION = "joints/position_delta"
KEYS = [0, 9, 31, 20, 57, 3]


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("v3") / "root"
    build_demo(path, DEMO_SLICE, small=True, renditions=(48,))
    return path


@pytest.fixture(scope="module")
def v3(root: Path) -> wire.ColumnarManifest:
    store = Store(root)
    m = store.load_manifest(store.get_slice(DEMO_SLICE)["manifest"])  # type: ignore[index]
    assert isinstance(m, wire.ColumnarManifest)
    return m


@pytest.fixture(scope="module")
def server(root: Path) -> Iterator[ServerProcess]:
    s = ServerProcess(root)
    yield s
    s.stop()


def _write(segments: list[Segment], description: str = "") -> tuple[bytes, list[bytes]]:
    table = wire.segments_to_table(segments)
    pages = wire.table_to_pages(table)
    return wire.build_root(table, pages, description), pages


def _open(root: bytes, pages: list[bytes], tmp: Path) -> object:
    paths = []
    for page in pages:
        p = tmp / hash_bytes(page)
        p.write_bytes(page)
        paths.append(p)
    return wire.load_manifest(root, hash_bytes(root), lambda refs: paths)


def _with_rendition(seg: Segment, name: str, **change: object) -> Segment:
    st = seg.streams[name]
    r = st.renditions[0] if st.renditions else Rendition(st.blob, 2, 2)
    st = dataclasses.replace(st, renditions=(dataclasses.replace(r, **change),))
    return dataclasses.replace(seg, streams={**seg.streams, name: st})


# -- the format ----------------------------------------------------------------------------------
def test_version_3_round_trips_and_lists_every_rendition(
    v3: wire.ColumnarManifest, tmp_path: Path
) -> None:
    assert v3.format_version == 3 and json.loads(v3.to_bytes())["format_version"] == 3
    segments = list(v3.segments)
    for seg in segments:
        for name in CAMS:
            assert [(r.height, r.width) for r in seg.streams[name].renditions] == [(48, 64)]
        assert not seg.streams["joints/position"].renditions
    root, pages = _write(segments, v3.description)
    assert root == v3.to_bytes()  # the same segments give the same bytes, hence the same name
    again = _open(root, pages, tmp_path)
    assert tuple(again.segments) == tuple(segments)  # type: ignore[attr-defined]
    # The in-memory twin lists the same renditions; blobs() are the originals in both.
    v1 = v3.to_v1()
    assert Manifest.from_json(json.loads(json.dumps(v1.to_json()))).segments == tuple(segments)
    assert v3.blobs() == v1.blobs()
    expected = {r.blob.hash for seg in segments for n in CAMS for r in seg.streams[n].renditions}
    assert (
        set(v3.rendition_blobs()) == expected
        and set(v3.rendition_blobs(["joints/position"])) == set()
    )
    assert set(v3.segments[1:2].rendition_blobs(["cam0/rgb"])) == {
        segments[1].streams["cam0/rgb"].renditions[0].blob.hash
    }


def test_without_renditions_every_stream_row_lists_none(demo_root: Path) -> None:
    store = Store(demo_root)
    plain = store.load_manifest(store.get_slice(DEMO_SLICE)["manifest"])  # type: ignore[index]
    assert isinstance(plain, wire.ColumnarManifest) and plain.format_version == 3
    table = wire.segments_to_table(list(plain.segments))
    assert "renditions" in str(table.schema)  # one schema, whether or not a stream has any
    lists = table.column("streams").combine_chunks().values.field("renditions")
    assert len(lists) > 0 and lists.null_count == 0 and len(lists.values) == 0
    root = wire.build_root(table, wire.table_to_pages(table), plain.description)
    assert root == plain.to_bytes() and plain.rendition_blobs() == {}
    assert not plain.segments.has_renditions and json.loads(root)["format_version"] == 3


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"width": 63}, "odd"),
        ({"height": 96}, "smaller than the original"),
        ({"blob": None}, "video stream only"),
    ],
)
def test_a_page_breaking_the_rendition_rules_is_refused(
    v3: wire.ColumnarManifest, tmp_path: Path, change: dict, match: str
) -> None:
    segments = list(v3.segments)
    if change.get("blob", 0) is None:  # a rendition on a table stream
        bad = _with_rendition(segments[0], "joints/position", height=2, width=2)
    else:
        bad = _with_rendition(segments[0], "cam0/rgb", **change)
    root, pages = _write([bad, *segments[1:]])
    with pytest.raises(ManifestError, match=match):
        m = _open(root, pages, tmp_path)
        list(m.segments)  # type: ignore[attr-defined]  # per-row rules are checked as rows are read


def test_a_newer_format_version_asks_for_an_upgrade(v3: wire.ColumnarManifest) -> None:
    doc = json.loads(v3.to_bytes())
    doc["format_version"] = 4
    data = wire.canonical_json(doc)
    with pytest.raises(ManifestError, match="Upgrade rayform"):
        wire.load_manifest(data, hash_bytes(data), lambda refs: [])
    # An older version names the command that rewrites it, also before any page.
    for old in (1, 2):
        data = wire.canonical_json({**doc, "format_version": old})
        with pytest.raises(ManifestError, match="rayform-server migrate ROOT"):
            wire.load_manifest(data, hash_bytes(data), lambda refs: [])


# -- reading it ----------------------------------------------------------------------------------
def test_a_dataset_reads_only_the_chosen_renditions(root: Path, v3: wire.ColumnarManifest) -> None:
    blobs = StoreBlobs(Store(root))
    ds = EpisodeDataset(
        Slice(DEMO_SLICE, v3.hash, v3, blobs),
        obs=OBS,
        action=ACTION,
        fps=15,
        horizon=4,
        shard=None,
        image_size=(32, 32),
    )
    assert ds[KEYS[0]]["cam0/rgb"].shape == (3, 32, 32)
    for i in KEYS:
        ds[i]
    originals = {seg.streams[c].blob.hash for seg in v3.segments for c in CAMS}
    assert blobs.asked & set(v3.rendition_blobs()) and not blobs.asked & originals
    assert ds.describe()["renditions"] == {"cam0/rgb": "48x64", "wrist/rgb": "48x64"}


def test_served_pulled_at_a_resolution_and_rebuilt_from_its_uri(
    server: ServerProcess,
    v3: wire.ColumnarManifest,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    client = make_client(server.url, tmp_path / "cache")
    slice_ = client.slices.get(DEMO_SLICE)
    assert slice_.manifest.format_version == 3
    report = client.pull(DEMO_SLICE, image_size=(32, 32), resize="pad")
    originals = {seg.streams[c].blob.hash for seg in v3.segments for c in CAMS}
    # The slice's size summary follows the same choice.
    assert report.bytes == slice_.stream_nbytes(image_size=(32, 32)) < slice_.nbytes
    chosen = slice_.blobs(CAMS, image_size=(32, 32), resize="squash")
    assert set(v3.rendition_blobs()) <= set(chosen) and not originals & set(chosen)
    assert (
        set(slice_.blobs(CAMS, image_size=(64, 64), resize="crop")) >= originals
    )  # nothing covers it
    assert all(client.cache.has_blob(h) for h in v3.rendition_blobs())
    assert not any(client.cache.has_blob(h) for h in originals)
    ds = EpisodeDataset(
        slice_, obs=OBS, action=ACTION, fps=15, horizon=4, shard=None, image_size=(32, 32)
    )
    again = EpisodeDataset.from_uri(ds.uri, client=client)
    for i in KEYS:
        a, b = ds[i], again[i]
        assert all(torch.equal(a[k], b[k]) for k in (*OBS, "action"))
    offline = make_client(server.url, tmp_path / "cache", offline=True)
    forbid_network(monkeypatch)
    again = EpisodeDataset.from_uri(ds.uri, client=offline)
    assert torch.equal(again[KEYS[1]]["wrist/rgb"], ds[KEYS[1]]["wrist/rgb"])


def test_a_tampered_rendition_is_refused(
    root: Path, v3: wire.ColumnarManifest, tmp_path: Path
) -> None:
    copy = tmp_path / "root"
    shutil.copytree(root, copy)
    ref = v3.segments[0].streams["cam0/rgb"].renditions[0].blob
    path = Store(copy).blob_path(ref.hash)
    path.chmod(0o644)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    server = ServerProcess(copy)
    try:
        client = make_client(server.url, tmp_path / "cache")
        with pytest.raises(IntegrityError):
            client.pull(DEMO_SLICE, image_size=(32, 32))
        assert not client.cache.has_blob(ref.hash)
    finally:
        server.stop()


# -- workers render renditions -------------------------------------------------------------------
def test_staged_demo_workers_render_renditions(v3: wire.ColumnarManifest, tmp_path: Path) -> None:
    root = tmp_path / "root"
    run = [sys.executable, "-m", "rayform_server"]
    for shard in ("0/2", "1/2"):
        subprocess.run(
            [
                *run,
                "demo",
                "--root",
                str(root),
                "--small",
                "--renditions",
                "48",
                "--stage",
                "b",
                "--shard",
                shard,
            ],
            check=True,
            capture_output=True,
            timeout=300,
        )
    subprocess.run(
        [
            *run,
            "commit",
            "--root",
            str(root),
            "--stage",
            "b",
            "--slice",
            DEMO_SLICE,
            "--description",
            v3.description,
        ],
        check=True,
        capture_output=True,
        timeout=120,
    )
    assert Store(root).get_slice(DEMO_SLICE)["manifest"] == v3.hash  # type: ignore[index]


def test_rows_of_version_3_pages_read_from_column_views_equal_pyarrows(
    v3: wire.ColumnarManifest, tmp_path: Path
) -> None:
    table = wire.segments_to_table(list(v3.segments))
    pages = wire.table_to_pages(
        table, 3
    )  # two pages: rows past the first of a page, and a second page
    m = _open(wire.build_root(table, pages, v3.description, 3), pages, tmp_path)
    columns = m.segments._c  # type: ignore[attr-defined]
    for i in range(columns.n):
        p = int(np.searchsorted(columns._page_start, i, side="right")) - 1
        want = columns.pages[p].slice(i - int(columns._page_start[p]), 1).to_pylist()[0]
        got = columns.row(i)
        assert got == want and [list(s) for s in got["streams"]] == [
            list(s) for s in want["streams"]
        ]
    assert len(columns._fast) == 2 and all(v is not None for v in columns._fast.values())
    assert tuple(m.segments) == tuple(v3.segments)  # type: ignore[attr-defined]


def test_a_shared_blob_demo_lists_the_pools_renditions(
    v3: wire.ColumnarManifest, tmp_path: Path
) -> None:
    from rayform_server._fleet import build_shared_demo

    root = tmp_path / "fleet"
    digest = build_shared_demo(root, DEMO_SLICE, 10, small=True, renditions=(48,))
    m = Store(root).load_manifest(digest)
    assert isinstance(m, wire.ColumnarManifest) and m.format_version == 3 and len(m.segments) == 10
    assert set(m.rendition_blobs()) == set(v3.rendition_blobs())  # the pool's, shared
    assert (
        m.segments[9].streams["cam0/rgb"].renditions
        == v3.segments[1].streams["cam0/rgb"].renditions
    )
    assert [p.name for p in (root / "history").iterdir()] == [
        DEMO_SLICE
    ]  # the pool's scratch slice is gone
