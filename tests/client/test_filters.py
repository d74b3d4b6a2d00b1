"""Filters as data: ``select(where="...")`` on labels and episode fields, the grammar and its
errors, pinned in a dataset URI with the label-set version and rebuilt by ``from_uri``."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from support import DEMO_SLICE, TOKEN, WRITE_TOKEN, ServerProcess

import rayform
from rayform import InvalidArgumentError
from rayform.curation import parse_filter
from rayform.uri import DatasetURI


@pytest.fixture
def labelled(write_server: ServerProcess, tmp_path: Path) -> tuple[rayform.Slice, list[str]]:
    """The small demo slice (4 episodes, 2 sites; episode 1 at version 2) with labels on three
    of its episodes; episode 3 has none."""
    slice_ = rayform.Client(
        endpoint=write_server.url, token=WRITE_TOKEN, cache_dir=tmp_path / "c"
    ).slices.get(DEMO_SLICE)
    ids = [str(i) for i in slice_.segments.ids().to_pylist()]
    slice_.label_all(
        {
            ids[0]: {"success": True, "quality": 0.9, "tags": ["clean"], "grade": "good"},
            ids[1]: {"success": True, "quality": 0.4, "tags": ["regrasp", "dim"]},
            ids[2]: {"success": False, "quality": 0.8, "grade": "bad"},
        }
    )
    return slice_, ids


def _kept(view: rayform.Slice) -> list[str]:
    return [str(i) for i in view.segments.ids().to_pylist()]


def test_filters_on_labels_and_fields(labelled: tuple[rayform.Slice, list[str]]) -> None:
    slice_, ids = labelled
    sites = [str(s) for s in slice_.segments.sites().to_pylist()]
    cases = {
        "success": ids[:2],
        "success == false": ids[2:3],
        "quality >= 0.8": [ids[0], ids[2]],
        "'regrasp' in tags": ids[1:2],
        "'regrasp' not in tags": ids[0:1],  # ids[2] and ids[3] have no tags: no comparison holds
        "grade in ['good', 'bad'] and version == 1": [ids[0], ids[2]],
        "not success": ids[2:],  # `not` keeps the unlabelled episode again
        f"site == '{sites[0]}' and success": [
            i
            for i, s, ok in zip(ids, sites, (True, True, False, False), strict=True)
            if ok and s == sites[0]
        ],
        "duration_s > 0 and start_ns > 0": ids,
        "grade != 'good'": ids[2:3],
    }
    for text, expected in cases.items():
        view = slice_.select(where=text)
        assert _kept(view) == expected, text
        assert view.selection == {
            "filter": parse_filter(text).text,
            "labels": None if text.startswith("duration") else slice_.labels.hash,
        }
    # Chained views are one selection: both filters, one label version.
    chain = slice_.select(where="success").select(where="quality < 0.5")
    assert _kept(chain) == ids[1:2]
    assert DatasetURI.parse(_uri(chain)).selection() == {
        "where": "success and quality < 0.5",
        "labels": slice_.labels.hash,
    }


def _uri(view: rayform.Slice) -> str:
    from rayform.torch import EpisodeDataset

    ds = EpisodeDataset(view, obs=["joints/position"], action="joints/position_delta", fps=15)
    return str(ds.uri)


def test_unknown_fields_and_kind_mismatches_name_what_exists(
    labelled: tuple[rayform.Slice, list[str]],
) -> None:
    slice_, _ = labelled
    with pytest.raises(
        InvalidArgumentError,
        match=r"'sucess' is not a field or label; there are .*success \(bool\)",
    ):
        slice_.select(where="sucess")
    with pytest.raises(InvalidArgumentError, match="'quality' holds number values, not 'high'"):
        slice_.select(where="quality == 'high'")
    with pytest.raises(InvalidArgumentError, match="use 'X in tags'"):
        slice_.select(where="tags == 'dim'")
    with pytest.raises(InvalidArgumentError, match="holds strings: use ==, !=, in or not in"):
        slice_.select(where="grade > 'a'")
    with pytest.raises(InvalidArgumentError, match="not part of the filter grammar"):
        slice_.select(where="__import__('os').system('true')")
    with pytest.raises(InvalidArgumentError, match="keeps no segment"):
        slice_.select(where="quality > 5")


def test_a_filter_is_pinned_in_the_uri_with_the_label_version(
    labelled: tuple[rayform.Slice, list[str]], write_server: ServerProcess, tmp_path: Path
) -> None:
    from rayform.torch import EpisodeDataset

    slice_, ids = labelled
    view = slice_.select(where="success and quality > 0.5")
    pinned = slice_.labels.hash
    ds = EpisodeDataset(view, obs=["joints/position"], action="joints/position_delta", fps=15)
    uri = DatasetURI.parse(str(ds.uri))
    assert uri.selection() == {"where": "success and quality > 0.5", "labels": pinned}
    assert ds.describe()["selection"]["labels"] == pinned
    # The labels move on: the pinned URI still rebuilds the same episodes, and a new view
    # with the same filter follows the new labels.
    slice_.label(ids[1], quality=0.95)
    assert _kept(slice_.select(where="success and quality > 0.5")) == ids[:2]
    reader = rayform.Client(endpoint=write_server.url, token=TOKEN, cache_dir=tmp_path / "r")
    again = EpisodeDataset.from_uri(str(ds.uri), client=reader)
    assert str(again.uri) == str(ds.uri) and len(again) == len(ds)
    assert [str(s.id) for s in again.spec.slice.segments] == ids[:1]


def test_a_million_episodes_filter_on_columns() -> None:
    """The evaluation is one kernel per comparison: checked on a million-row stand-in of the
    columns (bench/curation.py times it)."""
    from rayform.curation import Columns

    n = 1_000_000
    rng = np.random.default_rng(0)
    quality = rng.random(n)
    success = (rng.random(n) < 0.5).astype(np.int8)

    class _Segs:
        def __len__(self) -> int:
            return n

        def column(self, name: str) -> np.ndarray:
            return np.arange(n, dtype=np.int64) * (2 if name == "end_ns" else 1)

    cols = Columns(
        _Segs(), {"quality": ("number", lambda: quality), "success": ("bool", lambda: success)}
    )  # type: ignore[arg-type]
    mask = parse_filter("success and quality >= 0.7 and duration_ns >= 10").mask(cols)
    expected = (success == 1) & (quality >= 0.7) & (np.arange(n) >= 10)
    assert np.array_equal(mask, expected)


def test_a_pinned_filter_rebuilds_offline_after_pull(
    labelled: tuple[rayform.Slice, list[str]],
    write_server: ServerProcess,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from support import forbid_network

    from rayform.torch import EpisodeDataset

    slice_, ids = labelled
    view = slice_.select(where="quality >= 0.8")
    uri = str(
        EpisodeDataset(view, obs=["joints/position"], action="joints/position_delta", fps=15).uri
    )
    cache = tmp_path / "pulled"
    reader = rayform.Client(endpoint=write_server.url, token=TOKEN, cache_dir=cache)
    reader.pull(DEMO_SLICE, streams=["joints/position", "joints/position_delta"])
    slice_.label(ids[0], quality=0.1)  # the labels move on after the pull
    forbid_network(monkeypatch)
    offline = rayform.Client(cache_dir=cache, offline=True)
    again = EpisodeDataset.from_uri(uri, client=offline)
    assert [str(s.id) for s in again.spec.slice.segments] == [ids[0], ids[2]]
    assert again[0]["meta"]["segment"] == ids[0]
