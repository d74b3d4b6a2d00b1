"""Notebook and text reprs: segments (v1 and v2 alike), one segment, a pull report, sizes."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from fakes import StoreBlobs
from helpers import DEMO_SLICE

import rayform
from rayform import format as wire
from rayform._pull import PullReport
from rayform.manifest import Segment
from rayform.slice import Slice
from rayform_server.store import Store

_UTC = re.compile(r"20\d\d-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} UTC")


@pytest.fixture
def slices(demo_root: Path, tmp_path: Path) -> tuple[Slice, Slice]:
    """The demo slice as its version 2 manifest and as the version 1 twin of it."""
    store = Store(demo_root)
    v2 = store.load_manifest(store.get_slice(DEMO_SLICE)["manifest"])
    assert isinstance(v2, wire.ColumnarManifest)
    v1 = v2.to_v1()
    client = StoreBlobs(store, tmp_path)
    return Slice(DEMO_SLICE, v2.hash, v2, client), Slice(DEMO_SLICE, v1.hash, v1, client)


def test_segments_of_both_versions_have_the_same_reprs_and_columns(slices: tuple[Slice, Slice]) -> None:
    v2, v1 = slices
    ids = [s.id for s in v1.segments]
    for s in (v2, v1):
        text = repr(s.segments)
        assert text.endswith(f"4 segments [{', '.join(ids)}]>") and " at 0x" not in text
        assert repr(s.segments[1:3]).endswith(f"2 segments [{ids[1]}, {ids[2]}]>")
        page = s.segments._repr_html_()
        assert page.count("<tr>") == 5 and all(i in page for i in ids) and "lab-zurich" in page
        assert len(_UTC.findall(page)) == 4 and "4 rows" in page
        table = s.segments.to_arrow()
        assert table.column_names == ["id", "version", "site", "start", "end", "duration_s", "nbytes", "streams"]
        assert table.column("id").to_pylist() == ids
        assert table.column("nbytes").to_pylist() == [seg.nbytes for seg in v1.segments]
        assert table.column("streams").to_pylist() == [sorted(seg.streams) for seg in v1.segments]
        assert table.column("start").type.tz == "UTC"
    assert v2.segments.to_arrow().equals(v1.segments.to_arrow())
    # A reordered selection keeps its own order in every column.
    for s in (v2, v1):
        view = s.select(segments=[ids[3], ids[0]])
        assert view.segments.to_arrow().column("id").to_pylist() == [ids[0], ids[3]]
        assert s.segments[::-1].to_arrow().column("streams").to_pylist()[0] == sorted(v1.segments[3].streams)


def test_v1_segments_still_behave_as_the_tuple(slices: tuple[Slice, Slice]) -> None:
    _, v1 = slices
    plain = v1.manifest.segments
    assert isinstance(plain, tuple) and v1.segments == plain and plain == v1.segments
    assert len(v1.segments) == 4 and list(v1.segments) == list(plain) and v1.segments[-1] is plain[-1]
    assert plain[0] in v1.segments and v1.segments.index(plain[2]) == 2
    assert tuple(v1.segments[1:]) == plain[1:]
    with pytest.raises(IndexError):
        v1.segments[4]


def test_paged_html_of_many_segments_points_at_the_next_page(slices: tuple[Slice, Slice]) -> None:
    _, v1 = slices
    many = type(v1.segments)(
        Segment(f"seg_{i:04d}", 1, "<site>", 10**18 + i * 10**9, 10**18 + i * 10**9 + 5 * 10**8, {})
        for i in range(45)
    )
    page = many._repr_html_()
    assert page.count("<tr>") == 21 and "rows 1-20 of 45" in page and "segments[20:40]" in page
    assert "<site>" not in page and "&lt;site&gt;" in page  # everything escaped
    assert "seg_0044" in repr(many) and "..." in repr(many) and "45 segments" in repr(many)


def test_to_pandas(slices: tuple[Slice, Slice]) -> None:
    pandas = pytest.importorskip("pandas")
    frame = slices[0].segments.to_pandas()
    assert isinstance(frame, pandas.DataFrame) and list(frame["id"]) == [s.id for s in slices[1].segments]


def test_a_segment_reads_short(slices: tuple[Slice, Slice]) -> None:
    seg = slices[0].segments[0]
    text = repr(seg)
    assert len(text) < 250 and "Stream(" not in text and "None" not in text
    assert seg.id in text and _UTC.search(text) and "KiB" in text and "duration=1.99s" in text
    page = seg._repr_html_()
    assert page.count("<tr>") == 6 + 1 + len(seg.streams)  # facts, stream header, one per stream
    assert "cam0/rgb" in page and "KiB" in page and len(_UTC.findall(page)) == 2 and "None" not in page


def test_sizes_everywhere_are_binary(slices: tuple[Slice, Slice]) -> None:
    assert PullReport("slc_x", 1, 3 << 20, 1, 3 << 20, 0, 0, 2.0).summary().count("MiB") == 3
    assert "MiB" in repr(slices[0]) or "KiB" in repr(slices[0])
