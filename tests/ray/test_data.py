"""``rayform.ray.read_slice`` on a real local 2-node Ray cluster (docs/ray.md): rows are the
dataset's samples, exactly; one task per group of whole episodes; bounded blocks; episode rows;
offline reads from the cache; the docs' recipe runs as written."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from support import DEMO_SLICE, ServerProcess, make_client
from support.docblocks import REPO, collect

import rayform
import rayform.ray

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::FutureWarning")

ARGS: dict[str, Any] = {
    "obs": {"image": "cam0/rgb", "state": "joints/position"},  # a name map
    "action": "joints/position_delta",
    "fps": 5,
    "horizon": 4,
    "image_size": (48, 64),
}


def _rows(ds: Any) -> list[dict[str, Any]]:
    return sorted(ds.take_all(), key=lambda r: int(r["meta/index"]))


def _assert_rows_are_samples(rows: list[dict[str, Any]], dataset: Any) -> None:
    assert [int(r["meta/index"]) for r in rows] == list(range(len(dataset)))
    for row, sample in zip(rows, dataset.__getitems__(range(len(dataset))), strict=True):
        for key, value in sample.items():
            if key == "meta":
                for field, v in value.items():
                    assert row[f"meta/{field}"] == v, (field, row[f"meta/{field}"], v)
            else:
                got = torch.from_numpy(np.array(row[key]))
                assert got.dtype == value.dtype and torch.equal(got, value), key


def test_rows_are_the_datasets_samples_exactly(
    ray_cluster: Any, demo_server: ServerProcess, tmp_path: Path
) -> None:
    client = make_client(demo_server.url, tmp_path / "cache", shared=True)
    whole = client.slices.get(DEMO_SLICE)
    ids = whole.segments.ids().to_pylist()
    view = whole.select(segments=[ids[0], ids[2], ids[3]])  # a select() view
    dataset = rayform.torch.EpisodeDataset(view, **ARGS, shard=None)

    row_bytes = sum(np.dtype(d).itemsize * math.prod(s) for d, s in dataset.sample_spec().values())
    ds = rayform.ray.read_slice(view, **ARGS, override_num_blocks=2)
    _assert_rows_are_samples(_rows(ds), dataset)

    # The read tasks, run here: whole episodes each, blocks of at most max_block_bytes.
    source = rayform.ray.SliceDatasource(dataset, max_block_bytes=8 * row_bytes)
    tasks = source.get_read_tasks(2)
    assert sum(t.metadata.num_rows for t in tasks) == len(dataset)
    for task in tasks:
        blocks = list(task())
        assert all(b.num_rows <= 8 for b in blocks)
        assert sum(b.num_rows for b in blocks) == task.metadata.num_rows
        segments = {s for b in blocks for s in b.column("meta/segment").to_pylist()}
        lengths = dataset.segment_lengths
        assert sum(lengths[s] for s in segments) == task.metadata.num_rows  # whole episodes

    # The same from the dataset as built, then offline from the cache on every node.
    offline = make_client(demo_server.url, tmp_path / "cache", offline=True, shared=True)
    again = rayform.torch.EpisodeDataset(
        offline.slices.get(DEMO_SLICE).select(segments=[ids[0], ids[2], ids[3]]), **ARGS
    )
    _assert_rows_are_samples(_rows(rayform.ray.read_slice(again)), dataset)


def test_read_tasks_hold_whole_episodes() -> None:
    groups = rayform.ray.group_episodes([10, 10, 10, 10, 1, 1], 3)
    assert [list(g) for g in groups] == [[0, 1], [2], [3, 4, 5]]
    assert rayform.ray.group_episodes([5], 8) == [range(0, 1)]
    assert rayform.ray.group_episodes([], 4) == []


def test_episode_rows(ray_cluster: Any, demo_server: ServerProcess, tmp_path: Path) -> None:
    client = make_client(demo_server.url, tmp_path / "cache")
    slice_ = client.slices.get(DEMO_SLICE)
    rows = rayform.ray.read_slice(slice_, rows="episodes").take_all()
    assert [r["segment"] for r in rows] == slice_.segments.ids().to_pylist()
    first = slice_.segments[0]
    assert rows[0]["blob/cam0/rgb"] == first.streams["cam0/rgb"].blob.hash
    assert rows[0]["nbytes/cam0/rgb"] == first.streams["cam0/rgb"].blob.size
    assert rows[0]["manifest_hash"] == slice_.manifest_hash


def test_the_docs_recipe_runs(
    ray_cluster: Any, client_env: ServerProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/ray.md's per-episode statistics and filter recipe, as written."""
    blocks, _ = collect(REPO / "docs" / "ray.md")
    recipe = [b for b in blocks if "map_batches" in b.text]
    assert len(recipe) == 1
    scope: dict[str, Any] = {}
    exec(compile(recipe[0].text, recipe[0].where, "exec"), scope)
    assert scope["uri"].startswith("rayform")
    kept = scope["kept"]
    assert 0 < len(kept) < len(scope["slice_"].segments)
    ds = rayform.torch.EpisodeDataset.from_uri(scope["uri"])
    assert set(ds.segment_lengths) == set(kept)
