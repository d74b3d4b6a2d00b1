"""Dataset URIs of selection views (``select=``): compact, canonical, rebuilt exactly."""

from __future__ import annotations

from support import DEMO_SLICE, ServerProcess
from support.lineage import ACTION, OBS, sample_digests

import rayform
from rayform import DatasetURI
from rayform.manifest import ColumnarManifest, Segments
from rayform.torch import EpisodeDataset


def _dataset(slice_: rayform.Slice) -> EpisodeDataset:
    return EpisodeDataset(slice_, obs=OBS, action=ACTION, fps=15, horizon=4, frame="ros", seed=3)


def test_a_view_is_named_by_its_selection_and_rebuilds_the_same_samples(client_env: ServerProcess):
    slice_ = rayform.Client().slices.get(DEMO_SLICE)
    assert isinstance(slice_.segments, Segments)
    assert isinstance(slice_.manifest, ColumnarManifest)  # the demo slice is a v2 manifest
    segs = list(slice_.segments)
    site = segs[0].site
    start = sorted(s.start_ns for s in segs)[1]
    view = slice_.select(sites=[site], start_ns=start)
    ds = _dataset(view)
    uri = ds.uri
    assert "&segments=" not in uri
    assert "?v=2&" in uri and uri.endswith(f"&select=sites:{site};start_ns:{start}")
    again = EpisodeDataset.from_uri(uri)
    assert again.uri == uri
    assert again.slice.selection == {"sites": [site], "start_ns": start}
    assert [s.id for s in again.segments] == [s.id for s in ds.segments]
    assert sample_digests(again) == sample_digests(ds)


def test_a_chain_of_views_is_one_selection(client_env: ServerProcess):
    slice_ = rayform.Client().slices.get(DEMO_SLICE)
    segs = list(slice_.segments)
    ids = [s.id for s in segs]
    t_first, t_last = segs[0].start_ns, segs[-1].start_ns
    chained = slice_.select(segments=ids[::-1], end_ns=t_last + 1).select(
        segments=ids[:2], start_ns=t_first
    )
    ds = _dataset(chained)
    parsed = DatasetURI.parse(ds.uri)
    assert (
        parsed.select
        == f"end_ns:{t_last + 1};segments:{','.join(sorted(ids[:2]))};start_ns:{t_first}"
    )
    again = EpisodeDataset.from_uri(ds.uri)
    assert [s.id for s in again.segments] == [s.id for s in ds.segments]
    assert sample_digests(again) == sample_digests(ds)


def test_a_where_predicate_falls_back_to_the_episode_list(client_env: ServerProcess):
    slice_ = rayform.Client().slices.get(DEMO_SLICE)
    view = slice_.select(where=lambda c: c["duration_ns"] >= int(c["duration_ns"].min()))
    view = view.select(where=lambda c: c["start_ns"] > int(c["start_ns"].min()))
    ds = _dataset(view)
    parsed = DatasetURI.parse(ds.uri)
    assert parsed.select is None and parsed.version == 1
    assert parsed.segments == tuple(s.id for s in view.segments)
    again = EpisodeDataset.from_uri(ds.uri)
    assert again.uri == ds.uri and sample_digests(again) == sample_digests(ds)


def test_a_view_with_segments_chosen_by_hand_lists_them(client_env: ServerProcess):
    slice_ = rayform.Client().slices.get(DEMO_SLICE)
    view = slice_.select(sites=sorted({s.site for s in slice_.segments}))
    chosen = [s.id for s in view.segments][:2][::-1]
    ds = EpisodeDataset(view, obs=OBS, action=ACTION, fps=15, segments=chosen)
    parsed = DatasetURI.parse(ds.uri)
    assert parsed.select is None and parsed.segments == tuple(chosen)
    assert EpisodeDataset.from_uri(ds.uri).uri == ds.uri


def test_select_expression_is_canonical():
    base = (
        "rayform://h/slc_7c1e04aa@" + "ab" * 32 + "?v=2&action=&action_mode=hold&fps=15&frame="
        "&horizon=1&obs=a&obs_steps=1&seed=0&select="
    )
    messy = DatasetURI.parse(base + "start_ns:5;sites:lab%20b,lab-a,lab-a")
    assert messy.select == "sites:lab%20b,lab-a;start_ns:5"  # sorted as decoded text
    assert messy.selection() == {"sites": ["lab b", "lab-a"], "start_ns": 5}
    assert str(DatasetURI.parse(str(messy))) == str(messy)
    assert messy.digest != DatasetURI.parse(base + "sites:lab-a;start_ns:5").digest
