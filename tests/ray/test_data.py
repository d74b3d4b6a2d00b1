"""``rayform.ray.read_slice`` on a real local 2-node Ray cluster (docs/ray.md): rows are the
dataset's samples, exactly; tasks of equal runs of whole blocks; bounded blocks; episode rows;
offline reads from the cache; the docs' recipe runs as written."""

from __future__ import annotations

import math
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from support import DEMO_SLICE, WRITE_TOKEN, ServerProcess, make_client
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

    # The read tasks, run here: consecutive rows each, in blocks of exactly 8 rows (at most
    # max_block_bytes; a row counts ~128 bytes of metadata besides its tensors) but the last,
    # so a batch of 8 is never two blocks' pieces.
    source = rayform.ray.SliceDatasource(dataset, max_block_bytes=9 * row_bytes)
    tasks = source.get_read_tasks(2)
    assert len(tasks) == 2
    assert sum(t.metadata.num_rows for t in tasks) == len(dataset)
    blocks = [b for task in tasks for b in task()]
    assert [b.num_rows for b in blocks[:-1]] == [8] * (len(blocks) - 1)
    assert 0 < blocks[-1].num_rows <= 8
    order = [i for b in blocks for i in b.column("meta/index").to_pylist()]
    assert order == list(range(len(dataset)))  # time order, every sample once

    # The same from the dataset as built, then offline from the cache on every node.
    offline = make_client(demo_server.url, tmp_path / "cache", offline=True, shared=True)
    again = rayform.torch.EpisodeDataset(
        offline.slices.get(DEMO_SLICE).select(segments=[ids[0], ids[2], ids[3]]), **ARGS
    )
    _assert_rows_are_samples(_rows(rayform.ray.read_slice(again)), dataset)


def test_read_tasks_are_equal_runs_of_whole_blocks() -> None:
    groups = rayform.ray.group_episodes([10, 10, 10, 10, 1, 1], 3)
    assert [list(g) for g in groups] == [[0, 1], [2], [3, 4, 5]]
    assert rayform.ray.group_episodes([5], 8) == [range(0, 1)]
    assert rayform.ray.group_episodes([], 4) == []
    # Sample rows: 6 blocks of 8 rows (the last one 2), two per task.
    assert rayform.ray.group_rows([10, 10, 10, 10, 1, 1], 3, 8) == [
        range(0, 16),
        range(16, 32),
        range(32, 42),
    ]
    assert rayform.ray.group_rows([3, 3], 2, 8) == [range(0, 6)]  # one block: one task
    assert rayform.ray.group_rows([], 2, 8) == []
    # More tasks than episodes: cuts inside episodes too, every task whole blocks but the
    # last, tasks within one block of each other (five 400-row episodes, 96-row blocks).
    tasks = rayform.ray.group_rows([400] * 5, 6, 96)
    assert len(tasks) == 6 and tasks[0].start == 0 and tasks[-1].stop == 2000
    assert all(a.stop == b.start for a, b in zip(tasks, tasks[1:], strict=False))
    assert all(len(t) % 96 == 0 for t in tasks[:-1])
    assert max(map(len, tasks[:-1])) - min(map(len, tasks[:-1])) <= 96
    assert len(rayform.ray.group_rows([400] * 5, 200, 96)) == 21  # at most one per block


def test_tasks_decode_their_cameras_in_parallel_and_workers_keep_the_dataset(
    ray_cluster: Any, demo_server: ServerProcess, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rayform.ray._data import SliceDatasource, _node_cpus

    client = make_client(demo_server.url, tmp_path / "cache")
    slice_ = client.slices.get(DEMO_SLICE)
    two = {**ARGS, "obs": ["cam0/rgb", "wrist/rgb"]}

    def source(dataset: Any, **options: Any) -> SliceDatasource:
        return SliceDatasource(dataset, max_block_bytes=1 << 20, options=options)

    one_cam = source(rayform.torch.EpisodeDataset(slice_, **ARGS, shard=None))
    two_cams = source(rayform.torch.EpisodeDataset(slice_, **two, shard=None))
    assert _node_cpus() == 1  # the test cluster's nodes: a task cannot ask for more
    assert one_cam.task_cpus == two_cams.task_cpus == 1
    assert not two_cams._options["decode_threads"]
    asked = source(rayform.torch.EpisodeDataset(slice_, **two, shard=None), decode_threads=3)
    assert asked._options["decode_threads"] == 3 and asked.task_cpus == 1
    # On nodes of 4 CPUs: a thread (and a CPU) per camera, up to two; the user's number wins.
    monkeypatch.setattr(rayform.ray._data, "_node_cpus", lambda: 4)
    wide = source(rayform.torch.EpisodeDataset(slice_, **two, shard=None))
    assert wide._options["decode_threads"] == 2 and wide.task_cpus == 2
    narrow = source(rayform.torch.EpisodeDataset(slice_, **ARGS, shard=None))
    assert not narrow._options["decode_threads"] and narrow.task_cpus == 1
    asked = source(rayform.torch.EpisodeDataset(slice_, **two, shard=None), decode_threads=3)
    assert asked.task_cpus == 3
    monkeypatch.undo()
    # The default: runs of four blocks or more, unless the cluster's CPUs would lack tasks
    # (two per task slot); one block per task at most, and 200 tasks at most.
    small = SliceDatasource(
        rayform.torch.EpisodeDataset(slice_, **ARGS, shard=None),
        max_block_bytes=one_cam._row_bytes * 2,
    )
    block_rows = small._block_rows(None)
    blocks = -(-sum(small._lengths) // block_rows)
    assert block_rows == 2 and blocks > 8
    for cpus, tasks in [(1, -(-blocks // 4)), (2, -(-blocks // 4)), (10**4, min(200, blocks))]:
        monkeypatch.setattr(rayform.ray._data, "_cluster_cpus", lambda cpus=cpus: cpus)
        assert small.default_num_blocks() == tasks, cpus
    monkeypatch.setattr(rayform.ray._data, "_cluster_cpus", lambda: blocks // 4)
    assert small.default_num_blocks() == min(200, blocks, 2 * (blocks // 4))
    monkeypatch.undo()
    runs = rayform.ray.group_rows(small._lengths, -(-blocks // 4), block_rows)
    assert min(map(len, runs[:-1])) >= 4 * block_rows

    # A worker keeps the dataset it built by what it is built from: the same dataset,
    # client and options again reuse it; another option or another cache do not.
    again = source(rayform.torch.EpisodeDataset(slice_, **ARGS, shard=None))
    assert again._token == one_cam._token
    other = source(rayform.torch.EpisodeDataset(slice_, **ARGS, shard=None), decoder_cache_size=3)
    assert other._token != one_cam._token
    elsewhere = make_client(demo_server.url, tmp_path / "cache2").slices.get(DEMO_SLICE)
    moved = source(rayform.torch.EpisodeDataset(elsewhere, **ARGS, shard=None))
    assert moved._token != one_cam._token
    assert two_cams._token != one_cam._token


def test_task_options_reach_ray_without_its_deprecation(
    ray_cluster: Any, demo_server: ServerProcess, tmp_path: Path
) -> None:
    slice_ = make_client(demo_server.url, tmp_path / "cache").slices.get(DEMO_SLICE)

    def read_op(**kwargs: Any) -> dict[str, Any]:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            ds = rayform.ray.read_slice(slice_, **ARGS, **kwargs)
        # Ray 2.60 warns (RayDeprecationWarning) whenever ray_remote_args is given at all.
        assert not [w for w in caught if "ray_remote_args" in str(w.message)]
        return dict(ds._logical_plan.dag.ray_remote_args)

    assert read_op()["num_cpus"] == 1  # the task's decode threads (one camera)
    given = read_op(ray_remote_args={"num_cpus": 0.5, "memory": 1 << 20})
    assert given["num_cpus"] == 0.5 and given["memory"] == 1 << 20
    # An option Ray does not name still goes through (and Ray's own warning is then the user's).
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        other = rayform.ray.read_slice(slice_, **ARGS, ray_remote_args={"max_retries": 7})
    assert dict(other._logical_plan.dag.ray_remote_args)["max_retries"] == 7


def test_blocks_pass_rays_block_shaping_whole() -> None:
    target = 128 << 20  # Ray's default target_max_block_size
    row = 2 * 3 * 480 * 640 + 512  # two 480x640 cameras
    rows = rayform.ray.rows_per_block(row, 256 << 20, target)
    # Above the target (Ray would gather smaller blocks into multi-chunk ones that a batch
    # copies) and under 1.5 times it (Ray would slice it at a row a batch does not start on).
    assert rows % 32 == 0 and target < rows * row < 1.5 * target
    # Four cameras: no multiple of 32 fits, 48 rows do (a batch of 16 is then always a view).
    four = 2 * row
    assert rayform.ray.rows_per_block(four, 256 << 20, target) == 48
    # Rows too big for the window, or a smaller bound: a power of two within the bound.
    assert rayform.ray.rows_per_block(100 << 20, 256 << 20, target) == 1
    assert rayform.ray.rows_per_block(row, 64 << 20, target) == 32
    assert rayform.ray.rows_per_block(row, 8 * row, None) == 8


def test_episode_rows(ray_cluster: Any, demo_server: ServerProcess, tmp_path: Path) -> None:
    client = make_client(demo_server.url, tmp_path / "cache")
    slice_ = client.slices.get(DEMO_SLICE)
    rows = rayform.ray.read_slice(slice_, rows="episodes").take_all()
    assert [r["segment"] for r in rows] == slice_.segments.ids().to_pylist()
    first = slice_.segments[0]
    assert rows[0]["blob/cam0/rgb"] == first.streams["cam0/rgb"].blob.hash
    assert rows[0]["nbytes/cam0/rgb"] == first.streams["cam0/rgb"].blob.size
    assert rows[0]["manifest_hash"] == slice_.manifest_hash


def test_spans_labels_and_within_reach_the_rows(
    ray_cluster: Any, write_server: ServerProcess, tmp_path: Path
) -> None:
    """A spans label read as an observation (``"label:events"``) is a column of range names
    per row, and ``within=`` keeps the rows inside a name's ranges: the dataset's samples,
    read by Ray tasks on both nodes from the label set the slice pinned."""
    ms = 1_000_000
    client = rayform.Client(endpoint=write_server.url, token=WRITE_TOKEN, cache_dir=tmp_path / "c")
    slice_ = client.slices.get(DEMO_SLICE)
    seg = slice_.segments[1]
    slice_.label_all(
        {
            seg.id: {
                "events": [
                    (seg.start_ns + 200 * ms, seg.start_ns + 700 * ms, "grasp_failed"),
                    (seg.start_ns + 500 * ms, seg.start_ns + 900 * ms, "slip"),
                ]
            }
        }
    )
    slice_ = client.slices.get(DEMO_SLICE)
    args: dict[str, Any] = {
        "obs": ["joints/position", "label:events"],
        "action": "joints/position_delta",
        "fps": 15,
    }
    dataset = rayform.torch.EpisodeDataset(slice_, **args)
    rows = _rows(rayform.ray.read_slice(slice_, **args, override_num_blocks=2))
    samples = dataset.__getitems__(range(len(dataset)))
    assert [r["label:events"] for r in rows] == [s["label:events"] for s in samples]
    named = {tuple(r["label:events"]) for r in rows if r["meta/segment"] == seg.id}
    assert {("grasp_failed",), ("grasp_failed", "slip"), ("slip",), ()} <= named
    assert all(r["label:events"] == [] for r in rows if r["meta/segment"] != seg.id)

    within = rayform.ray.read_slice(slice_, **args, within="events:slip").take_all()
    kept = rayform.torch.EpisodeDataset(slice_, **args, within="events:slip")
    assert 0 < len(within) == len(kept) < len(dataset)
    for row in within:
        t = int(row["t_ns"]) - seg.start_ns
        assert row["meta/segment"] == seg.id and 500 * ms <= t < 900 * ms
        assert "slip" in row["label:events"]


def test_a_published_slice_reads_like_its_parents_selection(
    ray_cluster: Any, write_server: ServerProcess, tmp_path: Path
) -> None:
    client = rayform.Client(endpoint=write_server.url, token=WRITE_TOKEN, cache_dir=tmp_path / "c")
    parent = client.slices.get(DEMO_SLICE)
    ids = parent.segments.ids().to_pylist()
    child = client.slices.create(parent.select(segments=[ids[1], ids[3]]))
    dataset = rayform.torch.EpisodeDataset(child, **ARGS, shard=None)
    rows = _rows(rayform.ray.read_slice(child, **ARGS))
    _assert_rows_are_samples(rows, dataset)
    assert {r["meta/slice"] for r in rows} == {child.id}
    assert {r["meta/segment"] for r in rows} == {ids[1], ids[3]}


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
