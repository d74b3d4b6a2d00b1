"""Store and SliceBuilder basics: idempotent, atomic, content-addressed, strict on bad input."""

from __future__ import annotations

import stat
from pathlib import Path

import numpy as np
import pytest

from rayform.errors import InvalidArgumentError
from rayform.format import decode_table, decode_timestamps, hash_bytes, hash_file
from rayform.manifest import ColumnarManifest
from rayform_server.builder import SliceBuilder, TableData, VideoData
from rayform_server.store import Store

T = np.arange(20, dtype=np.int64) * 10_000_000  # 100 Hz, ns


def _table(name: str = "joints/position", **kw: object) -> TableData:
    values = kw.pop("values", np.linspace(0, 1, 20 * 3, dtype=np.float32).reshape(20, 3))
    return TableData(name, kw.pop("t_ns", T), values, 100.0, **kw)  # type: ignore[arg-type]


def _files(root: Path, sub: str) -> list[Path]:
    return sorted(p for p in (root / sub).rglob("*") if p.is_file())


def test_put_bytes_is_idempotent_and_read_only(tmp_path: Path) -> None:
    store = Store(tmp_path)
    a = store.put_bytes(b"hello blob")
    b = store.put_bytes(b"hello blob")
    assert a == b and a.hash == hash_bytes(b"hello blob") and a.size == 10
    assert _files(tmp_path, "blobs") == [store.blob_path(a.hash)]
    assert store.blob_path(a.hash).parent.name == a.hash[:2]
    assert not store.blob_path(a.hash).stat().st_mode & stat.S_IWUSR
    assert store.has_blob(a.hash) and not store.has_blob(hash_bytes(b"other"))
    assert list((tmp_path / "tmp").iterdir()) == []


def test_put_file_copies_or_moves_and_hashes(tmp_path: Path) -> None:
    store = Store(tmp_path / "root")
    src = tmp_path / "data.bin"
    src.write_bytes(bytes(range(256)) * 9000)  # > 1 MiB: several chunks
    ref = store.put_file(src)
    assert ref.hash == hash_file(src) and ref.size == src.stat().st_size and src.exists()
    assert store.put_file(src, move=True) == ref and not src.exists()
    assert hash_file(store.blob_path(ref.hash)) == ref.hash
    assert list((tmp_path / "root" / "tmp").iterdir()) == []


def test_commit_writes_manifest_and_slice_reference(tmp_path: Path) -> None:
    store = Store(tmp_path)
    b = SliceBuilder(store, description="unit test")
    seg = b.add_segment(
        "seg_00000001",
        site="lab-a",
        version=2,
        streams=[
            _table(units="rad"),
            _table(
                "ee/position", values=np.zeros((20, 3)), frame="ros", quantity="position", units="m"
            ),
        ],
    )
    assert (seg.start_ns, seg.end_ns) == (0, int(T[-1]))
    assert (
        _files(tmp_path, "manifests") == [] and list(store.list_slices()) == []
    )  # not before commit
    m = b.commit("slc_0000abcd")
    ref = store.get_slice("slc_0000abcd")
    assert ref == {"id": "slc_0000abcd", "manifest": m.hash, "description": "unit test"}
    assert hash_bytes(store.read_manifest_bytes(m.hash)) == m.hash
    loaded = store.load_manifest(m.hash)
    assert loaded == m and isinstance(loaded, ColumnarManifest) and loaded.format_version == 3
    assert tuple(loaded.segments) == tuple(b.segments)
    t, v = decode_table(store.blob_path(seg.streams["joints/position"].blob.hash).read_bytes())
    assert np.array_equal(t, T) and v.shape == (20, 3)
    assert list(store.list_slices()) == ["slc_0000abcd"]
    assert store.get_slice("slc_0000ffff") is None
    assert list((tmp_path / "tmp").iterdir()) == []
    # Re-committing the same content gives the same manifest (content addressing).
    b2 = SliceBuilder(store, description="unit test")
    b2.segments = list(b.segments)
    assert b2.commit("slc_0000abcd").hash == m.hash
    assert len(_files(tmp_path, "manifests")) == 2  # the root and its one page


def test_video_stream_stores_mp4_and_timestamps(tmp_path: Path) -> None:
    store = Store(tmp_path)
    frames = np.random.default_rng(0).integers(0, 255, size=(6, 32, 48, 3), dtype=np.uint8)
    t = np.array([0, 33, 67, 100, 166, 200], dtype=np.int64) * 1_000_000  # one dropped frame
    seg = SliceBuilder(store).add_segment(
        "seg_00000002", site="s", streams=[VideoData("cam0/rgb", frames, t, 30.0)]
    )
    s = seg.streams["cam0/rgb"]
    assert (s.kind, s.count, s.shape, s.codec) == ("video", 6, (32, 48, 3), "h264")
    assert store.blob_path(s.blob.hash).read_bytes()[4:8] == b"ftyp"
    assert np.array_equal(decode_timestamps(store.blob_path(s.timestamps.hash).read_bytes()), t)
    assert list((tmp_path / "tmp").iterdir()) == []


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"segment_id": "seg_XYZ"}, "segment ID"),
        ({"streams": []}, "no streams"),
        ({"streams": [_table(t_ns=T[::-1].copy())]}, "strictly increasing"),
        ({"streams": [_table(values=np.zeros((19, 3)))]}, "(N, D)"),
        ({"streams": [_table(), _table()]}, "given twice"),
        ({"streams": [_table("Cam 0")]}, "stream name"),
        ({"streams": [_table(quantity="pose")]}, "frame convention"),
        ({"streams": [_table(frame="enu")]}, "frame must be"),
        (
            {"streams": [VideoData("cam0/rgb", np.zeros((3, 8, 8, 3), np.uint8), T[:4], 30.0)]},
            "timestamps",
        ),
    ],
)
def test_builder_rejects_bad_input(tmp_path: Path, kwargs: dict, needle: str) -> None:
    store = Store(tmp_path)
    args = {"segment_id": "seg_00000003", "streams": [_table()], **kwargs}
    with pytest.raises(ValueError, match=None) as info:
        SliceBuilder(store).add_segment(args["segment_id"], site="s", streams=args["streams"])
    assert needle in str(info.value)
    assert list((tmp_path / "tmp").iterdir()) == []


def test_store_rejects_bad_ids_and_dangling_references(tmp_path: Path) -> None:
    store = Store(tmp_path)
    for bad in ("../../etc/passwd", "ab", "A" * 64, "slices/x"):
        with pytest.raises(InvalidArgumentError):
            store.blob_path(bad)
    with pytest.raises(InvalidArgumentError):
        store.slice_path("slc_../../x")
    with pytest.raises(FileNotFoundError):
        store.set_slice("slc_0000abcd", hash_bytes(b"no such manifest"))
    b = SliceBuilder(store)
    with pytest.raises(ValueError, match="at least one segment"):
        b.commit("slc_0000abcd")
    b.add_segment("seg_00000004", site="s", streams=[_table()])
    with pytest.raises(ValueError, match="already added"):
        b.add_segment("seg_00000004", site="s", streams=[_table()])
    with pytest.raises(InvalidArgumentError):
        b.commit("slice-1")
