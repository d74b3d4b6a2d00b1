"""A bounded cache during training: LRU eviction racing readers and a puller on one cache."""

from __future__ import annotations

import fcntl
import hashlib
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from support import DEMO_SLICE, SCRIPTS, TOKEN, ServerProcess
from support.reliability import assert_cache_consistent, pull_cmd, sub_env
from torch.utils.data import DataLoader

import rayform
from rayform.cache import _evict
from rayform.cache._evict import Pins, evict_lru
from rayform.errors import InvalidArgumentError, OfflineError
from rayform.torch import EpisodeDataset

OBS = ["wrist/rgb", "joints/position"]
ACTION = "joints/position_delta"

# One reader: an epoch over the demo slice; prints a digest of every sample it saw.
READER = SCRIPTS / "limit_reader.py"  # prints a digest of one epoch; on stderr, blobs evicted


def _blob_bytes(cache: Path) -> int:
    total = 0
    for p in (cache / "blobs").rglob("*"):
        try:
            total += p.stat().st_size if p.is_file() else 0
        except FileNotFoundError:
            pass
    return total


def _reader(url: str, cache: Path, limit: int | None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            sys.executable,
            str(READER),
            url,
            str(cache),
            str(limit or "none"),
            DEMO_SLICE,
            ACTION,
            *OBS,
        ],
        env=sub_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_eviction_races_four_readers_and_a_puller(
    demo_server: ServerProcess, tmp_path: Path
) -> None:
    ref_proc = _reader(demo_server.url, tmp_path / "unbounded", None)
    want, err = ref_proc.communicate(timeout=120)
    assert ref_proc.returncode == 0, err
    slice_ = rayform.Client(
        endpoint=demo_server.url, token=TOKEN, cache_dir=tmp_path / "x"
    ).slices.get(DEMO_SLICE)
    read = slice_.manifest.blobs([*OBS, ACTION])
    per_segment = max(
        sum(b.size for n in [*OBS, ACTION] for b in seg.streams[n].blobs())
        for seg in slice_.segments
    )
    limit = sum(r.size for r in read.values()) // 2  # half of what the readers need
    assert limit > per_segment

    cache = tmp_path / "shared"
    peak = [0]
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], _blob_bytes(cache))
            time.sleep(0.005)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        readers = [_reader(demo_server.url, cache, limit) for _ in range(4)]
        puller = subprocess.run(
            pull_cmd(demo_server.url, cache, "--streams", "ee/pose", "--max-cache", str(limit)),
            env=sub_env(),
            capture_output=True,
            text=True,
            timeout=120,
        )
        outs = [p.communicate(timeout=240) for p in readers]
    finally:
        stop.set()
        watcher.join()
    for p, (out, err) in zip(readers, outs, strict=True):
        assert p.returncode == 0, err
        assert out.strip() == want.strip(), "a reader saw different samples under eviction"
    assert puller.returncode == 0, puller.stderr
    assert_cache_consistent(cache)  # no corrupt or partial blob under a content name
    # Over the limit only by what is in flight: each of the 5 processes may hold one segment's
    # blobs pinned or just downloaded before its eviction pass. Whether the peak crosses the
    # limit at all depends on timing, so only the upper bound is asserted.
    bound = limit + 5 * per_segment
    assert peak[0] <= bound, (limit, peak[0])
    assert _blob_bytes(cache) <= bound
    # Every reader read every blob (twice the limit) into one cache: readers had to evict.
    evicted = sum(int(err.rsplit("evicted ", 1)[1].split()[0]) for _, err in outs)
    assert evicted > 0, [err for _, err in outs]


def test_limit_below_one_segment_is_a_clear_error_up_front(
    demo_server: ServerProcess, tmp_path: Path
) -> None:
    client = rayform.Client(
        endpoint=demo_server.url, token=TOKEN, cache_dir=tmp_path / "c", cache_limit="50kB"
    )
    slice_ = client.slices.get(DEMO_SLICE)
    with pytest.raises(
        InvalidArgumentError,
        match=r"cache limit 48.8 KiB \(50000 bytes\) is smaller than "
        r"segment seg_\w+'s blobs .*raise cache_limit",
    ):
        EpisodeDataset(slice_, obs=OBS, action=ACTION, fps=15)
    assert not (tmp_path / "c" / "blobs").exists()  # nothing was fetched
    result = subprocess.run(
        pull_cmd(demo_server.url, tmp_path / "c", "--max-cache", "10kB"),
        env=sub_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1 and "rayform: error: the cache limit 9.8 KiB" in result.stderr
    assert "Traceback" not in result.stderr
    for bad in ("-1", "lots", "0"):
        with pytest.raises(InvalidArgumentError, match="cache"):
            rayform.Client(cache_dir=tmp_path / "c", cache_limit=bad)
    os.environ["RAYFORM_CACHE_LIMIT"] = "1.5MiB"  # the isolated_env fixture restores it
    try:
        assert rayform.Client(cache_dir=tmp_path / "c").cache_limit == 1572864
    finally:
        del os.environ["RAYFORM_CACHE_LIMIT"]


def test_pinned_blob_is_not_evicted_and_an_evicted_one_is_fetched_again(
    demo_server: ServerProcess,
    tmp_path: Path,
) -> None:
    cache = tmp_path / "c"
    client = rayform.Client(endpoint=demo_server.url, token=TOKEN, cache_dir=cache)
    slice_ = client.slices.get(DEMO_SLICE)
    refs = [seg.streams["joints/position"].blob for seg in slice_.segments]
    paths = [client.ensure_blob(DEMO_SLICE, r) for r in refs]
    pins = Pins(1)
    assert pins.pin(paths[0])
    report = evict_lru(cache, 0)  # evict everything that is not in use
    assert (report.evicted, report.skipped_in_use) == (3, 1)
    assert paths[0].is_file() and not any(p.is_file() for p in paths[1:])
    with open(paths[0], "rb") as held:  # a reader with the file open survives its eviction
        pins.close()
        assert evict_lru(cache, 0).evicted == 1 and not paths[0].exists()
        assert hashlib.blake2b(held.read()).digest()
    # Online: the evicted blob is fetched again; offline: a clear error naming `rayform pull`.
    assert client.ensure_blob(DEMO_SLICE, refs[1]).is_file()
    offline = rayform.Client(endpoint=demo_server.url, cache_dir=cache, offline=True)
    with pytest.raises(OfflineError, match=f"rayform pull {DEMO_SLICE}"):
        offline.ensure_blob(DEMO_SLICE, refs[2])


def test_two_epochs_under_a_limit_match_unlimited(
    demo_server: ServerProcess, tmp_path: Path
) -> None:
    def run(limit: int | None, cache: Path) -> list[bytes]:
        client = rayform.Client(
            endpoint=demo_server.url, token=TOKEN, cache_dir=cache, cache_limit=limit
        )
        ds = EpisodeDataset(
            client.slices.get(DEMO_SLICE), obs=OBS, action=ACTION, fps=15, horizon=4
        )
        out = []
        for _ in range(2):
            for batch in DataLoader(ds, batch_size=8):
                out.append(batch["wrist/rgb"].numpy().tobytes() + batch["action"].numpy().tobytes())
        return out

    limit = 150_000
    assert run(limit, tmp_path / "bounded") == run(None, tmp_path / "free")
    assert _blob_bytes(tmp_path / "bounded") <= limit + 3 * 110_000


def test_windowed_shuffle_fetches_each_blob_about_once_under_a_small_cache(
    demo_server: ServerProcess, tmp_path: Path
) -> None:
    from rayform._net._fetchlog import fetch_log
    from rayform.torch import EpisodeSampler

    def epoch_fetches(window: int | None, cache: Path, limit: int) -> tuple[int, int, list[bytes]]:
        client = rayform.Client(
            endpoint=demo_server.url, token=TOKEN, cache_dir=cache, cache_limit=limit
        )
        ds = EpisodeDataset(
            client.slices.get(DEMO_SLICE), obs=OBS, action=ACTION, fps=15, horizon=4
        )
        before = fetch_log().total()
        seen = []
        for batch in DataLoader(ds, batch_size=8, sampler=EpisodeSampler(ds, window=window)):
            seen += [t.numpy().tobytes() for t in batch["wrist/rgb"]]
        assert ds._readahead.join(30)
        after = fetch_log().total()
        return (
            after.fetched_bytes - before.fetched_bytes,
            after.ahead_bytes - before.ahead_bytes,
            seen,
        )

    probe = rayform.Client(endpoint=demo_server.url, token=TOKEN, cache_dir=tmp_path / "probe")
    slice_ = probe.slices.get(DEMO_SLICE)
    needed = sum(r.size for r in slice_.manifest.blobs([*OBS, ACTION]).values())
    per_segment = max(
        sum(b.size for n in [*OBS, ACTION] for b in seg.streams[n].blobs())
        for seg in slice_.segments
    )
    # Two episodes' blobs: the one being read and the next; read-ahead's 32 batches ahead
    # span the whole epoch here, so read-ahead must bound how far it looks.
    limit = 2 * per_segment
    assert limit < needed
    windowed, ahead, a = epoch_fetches(1, tmp_path / "windowed", limit)
    everywhere, _, b = epoch_fetches(None, tmp_path / "global", limit)
    assert ahead > 0  # read-ahead follows the windowed order
    assert sorted(a) == sorted(b)  # the same samples, in another order
    # One episode at a time: each blob crosses the wire about once. A shuffle over all
    # episodes keeps evicting what the next samples need.
    assert windowed <= 1.15 * needed, (windowed, needed)
    assert everywhere > 2 * windowed, (everywhere, windowed)


def test_under_a_limit_read_ahead_fetches_the_next_window_while_one_is_read(
    demo_server: ServerProcess, tmp_path: Path
) -> None:
    from rayform.torch import EpisodeSampler
    from rayform.torch._blobs import segment_blobs

    probe = rayform.Client(endpoint=demo_server.url, token=TOKEN, cache_dir=tmp_path / "probe")
    per_segment = max(
        sum(b.size for n in [*OBS, ACTION] for b in seg.streams[n].blobs())
        for seg in probe.slices.get(DEMO_SLICE).segments
    )
    # Windows of two episodes take half the limit; the other half is the next window's.
    client = rayform.Client(
        endpoint=demo_server.url,
        token=TOKEN,
        cache_dir=tmp_path / "cache",
        cache_limit=4 * per_segment + per_segment // 2,
    )
    ds = EpisodeDataset(client.slices.get(DEMO_SLICE), obs=OBS, action=ACTION, fps=15, horizon=4)
    sampler = EpisodeSampler(ds, window=2)
    keys = [k.sample for k in sampler]
    order = list(dict.fromkeys(ds._index.locate(torch.tensor(keys).numpy())[0].tolist()))
    assert len(order) >= 4
    in_first_window = sum(
        1 for e in ds._index.locate(torch.tensor(keys).numpy())[0] if e in order[:2]
    )
    assert in_first_window >= 8  # the two batches below read the first window only
    batches = iter(DataLoader(ds, batch_size=4, sampler=sampler))
    for _ in range(2):  # the first batch's own blobs fill what may be in flight
        assert next(batches)["t_ns"].shape == (4,)
        assert ds._readahead.join(30)
    following = order[2:4]  # the second window's episodes
    refs = [
        ref
        for s in following
        for ref in segment_blobs(ds._index.segments[s], [*OBS, ACTION]).values()
    ]
    missing = [ref.hash[:12] for ref in refs if client.would_fetch(ref)]
    assert missing == [], f"the next window's blobs were not fetched ahead: {missing}"
    # The reader and read-ahead share the process's pins: one marker per blob, and the
    # blobs fetched ahead are pinned in what the reader holds.
    markers = [p.name.split(".")[0] for p in (tmp_path / "cache" / "pins").iterdir()]
    assert markers and len(markers) == len(set(markers)), sorted(markers)
    reader_pins = ds._reader.pins()
    assert reader_pins is not None and all(reader_pins.holds(ref.hash) for ref in refs)
    assert_cache_consistent(tmp_path / "cache")


@pytest.mark.parametrize("image_size, decode_threads", [((24, 32), 0), (None, 2)])
def test_a_batch_over_many_episodes_reads_under_a_cache_of_one_episode(
    demo_server: ServerProcess, tmp_path: Path, image_size, decode_threads: int
) -> None:
    # A batch resolves all its episodes' blobs before it decodes them (to resize them in one
    # call; or in a decode pool): none may be evicted in between, though the cache holds
    # only about one episode.
    def run(limit: int | None, cache: Path) -> list[bytes]:
        client = rayform.Client(
            endpoint=demo_server.url, token=TOKEN, cache_dir=cache, cache_limit=limit
        )
        ds = EpisodeDataset(
            client.slices.get(DEMO_SLICE),
            obs=["cam0/rgb", *OBS],
            action=ACTION,
            fps=15,
            image_size=image_size,
            decode_threads=decode_threads,
        )
        shuffled = torch.randperm(len(ds), generator=torch.Generator().manual_seed(3))
        batches = DataLoader(ds, batch_size=8, sampler=shuffled.tolist())
        return [b["cam0/rgb"].numpy().tobytes() + b["wrist/rgb"].numpy().tobytes() for b in batches]

    probe = rayform.Client(endpoint=demo_server.url, token=TOKEN, cache_dir=tmp_path / "probe")
    slice_ = probe.slices.get(DEMO_SLICE)
    names = ["cam0/rgb", *OBS, ACTION]
    per_segment = max(
        sum(b.size for n in names for b in seg.streams[n].blobs()) for seg in slice_.segments
    )
    bounded = run(per_segment + per_segment // 4, tmp_path / "bounded")
    assert bounded == run(None, tmp_path / "free")


def test_a_prune_while_a_dataset_reads_fetches_what_it_removed(
    demo_server: ServerProcess, tmp_path: Path
) -> None:
    # No cache limit, so no pins: a `rayform cache prune` removes what the dataset read, and
    # a video opened again must be fetched again (it was a false "data on the server is broken").
    client = rayform.Client(endpoint=demo_server.url, token=TOKEN, cache_dir=tmp_path / "c")
    ds = EpisodeDataset(
        client.slices.get(DEMO_SLICE),
        obs=OBS,
        action=ACTION,
        fps=15,
        shard=None,
        decoder_cache_size=1,  # the last episode's video closes the first's
    )
    first = ds[0]
    ds[len(ds) - 1]
    assert client.cache.prune(0)
    again = ds[0]
    assert torch.equal(again["wrist/rgb"], first["wrist/rgb"])


def test_a_pin_that_loses_the_race_with_an_eviction_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Another process evicts the blob between the pin's open and its lock: the pin must not
    # claim to hold it (the reader then fetches it again instead of reading a removed file).
    blob = tmp_path / "ab" / ("ab" * 32)
    blob.parent.mkdir()
    blob.write_bytes(b"data")
    real, raced = fcntl.flock, []

    def evicted_first(fd: int, op: int) -> None:
        if not raced:
            raced.append(blob.unlink())
        real(fd, op)

    monkeypatch.setattr(_evict.fcntl, "flock", evicted_first)
    pins = Pins(4)
    assert pins.pin(blob) is False and pins.pinned() == set()
    blob.write_bytes(b"data")  # fetched again
    assert pins.pin(blob) is True and pins.pinned() == {blob.name}
    pins.close()
