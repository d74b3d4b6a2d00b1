"""Training under Ray Train's TorchTrainer on a real local 2-node Ray cluster (docs/ray.md):
EpisodeSampler keeps sharding by episode, Ray's own sampler swap is told once, and a kill, a
restart and a resume on another number of workers train every sample of the epoch exactly."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from ray.train import FailureConfig, RunConfig, ScalingConfig
from ray.train.torch import TorchConfig, TorchTrainer
from support import ServerProcess
from support.raytrain import BATCH, epoch_samples, loop_config, read_log, train_loop

#: Ray's own modules warn about their own deprecated settings (ray.data.context...).
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::FutureWarning")


def _trainer(config: dict[str, Any], workers: int, name: str, storage: Path, **kw: Any) -> Any:
    return TorchTrainer(
        train_loop,
        train_loop_config=config,
        scaling_config=ScalingConfig(num_workers=workers, resources_per_worker={"CPU": 1}),
        torch_config=TorchConfig(backend="gloo"),
        run_config=RunConfig(name=name, storage_path=str(storage), **kw),
    )


def test_two_workers_shard_by_episode_and_cover_the_epoch(
    ray_cluster: Any, demo_server: ServerProcess, tmp_path: Path
) -> None:
    config = loop_config(demo_server.url, tmp_path, check_swap=True)
    _trainer(config, 2, "cover", tmp_path / "runs").fit()
    infos = [json.loads(p.read_text()) for p in sorted(Path(config["log"]).glob("info-*.json"))]
    assert sorted(i["rank"] for i in infos) == [0, 1]
    for info in infos:
        assert info["shard"] == [info["rank"], 2]  # sharded inside TorchTrainer's process group
        assert info["sampler"] == "EpisodeSampler"  # kept by rayform.ray.prepare_data_loader
        assert info["swapped_sampler"] == "DistributedSampler"  # Ray's own swaps it...
        # ...and rank 0 says so once, with the fix; rank 1 stays quiet.
        assert len(info["warnings"]) == (1 if info["rank"] == 0 else 0), info["warnings"]
    if infos[0]["warnings"]:
        assert "rayform.ray.prepare_data_loader" in infos[0]["warnings"][0]

    rows = read_log(Path(config["log"]))
    expected = epoch_samples(config)
    by_rank = [Counter((r["segment"], r["t_ns"]) for r in rows if r["rank"] == k) for k in (0, 1)]
    assert set(by_rank[0]) | set(by_rank[1]) == set(expected)  # together: the whole epoch
    assert len(set(by_rank[0]) & set(by_rank[1])) <= 1  # disjoint but for split's one repeat
    assert sum(by_rank[0].values()) == sum(by_rank[1].values())  # equal lengths (DDP)
    segments = [{seg for seg, _ in c} for c in by_rank]
    assert len(segments[0] & segments[1]) <= 1  # by episode: at most one shared episode


def test_a_killed_worker_restarts_and_a_resume_on_one_worker_trains_the_rest(
    ray_cluster: Any, demo_server: ServerProcess, tmp_path: Path
) -> None:
    """Run 1: 2 workers; rank 1 is SIGKILLed after its 2nd batch; Ray restarts the group
    (max_failures=1) from the last checkpoint; the run stops (a pre-emption) at 3 batches per
    rank. Run 2: 1 worker resumes from run 1's checkpoint and trains the rest of the epoch."""
    storage = tmp_path / "runs"
    config = loop_config(
        demo_server.url,
        tmp_path,
        kill_rank=1,
        kill_at=2,
        stop_at=3 * BATCH,
        run_dir=str(storage / "first"),
    )
    first = _trainer(
        config, 2, "first", storage, failure_config=FailureConfig(max_failures=1)
    ).fit()
    assert (Path(config["log"]) / "killed").exists()
    assert first.checkpoint is not None
    rows_first = read_log(Path(config["log"]))
    assert {r["world"] for r in rows_first} == {2}

    # Ray Train restores a run of the same name and storage path from its latest checkpoint
    # (a job-level restart), here on one worker instead of two.
    resumed = {**config, "kill_rank": None, "stop_at": None}
    trainer = _trainer(resumed, 1, "first", storage)
    trainer.fit()

    rows = read_log(Path(config["log"]))
    assert {r["world"] for r in rows} == {1, 2}  # the rest was trained on one worker
    trained = Counter((r["segment"], r["t_ns"]) for r in rows)
    expected = epoch_samples(config)
    assert set(trained) == set(expected), "a sample of the epoch was never trained"
    repeats = sum(trained.values()) - len(expected)
    # The batch each rank trained before the kill, not checkpointed, is trained again (at
    # most one batch per rank); split's end-of-epoch repeat on 2 ranks adds at most one.
    assert 0 <= repeats <= 2 * BATCH + 1, trained.most_common(12)
