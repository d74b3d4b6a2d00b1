"""Statistics of any selection from per-episode partials (docs/curation.md): equal to a pass
over every sample, label filters included; partials reused across selections (the table blobs
they came from may be gone); a damaged pack or result file ignored and recomputed; the CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support import DEMO_SLICE, TOKEN, WRITE_TOKEN, ServerProcess

import rayform
from rayform.cache import Cache
from rayform.torch import EpisodeDataset
from rayform.torch._stats import sorted_quantile

OBS = ["cam0/rgb", "joints/position", "ee/pose"]
ACTION = "joints/position_delta"
TABLES = ["ee/pose", "joints/position", ACTION]


def _dataset(slice_: Any, **kw: Any) -> EpisodeDataset:
    return EpisodeDataset(slice_, obs=OBS, action=ACTION, fps=15, frame="opencv", **kw)


def _oracle(ds: EpisodeDataset) -> dict[str, dict[str, Any]]:
    """The statistics of every sample the dataset yields, with numpy, from its samples."""
    items = ds.__getitems__(list(range(len(ds))))
    values = {
        "joints/position": np.stack([s["joints/position"].numpy() for s in items]),
        "ee/pose": np.stack([s["ee/pose"].numpy() for s in items]),
        ACTION: np.stack([s["action"][0].numpy() for s in items]),
    }
    out = {}
    for name, v in values.items():
        v = v.astype(np.float64)
        out[name] = {
            "mean": v.mean(axis=0),
            "std": v.std(axis=0),
            "min": v.min(axis=0),
            "max": v.max(axis=0),
            "q01": np.quantile(v, 0.01, axis=0),
            "q99": np.quantile(v, 0.99, axis=0),
            "count": len(v),
        }
    return out


def _assert_equal(stats: dict[str, dict[str, Any]], want: dict[str, dict[str, Any]]) -> None:
    assert set(stats) == set(want)
    for name, entry in want.items():
        got = stats[name]
        assert got["count"] == entry["count"]
        for key in ("min", "max", "q01", "q99"):  # order statistics: the same numbers
            assert np.array_equal(np.asarray(got[key]), entry[key]), (name, key)
        for key in ("mean", "std"):  # merged moments: equal to float64 rounding
            np.testing.assert_allclose(got[key], entry[key], rtol=1e-9, atol=1e-12)


def _table_blobs(slice_: Any, positions: list[int]) -> list[str]:
    return [slice_.segments[i].streams[name].blob.hash for i in positions for name in TABLES]


def _packs(cache: Path) -> list[Path]:
    return sorted((cache / "stats" / "packs").rglob("*.pack"))


def test_selections_equal_a_full_pass_and_reuse_partials(
    write_server: ServerProcess, tmp_path: Path
) -> None:
    cache = tmp_path / "c"
    client = rayform.Client(endpoint=write_server.url, token=WRITE_TOKEN, cache_dir=cache)
    slice_ = client.slices.get(DEMO_SLICE)
    ids = [str(i) for i in slice_.segments.ids().to_pylist()]
    slice_.label_all({ids[0]: {"success": True}, ids[2]: {"success": True}})
    first = slice_.select(segments=ids[:2])
    assert len(_dataset(first)) > 0
    stats = _dataset(first).stats()
    _assert_equal(stats, _oracle(_dataset(first)))
    assert len(_packs(cache)) == 1

    # The first two episodes' table blobs leave the cache: a selection that reads their
    # partials fetches none of them again.
    store = Cache(cache)
    gone = _table_blobs(slice_, [0, 1])
    for digest in gone:
        store.blob_path(digest).unlink()
    for f in (cache / "stats").glob("*.json"):
        f.unlink()  # not the selection's whole result: its episodes' partials
    assert _dataset(slice_.select(segments=ids[:2])).stats() == stats
    one = _dataset(slice_.select(segments=[ids[1]])).stats()
    assert one["joints/position"]["count"] < stats["joints/position"]["count"]
    # A label filter over episodes 0 and 2: episode 0 from its partial, episode 2 from its
    # table blobs, whose partial is then kept too.
    labelled = slice_.select(where="success")
    assert [str(i) for i in labelled.segments.ids().to_pylist()] == [ids[0], ids[2]]
    filtered = _dataset(labelled).stats()
    assert not any(store.has_blob(digest) for digest in gone)
    assert len(_packs(cache)) == 2
    _assert_equal(filtered, _oracle(_dataset(labelled)))  # the oracle fetches them again


def test_a_damaged_pack_or_result_is_ignored_and_recomputed(
    demo_server: ServerProcess, tmp_path: Path
) -> None:
    cache = tmp_path / "c"
    slice_ = rayform.Client(endpoint=demo_server.url, token=TOKEN, cache_dir=cache).slices.get(
        DEMO_SLICE
    )
    stats = _dataset(slice_).stats()
    (result,) = (cache / "stats").glob("*.json")
    (pack,) = _packs(cache)
    good = pack.read_bytes()
    result.chmod(0o644)
    result.write_text('{"joints/position": ')  # cut short
    raw = bytearray(good)
    raw[len(raw) // 2] ^= 0xFF  # a changed byte among the samples
    pack.chmod(0o644)
    pack.write_bytes(bytes(raw))
    assert _dataset(slice_).stats() == stats
    # The damaged pack was removed and the same one, content-addressed, written again.
    assert _packs(cache) == [pack] and pack.read_bytes() == good
    assert json.loads(result.read_text()) == json.loads(json.dumps(stats))

    pack.chmod(0o644)
    pack.write_bytes(good[:100])  # cut short
    result.unlink()
    assert _dataset(slice_).stats() == stats
    assert _packs(cache) == [pack] and pack.read_bytes() == good


def test_slices_stats_command(demo_server: ServerProcess, tmp_path: Path) -> None:
    cache = tmp_path / "c"
    env = {
        **os.environ,
        "RAYFORM_ENDPOINT": demo_server.url,
        "RAYFORM_TOKEN": TOKEN,
        "RAYFORM_CACHE_DIR": str(cache),
    }
    base = [sys.executable, "-m", "rayform", "slices", "stats", DEMO_SLICE]
    base += ["--streams", *OBS, "--action", ACTION, "--fps", "15", "--frame", "opencv"]

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*base, *args], env=env, capture_output=True, text=True, timeout=300)

    out = run("--json", "--sites", "lab-zurich")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    slice_ = rayform.Client(endpoint=demo_server.url, token=TOKEN, cache_dir=cache).slices.get(
        DEMO_SLICE
    )
    zurich = slice_.select(sites=["lab-zurich"])
    assert doc["episodes"] == len(zurich) < len(slice_)
    assert doc["streams"] == json.loads(json.dumps(_dataset(zurich).stats()))
    assert doc["cameras_without_statistics"] == ["cam0/rgb"]

    text = run()
    assert text.returncode == 0, text.stderr
    lines = text.stdout.splitlines()
    assert lines[0].startswith(f"{DEMO_SLICE}: {len(slice_)} episodes, ")
    assert f"{ACTION} (action, " in text.stdout
    header = lines[lines.index(next(x for x in lines if x.startswith("joints/position ("))) + 1]
    assert header.split() == ["i", "mean", "std", "min", "max", "q01", "q99"]
    assert "cam0/rgb" in lines[-1] and "fixed constants" in lines[-1]

    bad = run("--where", "quality >")
    assert bad.returncode == 1 and bad.stderr.startswith("rayform: error:")
    helped = subprocess.run(
        [sys.executable, "-m", "rayform", "slices", "stats", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert helped.returncode == 0 and "q01" in helped.stdout and "--where" in helped.stdout


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_sorted_quantile_is_numpys(dtype: type) -> None:
    """The quantiles read off sorted rows are numpy's own, bit for bit (ties, NaN, tiny N)."""
    rng = np.random.default_rng(7)
    for n in (1, 2, 3, 99, 100, 101, 1000):
        x = (rng.standard_normal((n, 4)) * 10.0 ** rng.integers(-4, 5)).astype(dtype)
        x[:, 1] = np.round(x[:, 1], 1)  # ties
        x[:, 2] = 0.5
        if n > 3:
            x[n // 2, 3] = np.nan
        ordered = np.ascontiguousarray(x.T)
        ordered.sort(axis=1)
        for q in (0.0, 0.01, 0.25, 0.5, 0.99, 1.0):
            want = np.quantile(x.astype(np.float64), q, axis=0)
            assert np.array_equal(sorted_quantile(ordered, q), want, equal_nan=True), (n, q)


def test_a_read_only_cache_computes_and_keeps_nothing(
    demo_server: ServerProcess, tmp_path: Path
) -> None:
    filled, cache = tmp_path / "c", tmp_path / "ro"
    rayform.Client(endpoint=demo_server.url, token=TOKEN, cache_dir=filled).slices.get(
        DEMO_SLICE
    ).pull(streams=TABLES)
    cache.mkdir()
    # The same cache seen through a read-only bind mount (as root, modes alone do not stop a
    # write).
    subprocess.run(["mount", "--bind", str(filled), str(cache)], check=True)
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(cache)], check=True)
        offline = rayform.Client(cache_dir=cache, offline=True).slices.get(DEMO_SLICE)
        stats = _dataset(offline).stats()
        assert stats["joints/position"]["count"] == len(_dataset(offline))
        assert _dataset(offline).stats() == stats  # computed again: nothing was kept
        assert not (filled / "stats").exists()
    finally:
        subprocess.run(["umount", "-l", str(cache)], check=False)
