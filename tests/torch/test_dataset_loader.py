"""EpisodeDataset with DataLoader: determinism, epochs, workers, large manifests."""

from __future__ import annotations

import gc
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import torch
from support import DEMO_SLICE, SCRIPTS
from support.datasets import FPS, SLICE_ID, build_slice, decode_index_frame
from support.determinism import ACTION, OBS, digest_epoch, make
from support.fakes import StoreBlobs
from torch.utils.data import DataLoader

import rayform
from rayform.errors import OfflineError
from rayform.manifest import BlobRef, Manifest, Segment, Stream
from rayform.slice import Slice
from rayform.torch import EpisodeDataset, EpisodeSampler
from rayform.torch._decoding._video import DecoderCache

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("loader")
    return build_slice(root / "store", root / "cache")


def test_same_bits_for_num_workers_0_and_2(data) -> None:
    slice_, _ = data
    results = []
    for workers in (0, 2):
        ds = make(slice_)
        ds.set_epoch(3)
        loader = DataLoader(ds, batch_size=8, sampler=EpisodeSampler(ds), num_workers=workers)
        results.append(digest_epoch(loader))
    assert results[0] == results[1]
    # Without a seed change the transform's randomness is the same; with another seed it is not.
    ds = make(slice_)
    ds.seed = 8
    ds.set_epoch(3)
    assert (
        digest_epoch(DataLoader(ds, batch_size=8, sampler=EpisodeSampler(ds)))[0] != results[0][0]
    )


def test_same_bits_across_processes(data) -> None:
    slice_, _ = data
    ds = make(slice_)
    ds.set_epoch(2)
    here = digest_epoch(DataLoader(ds, batch_size=8, sampler=EpisodeSampler(ds), num_workers=0))[0]
    # The same make() and digest_epoch() in a fresh process, on the same store.
    script = [str(SCRIPTS / "loader_digest.py"), str(HERE), str(slice_.client.store.root), SLICE_ID]
    out = subprocess.run([sys.executable, *script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == here


def test_set_epoch_changes_order_and_epoch_k_needs_no_replay(data) -> None:
    slice_, _ = data
    ds = make(slice_)
    loader = DataLoader(
        ds, batch_size=8, sampler=EpisodeSampler(ds), num_workers=2, persistent_workers=True
    )
    epochs = []
    for epoch in range(3):
        ds.set_epoch(epoch)
        epochs.append(digest_epoch(loader))
    orders = [o for _, o in epochs]
    assert orders[0] != orders[1] != orders[2]
    assert sorted(orders[0]) == sorted(orders[1])  # same samples, other order
    # Epoch 2 from scratch: same order and same transform randomness, even though the
    # persistent workers above kept the dataset copy they got at epoch 0.
    fresh = make(slice_)
    fresh.set_epoch(2)
    assert digest_epoch(DataLoader(fresh, batch_size=8, sampler=EpisodeSampler(fresh))) == epochs[2]


def test_set_epoch_reaches_persistent_workers_with_a_plain_loader(data) -> None:
    # The public docs' set-up: a plain DataLoader, persistent workers, set_epoch each epoch.
    # The workers' dataset copy was made at epoch 0; their transforms must still follow it.
    slice_, _ = data
    ds = make(slice_)
    loader = DataLoader(ds, batch_size=8, num_workers=2, persistent_workers=True)  # fixed order
    seen = []
    for epoch in range(3):
        ds.set_epoch(epoch)
        seen.append(digest_epoch(loader)[0])
    assert len(set(seen)) == 3  # the random transform changed with the epoch
    fresh = make(slice_)
    fresh.set_epoch(2)
    assert digest_epoch(DataLoader(fresh, batch_size=8))[0] == seen[2]


def test_workers_open_their_own_decoders(data) -> None:
    slice_, _ = data
    ds = EpisodeDataset(slice_, obs=OBS, action=ACTION, fps=FPS, decoder_cache_size=1)
    ds[0]  # the parent opens a decoder...
    opened = ds.open_decoders()
    assert len(opened) == 1
    loader = DataLoader(ds, batch_size=4, num_workers=2)  # ...the forked workers must not use it
    n = sum(len(b["t_ns"]) for b in loader)
    assert n == len(ds)
    assert ds.open_decoders() == opened  # the parent's own decoder, untouched by its workers


@pytest.mark.parametrize("backend", ["pyav", None])
def test_a_worker_collecting_a_dead_dataset_of_its_parent_does_not_hang(data, backend) -> None:
    # A dataset the parent read from, then dropped in a reference cycle that its collector
    # had not reached when a DataLoader forked: the worker's collector frees the cycle. Its
    # decoders must not be freed with it (FFmpeg's cleanup would wait forever there on
    # converter threads that exist only in the parent).
    slice_, _ = data
    gc.disable()
    try:
        dead = EpisodeDataset(slice_, obs=OBS, action=ACTION, fps=FPS, decoder_backend=backend)
        dead[0]
        dead.cycle = dead  # type: ignore[attr-defined]
        del dead
        pid = os.fork()
        if pid == 0:
            gc.collect()
            os._exit(0)
    finally:
        gc.enable()
    deadline = time.monotonic() + 60
    while os.waitpid(pid, os.WNOHANG) == (0, 0):
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            pytest.fail("the child's collector hung freeing its parent's decoders")
        time.sleep(0.05)


def test_decode_threads_give_the_same_bits(data, monkeypatch: pytest.MonkeyPatch) -> None:
    slice_, _ = data
    decoded_in: set[str] = set()
    get_frames = DecoderCache.get_frames

    def recording(self, *args, **kw):
        decoded_in.add(threading.current_thread().name)
        return get_frames(self, *args, **kw)

    monkeypatch.setattr(DecoderCache, "get_frames", recording)
    digests = []
    for threads, workers in ((0, 0), (2, 0), (2, 2)):
        ds = make(slice_, decode_threads=threads)
        ds.set_epoch(1)
        if workers:
            assert ds[3][
                "cam0/rgb"
            ].is_contiguous()  # the parent decoded in threads before the fork
        loader = DataLoader(ds, batch_size=8, sampler=EpisodeSampler(ds), num_workers=workers)
        digests.append(digest_epoch(loader))
        # No decode thread outlives a read, so forking workers is always safe.
        assert not [t for t in threading.enumerate() if t.name.startswith("rayform-decode")]
    assert digests[1] == digests[0]
    assert digests[2] == digests[0]
    assert "MainThread" in decoded_in
    assert any(name.startswith("rayform-decode") for name in decoded_in)
    with pytest.raises(rayform.errors.InvalidArgumentError, match="decode_threads"):
        make(slice_, decode_threads=-1)
    with pytest.raises(rayform.errors.InvalidArgumentError, match="decode_threads"):
        make(slice_, decode_threads=True)


def test_decoder_cache_is_thread_safe(data) -> None:
    slice_, _ = data
    stream = slice_.manifest.segments[0].streams["cam0/rgb"]
    path = Path(slice_.blob_path(stream.blob))
    # Two keys for one file and room for one decoder: threads evict what others are using,
    # and threads asking for the same key must take turns on its decoder.
    cache = DecoderCache(max_open=1)
    rng = np.random.default_rng(0)
    jobs = [np.unique(rng.integers(0, stream.count, 3)) for _ in range(48)]

    def run(j: int) -> tuple[list[int], list[int]]:
        frames = cache.get_frames("ab"[j % 2], path, jobs[j], stream.rate_hz)
        return [decode_index_frame(f.numpy()) for f in frames], jobs[j].tolist()

    with ThreadPoolExecutor(4) as pool:
        for got, want in pool.map(run, range(len(jobs))):
            assert got == want
    assert len(cache) == 1


def _synthetic_slice(n_segments: int) -> Slice:
    rng = np.random.default_rng(0)
    fake = BlobRef("0" * 64, 1)
    segments = []
    start = 1_000_000_000_000
    for i in range(n_segments):
        t0 = start + i * 100_000_000_000
        dur = int(rng.integers(5, 60) * 1e9)
        streams = {
            "cam0/rgb": Stream(
                "cam0/rgb",
                "video",
                fake,
                30.0,
                (96, 128, 3),
                "uint8",
                100,
                t0 + 3_000_000,
                t0 + dur,
                timestamps=fake,
            ),
            "joints/position": Stream(
                "joints/position", "table", fake, 100.0, (7,), "float32", 100, t0, t0 + dur + 5
            ),
            "joints/position_delta": Stream(
                "joints/position_delta",
                "table",
                fake,
                50.0,
                (7,),
                "float32",
                100,
                t0 + 1,
                t0 + dur + 9,
            ),
        }
        segments.append(Segment(f"seg_{i:08x}", 1, "lab", t0, t0 + dur + 9, streams))

    manifest = Manifest(tuple(segments))
    return Slice(SLICE_ID, "f" * 64, manifest, StoreBlobs(None))  # construction reads no blob


def test_construction_on_10000_segments_is_fast() -> None:
    slice_ = _synthetic_slice(10_000)
    t = time.perf_counter()
    ds = EpisodeDataset(slice_, obs=OBS, action=ACTION, fps=15, horizon=16)
    elapsed = time.perf_counter() - t
    # Loose bound (shared CI cores); the benchmark measures the real number.
    assert elapsed < 5.0
    assert len(ds) > 10_000 * 15 * 4
    assert sum(ds.segment_lengths.values()) == len(ds)


def test_store_client_is_only_asked_for_requested_streams(data, tmp_path: Path) -> None:
    slice_, _ = data
    blobs = StoreBlobs(slice_.client.store, tmp_path)
    sl = Slice(slice_.id, slice_.manifest_hash, slice_.manifest, blobs)
    ds = EpisodeDataset(sl, obs=["joints/position"], action=ACTION, fps=FPS)
    ds.__getitems__(list(range(len(ds))))
    wanted = set(sl.manifest.blobs(["joints/position", ACTION]))
    assert blobs.asked == wanted


# -- against the real server stub ---------------------------------------------------------------
DEMO_OBS = ["cam0/rgb", "wrist/rgb", "joints/position"]
DEMO_ACTION = "joints/position_delta"


def _no_sockets(*_args) -> None:
    """worker_init_fn: make any network socket in this worker fail loudly (Unix sockets,
    which DataLoader uses to pass tensors between processes, stay allowed)."""

    class Forbidden(socket.socket):
        def __init__(self, family=-1, type=-1, proto=-1, fileno=None):
            # Wrapping an inherited fd (fileno given) is multiprocessing's fd passing, not
            # a new connection; anything else that is not AF_UNIX would be network access.
            if fileno is None and family in (-1, socket.AF_INET, socket.AF_INET6):
                raise AssertionError("a DataLoader worker opened a network socket in offline mode")
            super().__init__(family, type, proto, fileno)

    socket.socket = Forbidden  # type: ignore[misc]


def test_loader_fetches_a_cold_slice_on_demand(client_env) -> None:
    client = rayform.Client()
    slice_ = client.slices.get(DEMO_SLICE)
    ds = EpisodeDataset(slice_, obs=DEMO_OBS, action=DEMO_ACTION, fps=15, horizon=16, frame="ros")
    wanted = slice_.manifest.blobs([*DEMO_OBS, DEMO_ACTION])
    assert not any(client.cache.has_blob(h) for h in wanted)  # cold
    loader = DataLoader(ds, batch_size=16, num_workers=2, persistent_workers=True, shuffle=True)
    for _epoch in range(2):
        seen = 0
        for batch in loader:
            assert batch["cam0/rgb"].dtype == torch.uint8 and batch["cam0/rgb"].shape[1] == 3
            assert batch["action"].shape[1:] == (16, batch["joints/position"].shape[1])
            seen += len(batch["t_ns"])
        assert seen == len(ds)
    assert all(client.cache.has_blob(h) for h in wanted)
    unused = set(slice_.manifest.blobs()) - set(wanted)
    assert not any(client.cache.has_blob(h) for h in unused)  # only the requested streams


def test_pulled_slice_offline_opens_no_socket(client_env, monkeypatch: pytest.MonkeyPatch) -> None:
    rayform.Client().pull(DEMO_SLICE, streams=[*DEMO_OBS, DEMO_ACTION])
    monkeypatch.setenv("RAYFORM_OFFLINE", "1")
    opened = []
    real = socket.socket

    class Recording(real):  # type: ignore[misc, valid-type]
        def __init__(self, family=-1, type=-1, proto=-1, fileno=None):
            if fileno is None:
                opened.append(family)
            super().__init__(family, type, proto, fileno)

    monkeypatch.setattr(socket, "socket", Recording)
    client = rayform.Client()
    slice_ = client.slices.get(DEMO_SLICE)
    ds = EpisodeDataset(slice_, obs=DEMO_OBS, action=DEMO_ACTION, fps=15, horizon=16)
    loader = DataLoader(
        ds, batch_size=16, num_workers=2, persistent_workers=True, worker_init_fn=_no_sockets
    )
    assert sum(len(b["t_ns"]) for b in loader) == len(ds)
    # DataLoader's own worker plumbing uses Unix socketpairs; no network socket may appear.
    assert not [f for f in opened if f in (-1, socket.AF_INET, socket.AF_INET6)]
    # A stream that was not pulled: a clear error naming the command, still no socket.
    extra = EpisodeDataset(slice_, obs=["ee/pose"], action=None, fps=15)
    with pytest.raises(OfflineError, match=f"rayform pull {DEMO_SLICE}"):
        extra[0]
    assert not [f for f in opened if f in (-1, socket.AF_INET, socket.AF_INET6)]
