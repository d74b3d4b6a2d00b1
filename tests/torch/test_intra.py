"""The all-intra packet decoder: the same bits as torchcodec, used only where it fits."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
import torch
from support.datasets import FPS, build_slice, decode_index_frame
from support.frames import moving_frames, torchcodec_frames
from torch.utils.data import DataLoader
from torchcodec.decoders import VideoDecoder

from rayform.torch import EpisodeDataset
from rayform.torch._decoding import _video as _decode
from rayform.torch._decoding._intra import IntraDecoder, open_intra
from rayform.torch._decoding._video import DecoderCache, forget_intra_checks, intra_checks
from rayform_server._video import encode_video


# 102 wide: planes padded to 112, and swscale's planar output is wrong there (packed path).
@pytest.mark.parametrize(
    "size", [(70, 102), (48, 64), (32, 120), (40, 640)], ids=lambda s: f"{s[0]}x{s[1]}"
)
def test_every_frame_matches_torchcodec(tmp_path, size) -> None:
    path = tmp_path / "v.mp4"
    encode_video(moving_frames(40, *size), path, rate_hz=30, gop=1)
    dec = open_intra(path)
    assert isinstance(dec, IntraDecoder) and len(dec) == 40
    order = [39, 0, 17, 18, 5, 5, 38]  # random access, repeats, both ends
    got = dec.get_frames_at(order)
    assert got.shape == (len(order), 3, *size) and got.dtype == torch.uint8 and got.is_contiguous()
    assert torch.equal(got, torchcodec_frames(path, order))
    assert torch.equal(dec.get_frames_at(list(range(40))), torchcodec_frames(path, list(range(40))))
    with pytest.raises(IndexError, match="outside the video's 40 frames"):
        dec.get_frames_at([40])


def test_only_all_intra_video_qualifies(tmp_path) -> None:
    path = tmp_path / "v.mp4"
    encode_video(moving_frames(40, 48, 64), path, rate_hz=30, gop=10)
    assert open_intra(path) is None


@pytest.fixture(scope="module")
def slices(tmp_path_factory) -> dict:
    """The dataset tests' slice with all-intra video (gop 1) and with gop 10."""
    out = {}
    for gop in (1, 10):
        root = tmp_path_factory.mktemp(f"gop{gop}")
        out[gop] = build_slice(root / "store", root / "cache", gop=gop)[0]
    return out


@pytest.fixture(params=[1, 10], ids=["gop1", "gop10"])
def gop_slice(request, slices):
    return request.param, slices[request.param]


@pytest.fixture
def fresh_checks():
    """The packet decoder's checks start empty, as in a fresh process, and whatever a test
    decides (e.g. with a broken decoder) is forgotten after it."""
    forget_intra_checks()
    yield
    forget_intra_checks()


def test_dataset_uses_it_for_all_intra_video_with_the_same_bits(gop_slice) -> None:
    gop, slice_ = gop_slice

    def read(backend):
        ds = EpisodeDataset(slice_, obs=["cam0/rgb"], action=None, fps=FPS, decoder_backend=backend)
        n = len(ds)
        keys = [0, 7, 3, n // 2, n // 2 + 1, n - 2, n - 1, 1]  # both episodes, random order
        return ds, torch.stack([s["cam0/rgb"] for s in ds.__getitems__(keys)])

    auto, frames = read(None)
    _, reference = read("torchcodec")
    assert torch.equal(frames, reference)
    assert [decode_index_frame(f.numpy()) for f in frames] == [
        decode_index_frame(f.numpy()) for f in reference
    ]
    assert set(auto.open_decoders()) == ({"intra"} if gop == 1 else {"torchcodec"})


def test_a_mismatch_with_the_general_decoder_keeps_the_general_one(
    slices, monkeypatch, fresh_checks
) -> None:
    slice_ = slices[1]
    real = IntraDecoder.get_frames_at
    monkeypatch.setattr(
        IntraDecoder, "get_frames_at", lambda self, idx: real(self, idx) ^ 1
    )  # off by one bit
    ds = EpisodeDataset(slice_, obs=["cam0/rgb"], action=None, fps=FPS)
    keys = [0, len(ds) // 2, len(ds) - 1]
    frames = torch.stack([s["cam0/rgb"] for s in ds.__getitems__(keys)])
    assert ds.open_decoders() and "intra" not in ds.open_decoders()
    assert list(intra_checks().values()) == [False]
    reference = EpisodeDataset(
        slice_, obs=["cam0/rgb"], action=None, fps=FPS, decoder_backend="torchcodec"
    )
    assert torch.equal(frames, torch.stack([s["cam0/rgb"] for s in reference.__getitems__(keys)]))


def test_forked_workers_and_threads_give_the_same_bits(gop_slice) -> None:
    _, slice_ = gop_slice

    def epoch(**kw):
        ds = EpisodeDataset(
            slice_,
            obs=["cam0/rgb"],
            action=None,
            fps=FPS,
            decode_threads=kw.pop("decode_threads", 0),
        )
        ds.__getitems__([0, 1])  # the parent opens decoders before the workers fork
        return torch.cat([b["cam0/rgb"] for b in DataLoader(ds, batch_size=16, **kw)])

    base = epoch()
    assert torch.equal(base, epoch(num_workers=2))
    assert torch.equal(base, epoch(decode_threads=2))


def test_decoder_cache_keeps_a_forced_backend(gop_slice) -> None:
    gop, slice_ = gop_slice
    seg = slice_.manifest.segments[0]
    path = slice_.blob_path(seg.streams["cam0/rgb"].blob)
    for backend in ("torchcodec", "pyav"):
        cache = DecoderCache(4, backend)
        cache.get_frames("k", path, np.array([0, 3]), 30.0)
        assert cache.open_backends() == [backend]


def test_the_check_runs_once_per_kind_of_video(tmp_path, monkeypatch, fresh_checks) -> None:
    checks = []
    real = _decode._general
    monkeypatch.setattr(_decode, "_general", lambda *a: checks.append(a[1]) or real(*a))
    paths = []
    for k, size in enumerate([(48, 64), (48, 64), (32, 96)]):
        paths.append(tmp_path / f"{k}.mp4")
        encode_video(moving_frames(12, *size), paths[-1], rate_hz=30, gop=1)
    cache = DecoderCache(8)
    for k, path in enumerate(paths):
        assert torch.equal(
            cache.get_frames(str(k), path, np.array([2, 11]), 30.0),
            torchcodec_frames(path, [2, 11]),
        )
    assert cache.open_backends() == ["intra"] * 3
    assert checks == [paths[0], paths[2]]  # the second 48x64 video reuses the first one's check
    assert list(intra_checks().values()) == [True, True]


def write_video(path, pts: list[int], container: str, size=(48, 64)) -> None:
    """All-intra H.264 with the given presentation times in 1/30 s."""
    import av

    with av.open(str(path), "w", format=container) as out:
        stream = out.add_stream("libx264", rate=30, options={"g": "1", "bf": "0"})
        stream.height, stream.width = size
        stream.pix_fmt = "yuv420p"
        stream.codec_context.time_base = Fraction(1, 30)
        for t, rgb in zip(pts, moving_frames(len(pts), *size), strict=True):
            frame = av.VideoFrame.from_ndarray(rgb, format="rgb24")
            frame.pts = t
            out.mux(stream.encode(frame))
        out.mux(stream.encode(None))


def test_only_mp4_at_a_constant_rate_qualifies(tmp_path) -> None:
    write_video(tmp_path / "cfr.mp4", list(range(20)), "mp4")
    dec = open_intra(tmp_path / "cfr.mp4")
    assert dec is not None and len(dec) == 20
    assert torch.equal(
        dec.get_frames_at([19, 0, 7]), torchcodec_frames(tmp_path / "cfr.mp4", [19, 0, 7])
    )
    write_video(tmp_path / "vfr.mp4", [0, 1, 2, 4, 5, 6, 8, 9], "mp4")
    assert open_intra(tmp_path / "vfr.mp4") is None
    write_video(tmp_path / "cfr.mkv", list(range(20)), "matroska")  # positions are not the frames'
    assert open_intra(tmp_path / "cfr.mkv") is None


@pytest.mark.parametrize(
    "edit",
    [
        ["-itsoffset", "0.5", "-i", "{src}"],
        ["-ss", "0.2", "-i", "{src}", "-avoid_negative_ts", "make_zero"],
    ],
    ids=["delayed", "cut"],
)
def test_mp4_with_an_edit_list_still_matches_torchcodec(tmp_path, edit) -> None:
    import shutil
    import subprocess

    src, dst = tmp_path / "src.mp4", tmp_path / "edited.mp4"
    encode_video(moving_frames(20, 48, 64), src, rate_hz=30, gop=1)
    subprocess.run(
        [
            shutil.which("ffmpeg") or "ffmpeg",
            "-v",
            "error",
            "-y",
            *(a.format(src=src) for a in edit),
            "-c",
            "copy",
            str(dst),
        ],
        check=True,
    )
    dec = open_intra(dst)
    general = VideoDecoder(str(dst), seek_mode="approximate")
    assert dec is not None and len(dec) == general.metadata.num_frames
    every = list(range(len(dec)))
    assert torch.equal(dec.get_frames_at(every), general.get_frames_at(every).data)
