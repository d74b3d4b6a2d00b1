"""Notebook and text reprs: segments (v1 and v2 alike), one segment, a pull report, sizes."""

from __future__ import annotations

import dataclasses
import html
import re
import sys
from pathlib import Path

import numpy as np
import pytest
from support import DEMO_SLICE
from support.fakes import StoreBlobs
from support.hostile import has_control

from rayform import DatasetURI
from rayform import format as wire
from rayform._net._progress import byte_bar
from rayform._net._pull import PullReport
from rayform.manifest import Manifest, Segment, manifest_hash
from rayform.slice import Slice
from rayform.torch import EpisodeDataset
from rayform_server.cli import main as server_cli
from rayform_server.store import Store

_UTC = re.compile(r"20\d\d-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} UTC")


@pytest.fixture
def slices(demo_root: Path, tmp_path: Path) -> tuple[Slice, Slice]:
    """The demo slice as its mapped manifest and as the in-memory twin of it."""
    store = Store(demo_root)
    v2 = store.load_manifest(store.get_slice(DEMO_SLICE)["manifest"])
    assert isinstance(v2, wire.ColumnarManifest)
    v1 = v2.to_v1()
    client = StoreBlobs(store, tmp_path)
    return Slice(DEMO_SLICE, v2.hash, v2, client), Slice(DEMO_SLICE, manifest_hash(v1), v1, client)


def test_segments_of_both_versions_have_the_same_reprs_and_columns(
    slices: tuple[Slice, Slice],
) -> None:
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
        assert table.column_names == [
            "id",
            "version",
            "site",
            "start",
            "end",
            "duration_s",
            "nbytes",
            "streams",
        ]
        assert table.column("id").to_pylist() == ids
        assert table.column("nbytes").to_pylist() == [seg.nbytes for seg in v1.segments]
        assert table.column("streams").to_pylist() == [sorted(seg.streams) for seg in v1.segments]
        assert table.column("start").type.tz == "UTC"
    assert v2.segments.to_arrow().equals(v1.segments.to_arrow())
    # A reordered selection keeps its own order in every column.
    for s in (v2, v1):
        view = s.select(segments=[ids[3], ids[0]])
        assert view.segments.to_arrow().column("id").to_pylist() == [ids[0], ids[3]]
        assert s.segments[::-1].to_arrow().column("streams").to_pylist()[0] == sorted(
            v1.segments[3].streams
        )


def test_v1_segments_still_behave_as_the_tuple(slices: tuple[Slice, Slice]) -> None:
    _, v1 = slices
    plain = v1.manifest.segments
    assert isinstance(plain, tuple) and v1.segments == plain and plain == v1.segments
    assert (
        len(v1.segments) == 4 and list(v1.segments) == list(plain) and v1.segments[-1] is plain[-1]
    )
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


def test_plain_text_reprs_escape_server_text_as_the_html_ones_do(
    slices: tuple[Slice, Slice],
) -> None:
    _, v1 = slices
    evil = "\x1b[2J\x1b]0;title\x07\r\n\u202e"
    # A site is free text of up to 256 characters; a description of up to the manifest's size.
    seg = dataclasses.replace(v1.segments[0], site=evil + "x" * 250)
    manifest = Manifest(segments=(seg,), description=evil * 10_000)
    for text in (repr(seg), str(seg), repr(manifest)):
        assert not has_control(text) and len(text) < 500, text
    assert "site=\\x1b[2J\\x1b]0;title\\x07\\x0d\\x0a\\u202exxx" in repr(seg)
    assert "more characters]" in repr(seg)
    assert repr(manifest) == "<Manifest segments=1>"
    assert html.escape(seg.site) in seg._repr_html_()


def test_to_pandas(slices: tuple[Slice, Slice]) -> None:
    pandas = pytest.importorskip("pandas")
    frame = slices[0].segments.to_pandas()
    assert isinstance(frame, pandas.DataFrame) and list(frame["id"]) == [
        s.id for s in slices[1].segments
    ]


def test_to_pandas_without_pandas_says_what_to_do(
    slices: tuple[Slice, Slice], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "pandas", None)  # what an import of a missing module meets
    with pytest.raises(ImportError, match=r"pip install pandas \(or use segments.to_arrow\(\)\)"):
        slices[1].segments.to_pandas()


def test_a_segment_reads_short(slices: tuple[Slice, Slice]) -> None:
    seg = slices[0].segments[0]
    text = repr(seg)
    assert len(text) < 250 and "Stream(" not in text and "None" not in text
    assert seg.id in text and _UTC.search(text) and "KiB" in text and "duration=1.99s" in text
    page = seg._repr_html_()
    assert page.count("<tr>") == 6 + 1 + len(seg.streams)  # facts, stream header, one per stream
    assert (
        "cam0/rgb" in page and "KiB" in page and len(_UTC.findall(page)) == 2 and "None" not in page
    )


def test_a_pull_report_reads_like_the_cli_line() -> None:
    report = PullReport("slc_x", 3, 3 << 20, 2, 2 << 20, 1, 1 << 20, 0.5)
    assert (
        str(report)
        == report.summary()
        == (
            "slc_x: 3 blobs (3.0 MiB) verified in cache; fetched 2 (2.0 MiB) in 0.5 s (4.0 MiB/s), 1 already cached"
        )
    )
    assert repr(report) == f"<PullReport {report.summary()}>"
    page = report._repr_html_()
    assert "Pull of slc_x" in page and "2 blobs, 2.0 MiB" in page and "1 blobs, 1.0 MiB" in page


def test_the_progress_bar_counts_in_binary_units(capsys: pytest.CaptureFixture[str]) -> None:
    bar = byte_bar(3 << 20, "pull slc_x")
    bar.update(3 << 20)
    bar.close()
    shown = capsys.readouterr().err.replace("\r", "\n").strip().splitlines()[-1]
    assert re.fullmatch(
        r"pull slc_x: 100%\|.*\| 3\.0 MiB/3\.0 MiB \[.*, [\d.]+ (B|KiB|MiB|GiB)/s\]", shown
    ), shown


def test_the_server_stub_lists_sizes_in_binary_units(
    demo_root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert server_cli(["slices", "--root", str(demo_root)]) == 0
    line = capsys.readouterr().out.strip()
    assert re.search(r" \d+\.\d (KiB|MiB) ", line) and " MB " not in line, line


def test_a_dataset_shows_every_argument_that_changes_its_samples(
    slices: tuple[Slice, Slice],
) -> None:
    v2, v1 = slices
    ds = EpisodeDataset(
        v2,
        obs=["cam0/rgb", "joints/position"],
        action="joints/position_delta",
        fps=15,
        horizon=16,
        frame="ros",
        obs_steps=2,
        action_mode="nearest",
        seed=7,
    )
    text = repr(ds)
    for part in (
        "slice=slc_7c1e04aa",
        "episodes=4",
        f"samples={len(ds)}",
        "obs=['cam0/rgb', 'joints/position']",
        "action='joints/position_delta'",
        "fps=15",
        "horizon=16",
        "frame='ros'",
        "obs_steps=2",
        "action_mode='nearest'",
        "seed=7",
        f"uri={ds.uri}>",
    ):
        assert part in text, part
    # Every parameter of the URI is in the repr, whatever the URI gains later.
    for key in DatasetURI.parse(ds.uri).dataset_kwargs():
        assert key == "segments" or f" {key}=" in text, key
    page = ds._repr_html_()
    assert "EpisodeDataset on slc_7c1e04aa" in page and "horizon" in page and "nearest" in page
    assert html.escape(ds.uri) in page
    # A view names its selection; chosen episodes are listed; no action is shown as such.
    view = EpisodeDataset(
        v2.select(sites=["lab-zurich"]), obs=["joints/position"], action=None, fps=10
    )
    assert "select='sites:lab-zurich'" in repr(view) and "action=None" in repr(view)
    chosen = EpisodeDataset(
        v1, obs=["joints/position"], action=None, fps=10, segments=[v1.segments[1].id]
    )
    assert f"segments=['{v1.segments[1].id}']" in repr(chosen)


def test_stats_as_arrays(slices: tuple[Slice, Slice]) -> None:
    ds = EpisodeDataset(slices[0], obs=["joints/position"], action="joints/position_delta", fps=15)
    lists, arrays = ds.stats(), ds.stats_arrays()
    assert isinstance(lists["joints/position"]["mean"], list)  # unchanged: JSON for trackers
    for name, entry in arrays.items():
        for key in ("mean", "std", "min", "max"):
            assert entry[key].dtype == np.float32 and entry[key].shape == (14,)
            assert np.allclose(entry[key], lists[name][key])
        assert entry["count"] == lists[name]["count"]
