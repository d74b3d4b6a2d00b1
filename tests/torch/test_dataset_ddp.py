"""EpisodeDataset under torch.distributed: a real 2-process torchrun (gloo, CPU)."""

from __future__ import annotations

import json
import textwrap
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from support import torchrun
from support.datasets import build_slice
from torch.utils.data.distributed import DistributedSampler

from rayform.torch import EpisodeDataset, EpisodeSampler
from rayform.torch._sampling._shard import rank_indices

TESTS = Path(__file__).resolve().parents[1]

SCRIPT = """
import json, sys
from pathlib import Path
import torch.distributed as dist
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler
from support.datasets import SLICE_ID
from support.fakes import StoreBlobs
from rayform_server.store import Store
from rayform.slice import Slice
from rayform.torch import EpisodeDataset, EpisodeSampler, collate

store_root, out_dir = sys.argv[1], Path(sys.argv[2])
dist.init_process_group("gloo")
rank = dist.get_rank()
# Everything the dataset logs, from this rank and its workers (the sharding loaders: nothing).
import logging
log_file = out_dir / f"log{rank}.txt"
logging.getLogger("rayform.torch").addHandler(logging.FileHandler(log_file))
store = Store(store_root)
ref = store.get_slice(SLICE_ID)
sl = Slice(SLICE_ID, ref["manifest"], store.load_manifest(ref["manifest"]), StoreBlobs(store, Path(".")))

def keys(loader):
    return [[s, int(t)] for b in loader for s, t in zip(b["meta"]["segment"], b["t_ns"].tolist())]

result = {}
for even in ("pad", "drop", "split"):
    ds = EpisodeDataset(sl, obs=["joints/position"], action="joints/position_delta", fps=10, ddp_even=even)
    sampler = EpisodeSampler(ds)
    loader = DataLoader(ds, batch_size=5, sampler=sampler, num_workers=1)
    result[even] = {"len": len(sampler), "sharded": ds.sharded, "samples": keys(loader)}
    if even == "pad":  # the same epoch through rayform.torch.collate's reused shared memory
        loader = DataLoader(ds, batch_size=5, sampler=EpisodeSampler(ds), num_workers=1, collate_fn=collate)
        result["pad_collate"] = keys(loader)
# The public docs' pattern: DistributedSampler on top of the (auto-sharding) dataset.
ds = EpisodeDataset(sl, obs=["joints/position"], action="joints/position_delta", fps=10)
sampler = DistributedSampler(ds, shuffle=True, seed=0)
sampler.set_epoch(1)
loader = DataLoader(ds, batch_size=5, sampler=sampler)
result["distributed_sampler"] = {"len": len(ds), "sampler_len": len(sampler), "samples": keys(loader)}
# A loader that does not shard (shuffle=True, as users copy it): each rank warns once, from its
# first worker; the sharding loaders above never do (the log has that one line).
for epoch in range(2):
    ds.set_epoch(epoch)
    result.setdefault("unsharded", 0)
    result["log"] = str(log_file)
    result["unsharded"] += sum(len(b["t_ns"]) for b in DataLoader(ds, batch_size=5, shuffle=True, num_workers=2))
(out_dir / f"rank{rank}.json").write_text(json.dumps(result))
dist.barrier()
dist.destroy_process_group()
"""


@pytest.fixture(scope="module")
def ddp_run(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("ddp")
    slice_, truths = build_slice(root / "store", root / "cache", seconds=(3.0, 1.0, 2.0, 1.5, 2.5))
    script = root / "ddp_script.py"
    script.write_text(textwrap.dedent(SCRIPT))
    torchrun(2, script, str(root / "store"), str(root))
    ranks = [json.loads((root / f"rank{r}.json").read_text()) for r in range(2)]
    full = EpisodeDataset(slice_, obs=["joints/position"], action="joints/position_delta", fps=10)
    everything = {
        (s["meta"]["segment"], int(s["t_ns"])) for s in full.__getitems__(list(range(len(full))))
    }
    return ranks, everything, full


def test_a_loader_that_does_not_shard_warns_once_per_rank(ddp_run, tmp_path_factory) -> None:
    ranks, _, full = ddp_run
    for rank, result in enumerate(ranks):
        assert result["unsharded"] == 2 * len(full)  # every rank read the whole epoch, twice
        log = Path(result["log"]).read_text()
        assert log.count("does not shard") == 1, log
        assert f"rank {rank} of 2" in log and "EpisodeSampler(dataset, shuffle=True)" in log


def test_ddp_pad_shards_are_disjoint_complete_and_equal(ddp_run) -> None:
    ranks, everything, _ = ddp_run
    r0, r1 = (r["pad"] for r in ranks)
    assert r0["sharded"] and r1["sharded"]
    assert r0["len"] == r1["len"] == len(r0["samples"]) == len(r1["samples"])
    seg0 = {s for s, _ in r0["samples"]}
    seg1 = {s for s, _ in r1["samples"]}
    assert not seg0 & seg1  # by episode, disjoint
    got = {tuple(x) for x in r0["samples"]} | {tuple(x) for x in r1["samples"]}
    assert got == everything  # complete
    # Padding repeats a rank's own samples only; total duplicates = len difference.
    dup = 2 * r0["len"] - len(everything)
    assert (
        dup >= 0
        and sum(c - 1 for c in Counter(map(tuple, r0["samples"] + r1["samples"])).values()) == dup
    )


def test_ddp_with_rayform_collate_gives_the_same_epoch(ddp_run) -> None:
    ranks, _, _ = ddp_run
    for r in ranks:
        assert r["pad_collate"] == r["pad"]["samples"] and len(r["pad_collate"]) == r["pad"]["len"]


def test_ddp_drop_shards_are_disjoint_and_equal_without_duplicates(ddp_run) -> None:
    ranks, everything, _ = ddp_run
    r0, r1 = (r["drop"] for r in ranks)
    assert r0["len"] == r1["len"] == len(r0["samples"]) == len(r1["samples"])
    s0 = [tuple(x) for x in r0["samples"]]
    s1 = [tuple(x) for x in r1["samples"]]
    assert len(set(s0)) == len(s0) and len(set(s1)) == len(s1) and not set(s0) & set(s1)
    assert set(s0) | set(s1) <= everything
    assert len(everything) - 2 * r0["len"] < max(5, len(everything) // 2)


def test_distributed_sampler_gets_one_complete_epoch(ddp_run) -> None:
    ranks, everything, _ = ddp_run
    r0, r1 = (r["distributed_sampler"] for r in ranks)
    # Documented behaviour: the dataset's index space is every rank's samples (its len() does
    # not depend on who asks), so DistributedSampler splits one complete epoch by sample.
    assert r0["len"] == r1["len"] == len(everything)
    assert r0["sampler_len"] == r1["sampler_len"] == -(-len(everything) // 2)
    s0 = [tuple(x) for x in r0["samples"]]
    s1 = [tuple(x) for x in r1["samples"]]
    assert len(s0) == len(s1)
    assert set(s0) | set(s1) == everything
    # DistributedSampler itself pads the last round with at most world_size - 1 repeats.
    assert len(s0) + len(s1) - len(everything) <= 1


def test_ddp_split_shards_cover_the_epoch_once_with_at_most_one_pad(ddp_run) -> None:
    ranks, everything, _ = ddp_run
    r0, r1 = (r["split"] for r in ranks)
    assert r0["sharded"] and r0["len"] == r1["len"] == len(r0["samples"]) == len(r1["samples"])
    both = [tuple(x) for x in r0["samples"] + r1["samples"]]
    assert set(both) == everything and len(both) - len(everything) <= 1
    # Consecutive episodes per rank: at most one episode is shared by the two ranks.
    assert len({s for s, _ in r0["samples"]} & {s for s, _ in r1["samples"]}) <= 1


def test_rank_indices_balance_many_worlds() -> None:
    rng = np.random.default_rng(5)
    for world in (2, 3, 4, 7):
        counts = rng.integers(0, 300, size=41)
        offsets = np.concatenate([[0], np.cumsum(counts)])
        for even in ("pad", "drop"):
            shards = [rank_indices(offsets, r, world, even) for r in range(world)]
            assert len({len(s) for s in shards}) == 1
            episodes = [set(np.searchsorted(offsets, s, side="right") - 1) for s in shards]
            for a in range(world):
                for b in range(a + 1, world):
                    assert not episodes[a] & episodes[b]
            if even == "pad":
                assert set(np.concatenate(shards)) == set(range(offsets[-1]))
            else:
                assert len(np.unique(np.concatenate(shards))) == world * len(shards[0])
        # Balanced: loads differ by at most one episode.
        own = [len(set(rank_indices(offsets, r, world, "pad"))) for r in range(world)]
        assert max(own) - min(own) <= counts.max()


def test_explicit_shard_and_distributed_sampler_in_one_process(tmp_path: Path) -> None:
    slice_, _ = build_slice(tmp_path / "store", tmp_path / "cache", seconds=(1.0, 1.5, 1.0))
    whole = EpisodeDataset(slice_, obs=["joints/position"], action=None, fps=10, shard=None)
    part = EpisodeDataset(slice_, obs=["joints/position"], action=None, fps=10, shard=(1, 2))
    # The index space never depends on the caller: EpisodeSampler reads rank 1's shard,
    # DistributedSampler splits the whole epoch by sample.
    assert part.sharded and part.shard == (1, 2) and len(part) == len(whole)
    assert len(EpisodeSampler(part)) == -(-len(whole) // 2)
    sampler = DistributedSampler(part, num_replicas=2, rank=1, shuffle=False)
    assert len(sampler) == -(-len(whole) // 2) and len(part) == len(whole)
    assert set(EpisodeSampler(whole, shuffle=False).next_indices(len(whole)).tolist()) == set(
        range(len(whole))
    )
