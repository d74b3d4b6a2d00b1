"""Renditions stored at ingest: encoded like the original, listed in the manifest, chosen for
a training resolution, pulled and read alone, verified like any blob."""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import av
import numpy as np
import pytest
import torch
from support import DEMO_SLICE, TOKEN, ServerProcess, make_client
from support.fakes import StoreBlobs
from support.manifests import open_written
from support.recordings import write_bag, write_lerobot_v21
from torch.utils.data import DataLoader

from rayform import InvalidArgumentError, OfflineError
from rayform._resolution import Target, choose_rendition
from rayform.errors import IntegrityError, ManifestError
from rayform.manifest import Manifest, manifest_hash
from rayform.manifest._rendcols import MAX_RENDITIONS as READERS_LIMIT
from rayform.slice import Slice
from rayform.torch import EpisodeDataset, EpisodeSampler
from rayform.torch._decoding._resize import resize_frames
from rayform_server._renditions import (
    MAX_RENDITIONS,
    RenditionSkipped,
    keyframe_interval,
    parse_heights,
    rendition_sizes,
)
from rayform_server.builder import SliceBuilder, VideoData
from rayform_server.demo import build_demo
from rayform_server.ingest import add_parser
from rayform_server.store import Store

CAMS = ["cam0/rgb", "wrist/rgb"]
OBS = [*CAMS, "joints/position"]
ACTION = "joints/position_delta"
KEYS = [0, 9, 31, 20, 57, 3]


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The small demo (96x128 cameras) with 48-pixel renditions; 200 is skipped
    (tests/test_manifest_v3.py reads its pages; these tests read its segments in memory)."""
    path = tmp_path_factory.mktemp("rend") / "root"
    with pytest.warns(RenditionSkipped, match="no 200-pixel rendition: the original is 128x96"):
        columnar = build_demo(path, DEMO_SLICE, small=True, renditions=(48, 200))
    assert columnar.format_version == 3
    return path


@pytest.fixture(scope="module")
def manifest(root: Path) -> Manifest:
    """The slice's segments as an in-memory manifest (``Manifest``)."""
    store = Store(root)
    m = store.load_manifest(store.get_slice(DEMO_SLICE)["manifest"]).to_v1()
    assert isinstance(m, Manifest) and manifest_hash(m) == store.get_slice(DEMO_SLICE)["manifest"]
    return m


@pytest.fixture(scope="module")
def server(root: Path) -> Iterator[ServerProcess]:
    server = ServerProcess(root)
    yield server
    server.stop()


def dataset(slice_: Slice, **kw) -> EpisodeDataset:
    """The tests' dataset over ``slice_``: both cameras, the joints, a 4-step chunk at 15 Hz."""
    return EpisodeDataset(slice_, obs=OBS, action=ACTION, fps=15, horizon=4, shard=None, **kw)


def local(root: Path, manifest: Manifest) -> tuple[Slice, StoreBlobs]:
    blobs = StoreBlobs(Store(root))
    return Slice(DEMO_SLICE, manifest_hash(manifest), manifest, blobs), blobs


# -- ingest --------------------------------------------------------------------------------------
def test_every_camera_gets_a_rendition_encoded_like_the_original(
    root: Path, manifest: Manifest
) -> None:
    store = Store(root)
    for seg in manifest.segments:
        for name in CAMS:
            st = seg.streams[name]
            assert [(r.height, r.width) for r in st.renditions] == [(48, 64)]
            path = store.blob_path(st.renditions[0].blob.hash)
            with av.open(str(path)) as c:
                v = c.streams.video[0]
                assert (v.frames, v.codec_context.height, v.codec_context.width) == (
                    st.count,
                    48,
                    64,
                )
                assert v.codec_context.name == "h264"
            assert (
                keyframe_interval(path)
                == keyframe_interval(store.blob_path(st.blob.hash))
                == st.gop
                == 1
            )
            assert path.stat().st_size == st.renditions[0].blob.size
        assert not seg.streams["joints/position"].renditions


def _rgb_frames(path: Path) -> torch.Tensor:
    """Every frame of the video at ``path``, ``uint8 (N, 3, H, W)``."""
    with av.open(str(path)) as c:
        frames = [f.to_ndarray(format="rgb24") for f in c.decode(c.streams.video[0])]
    return torch.from_numpy(np.stack(frames)).permute(0, 3, 1, 2)


def test_a_rendition_holds_the_originals_frames_scaled(root: Path, manifest: Manifest) -> None:
    # Frame i of the rendition is frame i of the original, scaled: close to resizing the
    # decoded original (antialiased bilinear), far from its neighbours and from a copy with
    # its colour channels swapped (a scale through the wrong plane order would be).
    store = Store(root)
    for name in CAMS:
        st = manifest.segments[0].streams[name]
        original = _rgb_frames(store.blob_path(st.blob.hash))
        rendition = _rgb_frames(store.blob_path(st.renditions[0].blob.hash))
        reference = torch.nn.functional.interpolate(
            original, size=(48, 64), mode="bilinear", antialias=True
        )

        def psnr(a: torch.Tensor, b: torch.Tensor) -> float:
            mse = ((a.double() - b.double()) ** 2).mean(dim=(1, 2, 3)).clamp_min(1e-12)
            return float((10 * torch.log10(255.0**2 / mse)).mean())

        assert rendition.shape == reference.shape
        same = psnr(rendition, reference)
        assert same > 30, (name, same)
        assert psnr(rendition[1:], reference[:-1]) < same - 1  # one frame off
        assert psnr(rendition.flip(1), reference) < same - 3  # BGR for RGB


def test_renditions_follow_the_originals_keyframe_interval(tmp_path: Path) -> None:
    store = Store(tmp_path / "root")
    frames = [np.full((64, 96, 3), 8 * i, np.uint8) for i in range(25)]
    t = np.arange(25, dtype=np.int64) * 33_000_000
    seg = SliceBuilder(store, gop=10, renditions=(32,)).add_segment(
        "seg_0a1b2c3d", site="x", streams=[VideoData("cam0/rgb", frames, t, 30.0)]
    )
    rendition = seg.streams["cam0/rgb"].renditions[0]
    assert (rendition.height, rendition.width) == (32, 48)
    assert keyframe_interval(store.blob_path(rendition.blob.hash)) == 10


def test_heights_are_checked_and_widths_keep_the_aspect_ratio() -> None:
    assert parse_heights("240,120, 240") == (120, 240)
    for bad in ("", "240,abc", "121", "0", "\u00b2", "24,\u0664\u0668"):  # "²", Arabic-Indic "48"
        with pytest.raises(InvalidArgumentError, match="--renditions|even number"):
            parse_heights(bad)
    assert READERS_LIMIT == MAX_RENDITIONS  # ingest writes no manifest the readers refuse
    assert len(parse_heights(",".join(str(h) for h in range(2, 33, 2)))) == MAX_RENDITIONS
    with pytest.raises(InvalidArgumentError, match=f"at most {MAX_RENDITIONS} renditions"):
        parse_heights(",".join(str(h) for h in range(2, 35, 2)))
    assert rendition_sizes(480, 640, (240, 120)) == [(120, 160), (240, 320)]
    assert rendition_sizes(180, 320, (90,)) == [(90, 160)]
    assert rendition_sizes(100, 150, (50,)) == [(50, 76)]  # 75 rounded to even
    with pytest.warns(RenditionSkipped):
        assert rendition_sizes(96, 128, (96,)) == []


# -- the manifest --------------------------------------------------------------------------------
def test_renditions_round_trip_in_memory_and_through_pages(
    manifest: Manifest, tmp_path: Path
) -> None:
    doc = json.loads(json.dumps(manifest.to_json()))
    again = Manifest.from_json(doc)
    assert again == manifest and manifest_hash(again) == manifest_hash(manifest)
    cam = doc["segments"][0]["streams"]["cam0/rgb"]
    assert cam["renditions"] == [{"blob": cam["renditions"][0]["blob"], "height": 48, "width": 64}]
    assert "renditions" not in doc["segments"][0]["streams"]["joints/position"]
    assert tuple(open_written(manifest, tmp_path).segments) == manifest.segments
    # Without renditions a stream's JSON has no key, and its page row an empty list.
    bare = json.loads(json.dumps(manifest.to_json()))
    for seg in bare["segments"]:
        for st in seg["streams"].values():
            st.pop("renditions", None)
    plain = Manifest.from_json(bare)
    assert all(not st.renditions for seg in plain.segments for st in seg.streams.values())
    assert "renditions" not in json.dumps(plain.to_json())
    assert manifest.blobs().keys() == plain.blobs().keys()  # blobs(): the originals
    assert manifest_hash(plain) != manifest_hash(manifest)
    (tmp_path / "plain").mkdir()
    opened = open_written(plain, tmp_path / "plain")
    assert tuple(opened.segments) == plain.segments and not opened.segments.has_renditions


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (lambda r: r.update(height=96), "below the original's 128x96"),
        (lambda r: r.update(width=63), "even sides"),
        (lambda r: r["blob"].update(hash="zz"), "malformed blob hash"),
    ],
)
def test_a_malformed_rendition_is_refused(manifest: Manifest, change, match: str) -> None:
    doc = json.loads(json.dumps(manifest.to_json()))
    change(doc["segments"][0]["streams"]["cam0/rgb"]["renditions"][0])
    with pytest.raises(ManifestError, match=match):
        Manifest.from_json(doc)


def test_renditions_commit_as_the_one_format(tmp_path: Path) -> None:
    store = Store(tmp_path / "root")
    b = SliceBuilder(store, renditions=(16,))
    b.add_segment(
        "seg_0a1b2c3d",
        site="x",
        streams=[
            VideoData(
                "cam0/rgb",
                [np.zeros((32, 48, 3), np.uint8)] * 3,
                np.arange(3, dtype=np.int64),
                30.0,
            )
        ],
    )
    m = b.commit("slc_0a1b2c3d")
    assert m.format_version == 3 and m.segments.has_renditions
    assert [r.height for r in m.segments[0].streams["cam0/rgb"].renditions] == [16]
    with pytest.raises(TypeError, match="format_version"):  # no other format to choose
        b.commit("slc_0a1b2c3d", format_version=1)  # type: ignore[call-arg]


# -- which rendition a dataset reads -------------------------------------------------------------
def test_the_smallest_rendition_that_covers_the_target_is_chosen(manifest: Manifest) -> None:
    st = manifest.segments[0].streams["cam0/rgb"]  # 96x128, rendition 48x64
    small = st.renditions[0]
    assert choose_rendition(st, Target(32, 32, "pad")) == small
    assert choose_rendition(st, Target(64, 64, "pad")) == small  # 48x64 of picture: exactly it
    assert choose_rendition(st, Target(40, 60, "squash")) == small
    assert choose_rendition(st, Target(48, 48, "crop")) == small  # the centre 48x48 of 48x64
    assert choose_rendition(st, Target(64, 64, "crop")) is None  # needs 64 rows: the original
    assert choose_rendition(st, Target(50, 60, "squash")) is None
    assert choose_rendition(st, None) is None


def test_the_dataset_reads_only_the_chosen_rendition(root: Path, manifest: Manifest) -> None:
    slice_, blobs = local(root, manifest)
    ds = dataset(slice_, image_size=(64, 64), resize="pad")
    got = torch.stack([s["cam0/rgb"] for s in ds.__getitems__(KEYS)])
    assert got.shape == (len(KEYS), 3, 64, 64)
    assert not got[:, :, :8].any() and not got[:, :, 56:].any()
    originals = {seg.streams[c].blob.hash for seg in manifest.segments for c in CAMS}
    renditions = {seg.streams[c].renditions[0].blob.hash for seg in manifest.segments for c in CAMS}
    assert blobs.asked & renditions and not blobs.asked & originals
    assert ds.describe()["renditions"] == {"cam0/rgb": "48x64", "wrist/rgb": "48x64"}
    # The same shapes from the original (a crop the rendition cannot cover), and its pixels
    # near the rendition's: the rendition is the resized original, encoded once more.
    full = dataset(local(root, manifest)[0])
    reference = resize_frames(
        torch.stack([s["cam0/rgb"] for s in full.__getitems__(KEYS)]), Target(64, 64, "pad")
    )
    mse = ((got.double() - reference.double()) ** 2).mean().item()
    assert 10 * np.log10(255**2 / mse) > 30
    crop = dataset(slice_, image_size=(64, 64), resize="crop")
    assert (
        crop[KEYS[0]]["cam0/rgb"].shape == (3, 64, 64)
        and crop.describe()["renditions"]["cam0/rgb"] == "original"
    )


def test_a_rendition_its_manifest_misdescribes_is_refused(root: Path, manifest: Manifest) -> None:
    # The bytes match their hash; the size the manifest gives does not match the frames in them.
    segments = []
    for seg in manifest.segments:
        st = seg.streams["cam0/rgb"]
        wrong = dataclasses.replace(st.renditions[0], height=40, width=54)
        streams = {**seg.streams, "cam0/rgb": dataclasses.replace(st, renditions=(wrong,))}
        segments.append(dataclasses.replace(seg, streams=streams))
    lying = Manifest(segments=tuple(segments), description="wrong rendition size")
    ds = dataset(
        Slice(DEMO_SLICE, manifest_hash(lying), lying, StoreBlobs(Store(root))), image_size=(32, 32)
    )
    with pytest.raises(IntegrityError, match=r"holds frames of 64x48, its manifest says 54x40"):
        ds[KEYS[0]]


# -- pull, offline, integrity --------------------------------------------------------------------
def test_pull_at_a_resolution_takes_only_those_renditions_and_training_runs_offline(
    server: ServerProcess, manifest: Manifest, tmp_path: Path
) -> None:
    client = make_client(server.url, tmp_path / "cache")
    report = client.pull(DEMO_SLICE, image_size=(32, 32), resize="pad")
    originals = {seg.streams[c].blob.hash for seg in manifest.segments for c in CAMS}
    renditions = {seg.streams[c].renditions[0].blob.hash for seg in manifest.segments for c in CAMS}
    cached = {
        h for h in manifest.blobs() | {r: None for r in renditions} if client.cache.has_blob(h)
    }
    assert renditions <= cached and not originals & cached
    assert report.bytes == sum(client.cache.get_blob(h).stat().st_size for h in cached)  # type: ignore[union-attr]

    offline = make_client(server.url, tmp_path / "cache", offline=True)
    slice_ = offline.slices.get(DEMO_SLICE)
    ds = dataset(slice_, image_size=(32, 32))
    assert ds[KEYS[1]]["wrist/rgb"].shape == (3, 32, 32)
    again = EpisodeDataset.from_uri(ds.uri, client=offline)
    assert torch.equal(again[KEYS[2]]["cam0/rgb"], ds[KEYS[2]]["cam0/rgb"])
    needs_original = EpisodeDataset(
        slice_, obs=OBS, action=ACTION, fps=15, shard=None, image_size=(64, 64), resize="crop"
    )
    with pytest.raises(  # no rendition covers 64x64 crop: the original, pulled at that size
        OfflineError,
        match=rf"original .*`rayform pull {DEMO_SLICE} --image-size 64x64 --resize crop "
        rf"--streams {' '.join([*OBS, ACTION])}`",
    ):
        needs_original[0]

    tables_only = make_client(server.url, tmp_path / "cache2")
    tables_only.pull(DEMO_SLICE, streams=["joints/position", ACTION, "cam0/rgb"])
    cold = make_client(server.url, tmp_path / "cache2", offline=True).slices.get(DEMO_SLICE)
    ds = EpisodeDataset(cold, obs=OBS, action=ACTION, fps=15, shard=None, image_size=(32, 32))
    with pytest.raises(
        OfflineError, match=rf"rayform pull {DEMO_SLICE} --image-size 32x32 --resize pad"
    ) as missing:
        ds[0]
    # The command the error names, run as printed, is all the dataset needs offline.
    text = str(missing.value)
    assert text.count("rayform pull") == 1 and str(tmp_path / "cache2") in text, text
    assert missing.value.__suppress_context__  # the cache's own (plain pull) text is not shown
    command = text.split("`")[1].split()
    assert command[:2] == ["rayform", "pull"]
    env = cli_env(server, tmp_path / "cache2")
    subprocess.run([sys.executable, "-m", "rayform", *command[1:], "-q"], env=env, check=True)
    assert ds[0]["cam0/rgb"].shape == (3, 32, 32)


def cli_env(server: ServerProcess, cache: Path) -> dict[str, str]:
    """The environment of a `rayform` subprocess reading ``server`` into ``cache``."""
    return {
        "RAYFORM_ENDPOINT": server.url,
        "RAYFORM_TOKEN": TOKEN,
        "RAYFORM_CACHE_DIR": str(cache),
        "PATH": "/usr/bin:/bin",
        "PYTHONPATH": ":".join(sys.path),
    }


def test_cli_pull_at_a_resolution(
    server: ServerProcess, manifest: Manifest, tmp_path: Path
) -> None:
    env = cli_env(server, tmp_path / "c")
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "rayform",
            "pull",
            DEMO_SLICE,
            "--image-size",
            "32x32",
            "--resize",
            "squash",
            "--json",
        ],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    report = json.loads(out.stdout)
    expected = make_client(server.url, tmp_path / "c2").pull(
        DEMO_SLICE, image_size=(32, 32), resize="squash"
    )
    assert (report["blobs"], report["bytes"]) == (expected.blobs, expected.bytes)
    assert report["bytes"] < sum(b.size for b in manifest.blobs().values())


def test_a_tampered_rendition_is_refused(root: Path, manifest: Manifest, tmp_path: Path) -> None:
    copy = tmp_path / "root"
    shutil.copytree(root, copy)
    ref = manifest.segments[0].streams["cam0/rgb"].renditions[0].blob
    path = Store(copy).blob_path(ref.hash)
    path.chmod(0o644)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    server = ServerProcess(copy)
    try:
        client = make_client(server.url, tmp_path / "cache")
        with pytest.raises(IntegrityError):
            client.pull(DEMO_SLICE, image_size=(32, 32))
        assert not client.cache.has_blob(ref.hash)
    finally:
        server.stop()


# -- ingest of recordings ------------------------------------------------------------------------
def _ingest_cli(*argv: str) -> int:
    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers())
    args = parser.parse_args(["ingest", *argv])
    return int(args.func(args))


def test_ingest_lerobot_and_mcap_store_renditions(tmp_path: Path, capsys) -> None:
    write_lerobot_v21(tmp_path / "v21")
    assert (
        _ingest_cli(
            "lerobot",
            "--root",
            str(tmp_path / "root"),
            "--slice",
            "slc_0000a002",
            "--quiet",
            "--renditions",
            "24",
            str(tmp_path / "v21"),
        )
        == 0
    )
    write_bag(tmp_path / "run.mcap")
    assert (
        _ingest_cli(
            "mcap",
            "--root",
            str(tmp_path / "root"),
            "--slice",
            "slc_0000a003",
            "--quiet",
            "--renditions",
            "32",
            str(tmp_path / "run.mcap"),
        )
        == 0
    )
    store = Store(tmp_path / "root")
    for slice_id, size in (("slc_0000a002", (24, 32)), ("slc_0000a003", (32, 42))):
        m = store.load_manifest(store.get_slice(slice_id)["manifest"])
        cams = [st for seg in m.segments for st in seg.streams.values() if st.kind == "video"]
        assert cams and all([(r.height, r.width) for r in st.renditions] == [size] for st in cams)
        for st in cams:
            with av.open(str(store.blob_path(st.renditions[0].blob.hash))) as c:
                assert c.streams.video[0].frames == st.count
    # Worker processes render the renditions of what they ingest: the serial ingest's manifest.
    assert (
        _ingest_cli(
            "lerobot",
            "--root",
            str(tmp_path / "root"),
            "--slice",
            "slc_0000a004",
            "--quiet",
            "--renditions",
            "24",
            "--jobs",
            "2",
            str(tmp_path / "v21"),
        )
        == 0
    )
    assert (
        store.get_slice("slc_0000a004")["manifest"] == store.get_slice("slc_0000a002")["manifest"]
    )  # type: ignore[index]
    assert store.load_manifest(store.get_slice("slc_0000a004")["manifest"]).format_version == 3  # type: ignore[index]
    # The same for MCAP files: two bags, serial and in two worker processes.
    write_bag(tmp_path / "run2.mcap", seed=2)
    bags = [str(tmp_path / "run.mcap"), str(tmp_path / "run2.mcap")]
    for slice_id, jobs in (("slc_0000a005", "1"), ("slc_0000a006", "2")):
        assert (
            _ingest_cli(
                "mcap",
                "--root",
                str(tmp_path / "root"),
                "--slice",
                slice_id,
                "--quiet",
                "--renditions",
                "32",
                "--jobs",
                jobs,
                *bags,
            )
            == 0
        )
    assert (
        store.get_slice("slc_0000a006")["manifest"] == store.get_slice("slc_0000a005")["manifest"]
    )  # type: ignore[index]


def test_read_ahead_and_the_cache_limit_count_only_the_renditions_read(
    server: ServerProcess, manifest: Manifest, tmp_path: Path
) -> None:
    segs = manifest.segments
    originals = {seg.streams[c].blob.hash for seg in segs for c in CAMS}
    renditions = {seg.streams[c].renditions[0].blob.hash for seg in segs for c in CAMS}
    # One episode's blobs at 32x32 fit under the limit; with the originals they do not.
    small = max(
        sum(
            r.size
            for n in OBS + [ACTION]
            for r in seg.streams[n].blobs()
            if r.hash not in originals
        )
        + sum(seg.streams[c].renditions[0].blob.size for c in CAMS)
        for seg in segs
    )
    full = max(sum(r.size for n in OBS + [ACTION] for r in seg.streams[n].blobs()) for seg in segs)
    assert small < full
    client = make_client(server.url, tmp_path / "cache", cache_limit=(small + full) // 2)
    slice_ = client.slices.get(DEMO_SLICE)
    with pytest.raises(InvalidArgumentError, match="cache limit"):
        EpisodeDataset(slice_, obs=OBS, action=ACTION, fps=15, shard=None)
    EpisodeDataset(slice_, obs=OBS, action=ACTION, fps=15, shard=None, image_size=(32, 32))
    # Read-ahead over a cold, unbounded cache (nothing is evicted): only renditions arrive.
    unbounded = make_client(server.url, tmp_path / "cache2")
    ds = EpisodeDataset(
        unbounded.slices.get(DEMO_SLICE),
        obs=OBS,
        action=ACTION,
        fps=15,
        shard=None,
        image_size=(32, 32),
    )
    loader = DataLoader(ds, batch_size=8, sampler=EpisodeSampler(ds, shuffle=True))
    assert sum(len(b["t_ns"]) for b in loader) == len(ds)
    assert not any(unbounded.cache.has_blob(h) for h in originals)
    assert all(unbounded.cache.has_blob(h) for h in renditions)
