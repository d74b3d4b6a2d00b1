"""``Slice.select``: views of a slice, on v2 columns and v1 segments alike."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from support import DEMO_SLICE, TOKEN, ServerProcess
from support.fakes import StoreBlobs

import rayform
from rayform import format as wire
from rayform.errors import InvalidArgumentError, NotFoundError
from rayform.manifest import manifest_hash
from rayform.slice import Slice
from rayform.torch import EpisodeDataset
from rayform_server.builder import SliceBuilder
from rayform_server.store import Store

OBS = ["cam0/rgb", "joints/position"]
ACTION = "joints/position_delta"


@pytest.fixture(scope="module")
def slices(demo_root: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Slice, Slice]:
    """The demo slice (mapped pages) and its in-memory twin, both read straight from the store."""
    store = Store(demo_root)
    digest = store.get_slice(DEMO_SLICE)["manifest"]
    v2 = store.load_manifest(digest)
    assert isinstance(v2, wire.ColumnarManifest)
    v1 = v2.to_v1()
    client = StoreBlobs(store, tmp_path_factory.mktemp("select-cache"))
    return Slice(DEMO_SLICE, digest, v2, client), Slice(DEMO_SLICE, manifest_hash(v1), v1, client)


def _ids(s: Slice) -> list[str]:
    return [g.id for g in s.segments]


def test_select_by_ids_sites_time_and_predicate(slices: tuple[Slice, Slice]) -> None:
    for sl in slices:
        segs = list(sl.segments)
        pick = [segs[3].id, segs[1].id]
        view = sl.select(segments=pick)
        assert _ids(view) == [segs[1].id, segs[3].id]  # manifest order is kept
        assert view.parent is sl and view.id == sl.id and view.manifest_hash == sl.manifest_hash
        assert view.selection == {"segments": pick}
        assert view.segment(segs[3].id) == segs[3]
        with pytest.raises(NotFoundError, match=segs[0].id):
            view.segment(segs[0].id)

        zurich = sl.select(sites=["lab-zurich"])
        assert _ids(zurich) == [s.id for s in segs if s.site == "lab-zurich"]
        assert zurich.streams == sl.streams
        assert zurich.nbytes == sum(
            {
                b.hash: b.size
                for s in segs
                if s.site == "lab-zurich"
                for st in s.streams.values()
                for b in st.blobs()
            }.values()
        )
        assert zurich.duration_s == pytest.approx(
            sum(s.duration_s for s in segs if s.site == "lab-zurich")
        )

        mid = (segs[1].start_ns + segs[1].end_ns) // 2
        late = sl.select(start_ns=mid)
        assert _ids(late) == [s.id for s in segs if s.end_ns >= mid]
        early = sl.select(end_ns=mid)
        assert _ids(early) == [s.id for s in segs if s.start_ns < mid]

        v2s = sl.select(where=lambda c: c["version"] >= 2)
        assert _ids(v2s) == [s.id for s in segs if s.version >= 2] and len(v2s) >= 1
        by_site = sl.select(where=lambda c: c["site"] == "lab-berkeley")
        assert _ids(by_site) == [s.id for s in segs if s.site == "lab-berkeley"]
        # A view of a view narrows it and remembers both steps.
        both = zurich.select(where=lambda c: c["version"] == 1)
        assert _ids(both) == [s.id for s in segs if s.site == "lab-zurich" and s.version == 1]
        assert both.parent is sl and both.selection["within"] == {"sites": ["lab-zurich"]}
        assert "selection=" in repr(both)
        assert both._repr_html_().count("<tr>") == 6


def test_select_rejects_bad_arguments(slices: tuple[Slice, Slice]) -> None:
    for sl in slices:
        with pytest.raises(NotFoundError, match="seg_00000000deadbeef"):
            sl.select(segments=["seg_00000000deadbeef"])
        with pytest.raises(InvalidArgumentError, match="keeps no segment"):
            sl.select(sites=["lab-nowhere"])
        with pytest.raises(InvalidArgumentError, match="bool mask"):
            sl.select(where=lambda c: c["version"])
        with pytest.raises(InvalidArgumentError, match="list of strings"):
            sl.select(sites="lab-zurich")  # type: ignore[arg-type]
        with pytest.raises(InvalidArgumentError, match="integer time in ns"):
            sl.select(start_ns=1.5)  # type: ignore[arg-type]
        with pytest.raises(KeyError, match="segment columns are"):
            sl.select(where=lambda c: c["robot"] == 1)


def test_view_gives_the_samples_of_a_slice_built_from_the_same_segments(
    slices: tuple[Slice, Slice], demo_root: Path, tmp_path: Path
) -> None:
    parent = slices[0]
    view = parent.select(sites=["lab-zurich"])
    # The same segments committed as a slice of their own (v2) in another root.
    store = Store(tmp_path / "root")
    for ref in parent.manifest.blobs().values():
        store.put_file(Store(demo_root).blob_path(ref.hash))
    builder = SliceBuilder(store, description="zurich only")
    builder.segments = list(view.segments)
    own = builder.commit("slc_0000cafe")
    alone = Slice("slc_0000cafe", own.hash, own, StoreBlobs(store, tmp_path))

    a = EpisodeDataset(view, obs=OBS, action=ACTION, fps=15, horizon=4)
    b = EpisodeDataset(alone, obs=OBS, action=ACTION, fps=15, horizon=4)
    assert len(a) == len(b) > 0 and a.segment_lengths == b.segment_lengths
    for i in [*range(0, len(a), 9), len(a) - 1]:
        x, y = a[i], b[i]
        assert x["meta"]["segment"] == y["meta"]["segment"] and int(x["t_ns"]) == int(y["t_ns"])
        for key in (*OBS, "action", "action_is_pad"):
            assert np.array_equal(np.asarray(x[key]), np.asarray(y[key])), key

    d = a.describe()
    assert d["slice"] == DEMO_SLICE and d["manifest_hash"] == parent.manifest_hash
    assert d["parent_slice"] == DEMO_SLICE and d["parent_manifest_hash"] == parent.manifest_hash
    assert d["selection"] == {"sites": ["lab-zurich"]} and d["episodes"] == len(view)
    assert "selection" not in b.describe() and set(b.describe()) <= set(d)
    # segments= of EpisodeDataset works on a v2 slice too (vectorised lookup), in the given order.
    ids = _ids(view)
    c = EpisodeDataset(parent, obs=OBS, action=ACTION, fps=15, horizon=4, segments=ids[::-1])
    assert [s.id for s in c.segments] == ids[::-1]
    with pytest.raises(InvalidArgumentError, match="twice"):
        EpisodeDataset(parent, obs=OBS, action=ACTION, fps=15, segments=[ids[0], ids[0]])
    with pytest.raises(NotFoundError, match="available streams"):
        EpisodeDataset(parent, obs=["no/such"], action=ACTION, fps=15)
    with pytest.raises(InvalidArgumentError, match="video stream"):
        EpisodeDataset(parent, obs=["joints/position"], action="cam0/rgb", fps=15)


def test_a_view_pulls_only_its_own_segments_blobs(
    demo_server: ServerProcess, tmp_path: Path
) -> None:
    client = rayform.Client(endpoint=demo_server.url, token=TOKEN, cache_dir=tmp_path / "cache")
    parent = client.slices.get(DEMO_SLICE)
    view = parent.select(sites=["lab-zurich"])
    want = view.blobs(["cam0/rgb"])
    assert 0 < len(want) < len(parent.blobs(["cam0/rgb"]))
    report = view.pull(streams=["cam0/rgb"])
    assert report.blobs == report.fetched_blobs == len(want)
    assert report.bytes == sum(r.size for r in want.values()) == view.stream_nbytes(["cam0/rgb"])
    cached = {p.name for p in (tmp_path / "cache" / "blobs").rglob("*") if p.is_file()}
    assert cached == set(want)
    # A view of an in-memory manifest pulls the same blobs (its segments are objects, not columns).
    twin = parent.manifest.to_v1()
    v1 = Slice(DEMO_SLICE, manifest_hash(twin), twin, client)
    assert v1.select(sites=["lab-zurich"]).blobs(["cam0/rgb"]) == want
    again = client.pull(view, streams=["cam0/rgb"])
    assert again.fetched_blobs == 0 and again.cached_blobs == len(want)
