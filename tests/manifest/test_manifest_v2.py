"""The manifest format's columnar pages: their hashes, sharing, offline use, fleet demos."""

from __future__ import annotations

import json
import os
import pickle
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from support import DEMO_SLICE, TOKEN, ServerProcess, forbid_network
from support.fakes import StoreBlobs

import rayform
from rayform import format as wire
from rayform.cli import main as cli_main
from rayform.errors import IntegrityError, OfflineError
from rayform.format import hash_bytes
from rayform.manifest import Manifest, manifest_hash, release_pages
from rayform.slice import Slice
from rayform.torch import EpisodeDataset
from rayform_server._fleet import build_shared_demo
from rayform_server.builder import commit_table
from rayform_server.store import Store

OBS = ["cam0/rgb", "joints/position"]
ACTION = "joints/position_delta"


def _v2(store: Store, slice_id: str = DEMO_SLICE) -> wire.ColumnarManifest:
    m = store.load_manifest(store.get_slice(slice_id)["manifest"])
    assert isinstance(m, wire.ColumnarManifest)
    return m


def _samples(ds: EpisodeDataset, indices: list[int]) -> list[dict]:
    return [ds[i] for i in indices]


def _assert_same(a: list[dict], b: list[dict]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        assert x["meta"] == y["meta"] and int(x["t_ns"]) == int(y["t_ns"])
        for key in (*OBS, "action", "action_is_pad"):
            assert np.array_equal(np.asarray(x[key]), np.asarray(y[key])), key


@pytest.fixture
def root(demo_root: Path, tmp_path: Path) -> Path:
    """A private copy of the small demo root (tests here add slices and tamper with pages)."""
    dest = tmp_path / "root"
    shutil.copytree(demo_root, dest)
    return dest


@pytest.fixture
def server(root: Path) -> Iterator[ServerProcess]:
    s = ServerProcess(root)
    yield s
    s.stop()


def test_pages_and_memory_round_trip(demo_root: Path) -> None:
    store = Store(demo_root)
    v2 = _v2(store)
    v1 = v2.to_v1()
    assert Manifest.from_json(json.loads(json.dumps(v1.to_json()))) == v1
    assert tuple(v2.segments) == v1.segments and len(v2.segments) == 4
    assert v2.blobs() == v1.blobs() and v2.blobs(["ee/pose"]) == v1.blobs(["ee/pose"])
    assert v2.stream_names() == v1.stream_names()
    # Writing the in-memory twin's segments again gives the same bytes, hence the same name.
    table = wire.segments_to_table(v1.segments)
    pages = wire.table_to_pages(table)
    assert hash_bytes(wire.build_root(table, pages, v1.description)) == v2.hash
    assert v2.summary["segments"] == 4 and v2.summary["nbytes"] == sum(
        b.size for b in v1.blobs().values()
    )
    assert manifest_hash(v1) == v2.hash and json.loads(v2.to_bytes())["format_version"] == 3
    # A pickled manifest reopens from its mapped pages (what a spawned worker receives).
    again = pickle.loads(pickle.dumps(v2))
    assert again == v2 and tuple(again.segments) == v1.segments


def test_mapped_slice_and_its_in_memory_twin_give_identical_samples(
    root: Path, tmp_path: Path
) -> None:
    store = Store(root)
    v2 = _v2(store)
    twin = v2.to_v1()
    assert store.put_manifest(twin) == v2.hash  # the same segments: the same manifest
    client = StoreBlobs(store, tmp_path)
    a = Slice(DEMO_SLICE, v2.hash, v2, client)
    b = Slice(DEMO_SLICE, manifest_hash(twin), twin, client)
    assert isinstance(b.manifest, Manifest)
    da = EpisodeDataset(a, obs=OBS, action=ACTION, fps=15, horizon=4)
    db = EpisodeDataset(b, obs=OBS, action=ACTION, fps=15, horizon=4)
    assert len(da) == len(db) > 0 and da.segment_lengths == db.segment_lengths
    assert np.array_equal(da._index.offsets, db._index.offsets)
    indices = list(range(0, len(da), 11)) + [len(da) - 1]
    _assert_same(_samples(da, indices), _samples(db, indices))
    # A spawned worker receives the pages' paths, not their bytes, and reads the same samples.
    pickled = pickle.dumps(da)
    page = v2.doc["pages"][0]
    assert page["size"] > 4000 and len(pickled) < page["size"]
    _assert_same(_samples(pickle.loads(pickled), indices[:3]), _samples(db, indices[:3]))
    assert repr(a).split(" manifest=")[1].split()[1:] == repr(b).split(" manifest=")[1].split()[1:]
    assert a._repr_html_().count("<tr>") == b._repr_html_().count("<tr>") == 6


def test_tampered_page_is_refused_by_hash(
    root: Path, server: ServerProcess, tmp_path: Path
) -> None:
    manifest = _v2(Store(root))
    page = manifest.doc["pages"][0]
    path = root / "manifests" / page["hash"][:2] / page["hash"]
    path.chmod(0o644)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size, other bytes
    path.write_bytes(bytes(data))
    cache = tmp_path / "cache-tampered"
    client = rayform.Client(server.url, TOKEN, cache_dir=cache)
    with pytest.raises(IntegrityError, match="do not match their hash"):
        client.slices.get(DEMO_SLICE)
    cached = (
        [p.name for p in (cache / "manifests").rglob("*") if p.is_file()]
        if (cache / "manifests").exists()
        else []
    )
    assert page["hash"] not in cached and manifest.hash not in cached  # nothing half-usable
    assert client.cache.get_ref(None, DEMO_SLICE) is None


def test_pages_download_in_parallel_and_versions_share_pages(
    root: Path, server: ServerProcess, tmp_path: Path
) -> None:
    store = Store(root)
    table = wire.segments_to_table(list(_v2(store).segments))
    import pyarrow as pa

    # 10 pages of 2 segments (40 rows by repetition under new IDs), then a version with 2 more.
    big = table.take(pa.array(np.arange(20) % 4))
    big = big.set_column(0, "id", pa.array([f"seg_{i:08x}" for i in range(20)]))
    first = commit_table(store, big, "v1 of a slice", page_rows=2)
    store.set_slice("slc_0000f001", first, "v1 of a slice")
    more = big.take(pa.array(np.r_[np.arange(20), 0, 1]))
    more = more.set_column(0, "id", pa.array([f"seg_{i:08x}" for i in range(22)]))
    second = commit_table(store, more, "v2 of a slice", page_rows=2)
    store.set_slice("slc_0000f002", second, "v2 of a slice")
    pages1 = [p["hash"] for p in _v2(store, "slc_0000f001").doc["pages"]]
    pages2 = [p["hash"] for p in _v2(store, "slc_0000f002").doc["pages"]]
    assert len(pages1) == 10 and len(pages2) == 11 and pages2[:10] == pages1

    client = rayform.Client(server.url, TOKEN, cache_dir=tmp_path / "c")
    s1 = client.slices.get("slc_0000f001")
    assert len(s1.segments) == 20 and s1.segment("seg_00000013").id == "seg_00000013"
    before = {
        p.name: p.stat().st_mtime_ns
        for p in (tmp_path / "c" / "manifests").rglob("*")
        if p.is_file()
    }
    s2 = client.slices.get("slc_0000f002")
    after = {
        p.name: p.stat().st_mtime_ns
        for p in (tmp_path / "c" / "manifests").rglob("*")
        if p.is_file()
    }
    # Only the new page and the new root were fetched; the shared pages were not rewritten.
    assert set(after) - set(before) == {pages2[-1], s2.manifest_hash}
    assert all(after[h] == before[h] for h in pages1)
    assert [s.id for s in s2.segments[20:]] == ["seg_00000014", "seg_00000015"]


def test_offline_open_of_a_resolved_v2_slice(
    client_env: ServerProcess, isolated_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    online = rayform.Client().slices.get(DEMO_SLICE)
    assert isinstance(online.manifest, wire.ColumnarManifest)
    forbid_network(monkeypatch)
    offline = rayform.Client(offline=True).slices.get(DEMO_SLICE)
    assert offline.manifest_hash == online.manifest_hash
    assert tuple(offline.segments) == tuple(online.segments) and offline.streams == online.streams
    ds = EpisodeDataset(offline, obs=["joints/position"], action=ACTION, fps=15)
    assert len(ds) == len(EpisodeDataset(online, obs=["joints/position"], action=ACTION, fps=15))
    # A missing page offline is a clear error naming the command that fixes it.
    page = offline.manifest.doc["pages"][0]["hash"]
    path = isolated_env / "manifests" / page[:2] / page
    os.unlink(path)
    with pytest.raises(OfflineError, match=f"rayform pull {DEMO_SLICE}"):
        rayform.Client(offline=True).slices.get(DEMO_SLICE)


def test_shared_blob_demo_and_big_slice_show(
    tmp_path: Path,
    demo_root: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    root = tmp_path / "fleet"
    digest = build_shared_demo(root, DEMO_SLICE, 1000, small=True, seed=0)
    store = Store(root)
    m = _v2(store)
    assert m.hash == digest and len(m.segments) == 1000 and m.summary["segments"] == 1000
    ids = m.segments.ids().to_pylist()
    assert len(set(ids)) == 1000
    demo = _v2(Store(demo_root))
    assert ids[:4] == [s.id for s in demo.segments]  # the pool is the ordinary demo
    assert m.blobs() == demo.blobs()  # 1000 segments, the demo's 28 blobs
    assert m.segments[5].streams == demo.segments[1].streams
    assert sorted(p.name for p in (root / "blobs").rglob("*") if p.is_file()) == sorted(
        demo.blobs()
    )
    assert list(store.list_slices()) == [DEMO_SLICE]  # the pool's scratch slice is gone

    server = ServerProcess(root)
    monkeypatch.setenv("RAYFORM_ENDPOINT", server.url)
    monkeypatch.setenv("RAYFORM_TOKEN", TOKEN)
    try:
        assert cli_main(["slices", "show", DEMO_SLICE]) == 0
        out = capsys.readouterr().out
        assert "segments=1000" in out and "1000 segments; list them with" in out
        assert "stream cam0/rgb: video 30 Hz" in out and "seg_" not in out
        assert cli_main(["slices", "show", DEMO_SLICE, "--segments"]) == 0
        listed = [
            line for line in capsys.readouterr().out.splitlines() if line.strip().startswith("seg_")
        ]
        assert len(listed) == 1000
    finally:
        server.stop()


def test_import_rayform_does_not_import_pyarrow() -> None:
    code = "import sys, rayform; rayform.Client; print('pyarrow' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def _mapped_kib(paths: set[str]) -> int:
    """KiB of this process's resident memory mapped from ``paths`` (from /proc/self/smaps)."""
    total, current = 0, ""
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()
            if head and "-" in head[0] and not head[0].endswith(":"):
                current = head[5] if len(head) > 5 else ""
            elif head and head[0] == "Rss:" and current in paths:
                total += int(head[1])
    return total


def test_touched_manifest_pages_are_given_back(tmp_path: Path) -> None:
    # Three pages (16,384 segments each): rows spread over all of them.
    root = tmp_path / "fleet"
    build_shared_demo(root, DEMO_SLICE, 40_000, small=True, seed=0)
    m = _v2(Store(root))
    pages = {str(Path(p).resolve()) for p in m._page_paths}
    assert len(pages) == 3
    assert _mapped_kib(pages) == 0  # opening read every ID, then unmapped them
    table = m.segments
    present, t0 = table.stream_field("joints/position", "t0_ns")
    assert present.all() and _mapped_kib(pages) > 0  # a column read maps its buffers...
    release_pages(table)
    assert _mapped_kib(pages) == 0  # ...until given back
    pool = [table[i] for i in range(4)]
    rng = np.random.default_rng(0)
    for i in rng.integers(0, len(table), 200).tolist():
        seg = table[int(i)]
        # Still right after the unmaps: the pages are mapped again from the page cache.
        assert (
            seg.streams == pool[int(i) % 4].streams
            and seg.streams["joints/position"].t0_ns == t0[i]
        )
        assert _mapped_kib(pages) == 0, "a row's page stayed mapped after the Segment was built"


def test_rows_read_from_column_views_equal_pyarrows(tmp_path: Path, demo_root: Path) -> None:
    from rayform.manifest._columnar import page_schema
    from rayform.manifest._pagerows import PageRows

    build_shared_demo(tmp_path / "fleet", DEMO_SLICE, 20_000, small=True, seed=0)
    for store in (Store(tmp_path / "fleet"), Store(demo_root)):
        columns = _v2(store).segments._c
        rng = np.random.default_rng(1)
        for i in [0, columns.n - 1, *rng.integers(0, columns.n, 300).tolist()]:
            p = int(np.searchsorted(columns._page_start, i, side="right")) - 1
            want = columns.pages[p].slice(i - int(columns._page_start[p]), 1).to_pylist()[0]
            got = columns.row(int(i))
            assert got == want and list(got) == list(want)
            assert [list(s) for s in got["streams"]] == [list(s) for s in want["streams"]]
        assert all(v is not None for v in columns._fast.values()) and columns._fast
    # A table of another layout (plain strings) is read by pyarrow.
    plain = wire.segments_to_table(list(_v2(Store(demo_root)).segments)).cast(
        page_schema(plain=True)
    )
    assert PageRows.of(plain) is None
