"""Read-ahead: the blobs of the coming batches are fetched in the background, samples unchanged."""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import pytest
import torch
from support import DEMO_SLICE, TOKEN, ServerProcess, torchrun
from support.faultproxy import FaultProxy
from support.reliability import assert_cache_consistent
from torch.utils.data import DataLoader

import rayform
from rayform._net._fetchlog import fetch_log
from rayform.torch import EpisodeDataset, EpisodeSampler
from rayform.torch._blobs import segment_blobs

OBS = ["cam0/rgb", "joints/position"]
ACTION = "joints/position_delta"


def _dataset(url: str, cache: Path, **kw: object) -> EpisodeDataset:
    client = rayform.Client(endpoint=url, token=TOKEN, cache_dir=cache)
    return EpisodeDataset(
        client.slices.get(DEMO_SLICE), obs=OBS, action=ACTION, fps=15, horizon=4, **kw
    )


def _batches(ds: EpisodeDataset, epochs: int = 2, **kw: object) -> list[torch.Tensor]:
    out = []
    for epoch in range(epochs):
        ds.set_epoch(epoch)
        for b in DataLoader(ds, sampler=EpisodeSampler(ds), batch_size=8, **kw):
            out.append(
                torch.cat(
                    [b["cam0/rgb"].flatten().float(), b["action"].flatten(), b["t_ns"].float()]
                )
            )
    return out


def _shard_blobs(ds: EpisodeDataset, keys: list[int] | None = None) -> set[str]:
    """Hashes of the blobs the samples ``keys`` need (default: this rank's epoch-0 keys)."""
    if keys is None:
        keys = [k.sample for k in EpisodeSampler(ds)]
    segs = set(ds._index.locate(torch.tensor(keys).numpy())[0].tolist())
    return {h for s in segs for h in segment_blobs(ds._index.segments[s], [*OBS, ACTION])}


def _readahead_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "rayform-readahead"]


def test_same_samples_with_and_without_readahead_in_process(
    demo_server: ServerProcess, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="rayform.fetch")
    off = _batches(_dataset(demo_server.url, tmp_path / "off", readahead_bytes=0))
    before = fetch_log().total()
    with FaultProxy(demo_server.url) as proxy:
        proxy.throttle_s = 0.001  # a slow link: the next batches' blobs arrive while we decode
        ds = _dataset(proxy.url, tmp_path / "on")
        on = _batches(ds)
        assert ds._readahead.join(30)
        transfers = dict(proxy.stats.transfers)
    after = fetch_log().total()
    assert len(on) == len(off) and all(torch.equal(a, b) for a, b in zip(on, off, strict=True))
    assert after.ahead_bytes > before.ahead_bytes, "nothing was fetched ahead of need"
    assert set(transfers.values()) == {1}, "a blob crossed the wire twice"
    assert _readahead_threads() == [], "a read-ahead thread outlived the loader"
    assert "epoch 0: fetched" in caplog.text and "cache hits" in caplog.text  # the epoch summary
    assert_cache_consistent(tmp_path / "on")


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_same_samples_with_readahead_in_workers(
    demo_server: ServerProcess, tmp_path: Path, context: str
) -> None:
    off = _batches(_dataset(demo_server.url, tmp_path / "off", readahead_bytes=0), epochs=1)
    with FaultProxy(demo_server.url) as proxy:
        ds = _dataset(proxy.url, tmp_path / "on")
        ds[(0, 0)]  # the parent reads first (threads may start here): workers must not inherit them
        assert ds._readahead.join(30)
        on = _batches(ds, epochs=1, num_workers=2, multiprocessing_context=context)
        transfers = dict(proxy.stats.transfers)
    assert all(torch.equal(a, b) for a, b in zip(on, off, strict=True)) and len(on) == len(off)
    assert max(transfers.values()) <= 2  # two workers may race for one blob, never more
    assert_cache_consistent(tmp_path / "on")


def test_each_rank_prefetches_only_its_shard(demo_server: ServerProcess, tmp_path: Path) -> None:
    ds = _dataset(demo_server.url, tmp_path / "rank0", shard=(0, 2), decode_threads=2)
    mine = _shard_blobs(ds)
    _batches(ds, epochs=1)
    assert ds._readahead.join(30)
    cached = set(assert_cache_consistent(tmp_path / "rank0"))
    assert cached == mine and len(mine) < len(ds.slice.manifest.blobs([*OBS, ACTION]))


DDP_SCRIPT = f"""
import json, sys
from pathlib import Path
import torch.distributed as dist
from torch.utils.data import DataLoader
import rayform
from rayform.torch import EpisodeDataset, EpisodeSampler
from rayform.torch._blobs import segment_blobs

url, out = sys.argv[1], Path(sys.argv[2])
dist.init_process_group("gloo")
rank = dist.get_rank()
client = rayform.Client(endpoint=url, cache_dir=out / f"cache{{rank}}")
names = {[*OBS, ACTION]!r}
samples = {{}}
for ahead in (0, 1 << 30):
    ds = EpisodeDataset(client.slices.get("{DEMO_SLICE}"), obs=names[:-1], action=names[-1], fps=15,
                        horizon=4, readahead_bytes=ahead)
    loader = DataLoader(ds, batch_size=4, sampler=EpisodeSampler(ds), num_workers=1)
    samples[ahead] = [b["t_ns"].tolist() + b["cam0/rgb"].flatten()[::97].tolist() for b in loader]
    if ahead == 0:  # the read-ahead run starts from a cold cache
        import shutil; shutil.rmtree(out / f"cache{{rank}}" / "blobs")
import numpy as np
keys = np.array([k.sample for k in EpisodeSampler(ds)])
mine = sorted({{h for s in set(ds._index.locate(keys)[0].tolist())
               for h in segment_blobs(ds._index.segments[s], names)}})
cached = sorted(p.name for p in (out / f"cache{{rank}}" / "blobs").rglob("*") if p.is_file())
(out / f"rank{{rank}}.json").write_text(json.dumps({{"same": samples[0] == samples[1 << 30],
    "mine": mine, "cached": cached, "n": len(samples[0])}}))
dist.barrier()
dist.destroy_process_group()
"""


def test_readahead_under_torchrun_prefetches_each_ranks_shard(
    demo_server: ServerProcess, tmp_path: Path
) -> None:
    import json

    script = tmp_path / "ddp_readahead.py"
    script.write_text(DDP_SCRIPT)
    torchrun(2, script, demo_server.url, str(tmp_path), env={"RAYFORM_TOKEN": TOKEN})
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    for r in ranks:
        assert r["same"] and r["n"] > 0  # identical samples with and without read-ahead
        assert r["cached"] == r["mine"]  # each rank fetched its own shard's blobs, nothing else
    assert not set(ranks[0]["mine"]) & set(ranks[1]["mine"])


def test_readahead_after_a_resumed_sampler_state(
    demo_server: ServerProcess, tmp_path: Path
) -> None:
    # Uninterrupted epoch 1, read without read-ahead: the reference.
    ref = _dataset(demo_server.url, tmp_path / "ref", readahead_bytes=0)
    ref.set_epoch(1)
    whole = [b["t_ns"] for b in DataLoader(ref, sampler=EpisodeSampler(ref), batch_size=4)]
    # A checkpoint after 3 batches of epoch 1 (the sampler's position, nothing else).
    ds = _dataset(demo_server.url, tmp_path / "ckpt", readahead_bytes=0)
    ds.set_epoch(1)
    sampler = EpisodeSampler(ds)
    it = iter(sampler)
    first = [next(it).sample for _ in range(12)]
    state = sampler.state_dict(consumed=12)
    rest = [int(i) for i in sampler.next_indices(len(ds))]
    # Resume on a cold cache with read-ahead: it reads ahead from the resumed position.
    with FaultProxy(demo_server.url) as proxy:
        proxy.throttle_s = 0.001
        resumed = _dataset(proxy.url, tmp_path / "on")
        resumed.set_epoch(1)
        sampler = EpisodeSampler(resumed)
        sampler.load_state_dict(state)
        before = fetch_log().total()
        tail = [b["t_ns"] for b in DataLoader(resumed, sampler=sampler, batch_size=4)]
        assert resumed._readahead.join(30)
        after = fetch_log().total()
        transfers = dict(proxy.stats.transfers)
    got = torch.cat(tail)
    assert torch.equal(got, torch.cat(whole)[12:]) and len(rest) == len(got)  # same samples
    assert after.ahead_bytes > before.ahead_bytes, "a resumed epoch fell back to on-demand reads"
    assert set(transfers.values()) == {1}, "a blob crossed the wire twice"
    cached = set(assert_cache_consistent(tmp_path / "on"))
    assert cached == _shard_blobs(resumed, rest)  # only what the rest of the epoch reads
    assert first and _readahead_threads() == []
