"""Elastic resume under real torchrun (gloo, CPU): saved at 2 ranks, resumed at 3, and 3 -> 2."""

from __future__ import annotations

import json
import textwrap
from collections import Counter
from pathlib import Path

import pytest
from support import torchrun
from support.datasets import build_slice

from rayform.torch import EpisodeDataset

TESTS = Path(__file__).resolve().parents[1]

SCRIPT = """
import json, sys
from itertools import islice
from pathlib import Path
import torch.distributed as dist
from torch.utils.data import DataLoader
from support.datasets import SLICE_ID
from support.fakes import StoreBlobs
from rayform_server.store import Store
from rayform.slice import Slice
from rayform.torch import EpisodeDataset, EpisodeSampler

store_root, out_dir, phase, batches = sys.argv[1], Path(sys.argv[2]), sys.argv[3], int(sys.argv[4])
store = Store(store_root)
ref = store.get_slice(SLICE_ID)
sl = Slice(SLICE_ID, ref["manifest"], store.load_manifest(ref["manifest"]), StoreBlobs(store, Path(".")))

def build():
    ds = EpisodeDataset(sl, obs=["joints/position"], action="joints/position_delta", fps=10, seed=3)
    ds.set_epoch(2)
    return ds

early = build()  # built before init_process_group: shard='auto' saw one process
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
result = {}
try:
    next(iter(EpisodeSampler(early)))
except Exception as exc:
    result["early_error"] = str(exc)

ds = build()
sampler = EpisodeSampler(ds)
if phase == "resume":
    sampler.load_state_dict(json.loads((out_dir / "state.json").read_text()))
result["len"] = len(sampler)
loader = DataLoader(ds, batch_size=4, sampler=sampler, num_workers=1)
keys = []
for batch in islice(loader, batches if phase == "save" else None):
    keys += [[s, int(t)] for s, t in zip(batch["meta"]["segment"], batch["t_ns"].tolist())]
result["keys"] = keys
if phase == "save":
    state = sampler.state_dict(consumed=len(keys))
    result["state"] = state
    dist.barrier()  # every rank consumed the same number of batches
    if rank == 0:
        (out_dir / "state.json").write_text(json.dumps(state))
(out_dir / f"{phase}{rank}.json").write_text(json.dumps(result))
dist.barrier()
dist.destroy_process_group()
"""


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("elastic")
    slice_, _ = build_slice(root / "store", root / "cache", seconds=(3.0, 1.0, 2.0, 1.5, 2.5))
    script = root / "elastic.py"
    script.write_text(textwrap.dedent(SCRIPT))
    full = EpisodeDataset(
        slice_, obs=["joints/position"], action="joints/position_delta", fps=10, shard=None
    )
    everything = {
        (s["meta"]["segment"], int(s["t_ns"])) for s in full.__getitems__(list(range(len(full))))
    }
    return root, script, everything


def run_phase(
    root: Path, script: Path, out: Path, world: int, phase: str, batches: int
) -> list[dict]:
    torchrun(world, script, str(root / "store"), str(out), phase, str(batches))
    return [json.loads((out / f"{phase}{r}.json").read_text()) for r in range(world)]


@pytest.mark.slow
@pytest.mark.parametrize(("first", "second"), [(2, 3), (3, 2)])
def test_elastic_resume_sees_every_sample_once(
    store, tmp_path: Path, first: int, second: int
) -> None:
    root, script, everything = store
    saved = run_phase(root, script, tmp_path, first, "save", batches=3)
    resumed = run_phase(root, script, tmp_path, second, "resume", batches=0)
    # The state is global: every rank saved the same one.
    assert all(r["state"] == saved[0]["state"] for r in saved)
    assert saved[0]["state"]["history"] == [[first, 12]]
    # Equal lengths on every rank of each world (DDP would hang otherwise).
    assert len({len(r["keys"]) for r in saved}) == 1
    assert len({r["len"] for r in resumed}) == 1 and all(
        len(r["keys"]) == r["len"] for r in resumed
    )
    seen = Counter(tuple(k) for r in saved + resumed for k in r["keys"])
    assert set(seen) == everything
    assert sum(seen.values()) - len(everything) <= second - 1  # the documented end-of-epoch pad
    # A dataset built before init_process_group is refused, not read whole on every rank.
    assert all(
        "before torch.distributed was initialised" in r["early_error"] for r in saved + resumed
    )
