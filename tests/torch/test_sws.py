"""Colour conversion straight into the caller's memory: PyAV's bits, or not used at all."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch
from support.frames import moving_frames, torchcodec_frames

from rayform.torch._decoding import _sws
from rayform.torch._decoding._intra import IntraDecoder, open_intra
from rayform_server._video import encode_video

# What the stream's VUI says (the decoder reports it as the frames' colour space and range).
TAGS = {
    "untagged": None,
    "bt709": "colormatrix=bt709:colorprim=bt709:transfer=bt709",
    "full-range": "fullrange=on",
    "bt601-full": "colormatrix=smpte170m:fullrange=on",
}


@pytest.fixture(params=list(TAGS), ids=list(TAGS))
def tagged(request, tmp_path) -> tuple[IntraDecoder, object]:
    path = tmp_path / "v.mp4"
    encode_video(moving_frames(8, 48, 64), path, rate_hz=30, gop=1, x264_params=TAGS[request.param])
    dec = open_intra(path)
    assert isinstance(dec, IntraDecoder)
    return dec, path


def test_every_path_writes_the_general_decoders_bits_in_place(tagged) -> None:
    tagged, path = tagged
    want = torchcodec_frames(path, list(range(8)))
    rows = torch.empty((8, 3, 48, 64), dtype=torch.uint8)
    tagged.get_frames_at(list(range(8)), rows=[[r] for r in rows])
    assert torch.equal(rows, want)
    packed = np.empty((8, 48, 64, 3), dtype=np.uint8)
    tagged.get_frames_at(list(range(8)), out=packed)
    assert torch.equal(torch.from_numpy(packed).permute(0, 3, 1, 2), want)
    rgba = np.zeros((8, 48, 64, 4), dtype=np.uint8)
    tagged.get_frames_at(list(range(8)), out=rgba)
    assert torch.equal(torch.from_numpy(rgba[..., :3]).permute(0, 3, 1, 2), want)
    assert (rgba[..., 3] == 255).all()
    # The direct converter passed its check for all three layouts, so frames 1-7 went through
    # it (were it refused, the frames above would still be right, but this would fail).
    frame = tagged._frame(0)
    kind = (frame.format.name, 64, 48, int(frame.colorspace), int(frame.color_range))
    assert all(_sws.checked()[(f, *kind)] for f in ("gbrp", "rgb24", "rgba"))


def test_a_converter_that_disagrees_with_pyav_is_not_used(tagged) -> None:
    tagged, path = tagged
    frame = tagged._frame(3)
    reference = np.empty((3, 48, 64), dtype=np.uint8)
    tagged._pyav_convert(frame, "gbrp", reference)
    assert isinstance(_sws.converter(frame, "gbrp", reference), _sws.Converter)
    reference[1, 20, 30] ^= 1  # one bit of one pixel
    assert _sws.converter(frame, "gbrp", reference) is None


def test_into_refuses_memory_it_cannot_fill_before_writing(tagged) -> None:
    tagged, path = tagged
    frame = tagged._frame(0)
    reference = np.empty((48, 64, 4), dtype=np.uint8)
    tagged._pyav_convert(frame, "rgba", reference)
    conv = _sws.converter(frame, "rgba", reference)
    assert conv is not None
    wide = np.zeros((48, 128, 4), dtype=np.uint8)
    for bad in (
        wide[:, ::2],  # the right shape, not contiguous
        np.zeros((48, 64, 3), dtype=np.uint8),  # three channels, not four
        np.zeros((48, 64, 4), dtype=np.int16),
    ):
        with pytest.raises(ValueError, match="contiguous"):
            conv.into(frame, bad)
    assert not wide.any()  # nothing was written around the refused view
    readonly = np.zeros((48, 64, 4), dtype=np.uint8)
    readonly.flags.writeable = False
    with pytest.raises(ValueError):
        conv.into(frame, readonly)
    assert not readonly.any()


def test_a_decoder_given_non_contiguous_rows_still_gets_the_bits(tagged) -> None:
    tagged, path = tagged
    want = torchcodec_frames(path, [2, 5])
    wide = torch.zeros((2, 3, 48, 128), dtype=torch.uint8)
    rows = [[wide[0, :, :, ::2]], [wide[1, :, :, ::2]]]
    tagged.get_frames_at([2, 5], rows=rows)
    assert torch.equal(wide[:, :, :, ::2], want)
    assert not wide[:, :, :, 1::2].any()


@pytest.mark.parametrize("width", [64, 128, 192, 320, 640])
@pytest.mark.parametrize("fmt", ["gbrp", "rgb24", "rgba"])
def test_nothing_is_written_past_the_destination(tmp_path, width, fmt) -> None:
    path = tmp_path / "v.mp4"
    encode_video(moving_frames(2, 32, width), path, rate_hz=30, gop=1)
    dec = open_intra(path)
    assert dec is not None
    frame = dec._frame(1)
    shape = (3, 32, width) if fmt == "gbrp" else (32, width, 3 if fmt == "rgb24" else 4)
    reference = np.empty(shape, dtype=np.uint8)
    dec._pyav_convert(frame, fmt, reference)
    conv = _sws.converter(frame, fmt, reference)
    assert conv is not None
    size = reference.size
    guarded = np.full(size + 4096, 0xAB, dtype=np.uint8)  # the destination, then a guard
    conv.into(frame, guarded[:size].reshape(shape))
    assert np.array_equal(guarded[:size].reshape(shape), reference)
    assert (guarded[size:] == 0xAB).all()


@pytest.mark.parametrize("width", [120, 102, 96])
def test_widths_off_the_block_keep_pyavs_path(tmp_path, width) -> None:
    path = tmp_path / "v.mp4"
    encode_video(moving_frames(2, 32, width), path, rate_hz=30, gop=1)
    dec = open_intra(path)
    assert dec is not None
    frame = dec._frame(0)
    reference = np.empty((32, width, 3), dtype=np.uint8)
    dec._pyav_convert(frame, "rgb24", reference)
    assert _sws.converter(frame, "rgb24", reference) is None
    packed = np.empty((2, 32, width, 3), dtype=np.uint8)
    dec.get_frames_at([0, 1], out=packed)
    assert torch.equal(
        torch.from_numpy(packed).permute(0, 3, 1, 2), torchcodec_frames(path, [0, 1])
    )


def test_one_check_per_kind_of_frame_and_thread_not_per_decoder(tmp_path, monkeypatch) -> None:
    path = tmp_path / "v.mp4"
    encode_video(moving_frames(6, 48, 64), path, rate_hz=30, gop=1)
    calls = []
    pyav = IntraDecoder._pyav_convert
    monkeypatch.setattr(
        IntraDecoder, "_pyav_convert", lambda self, *a: (calls.append(a[1]), pyav(self, *a))
    )
    _sws.forget()
    want = torchcodec_frames(path, list(range(6)))
    for _ in range(3):  # a decoder per video opened again and again, as an LRU of them does
        dec = open_intra(path)
        assert dec is not None
        assert torch.equal(dec.get_frames_at(list(range(6))), want)
    assert calls == ["gbrp"]  # the first frame, then its check; 17 frames straight in
    seen: list[dict] = []
    worker = threading.Thread(
        target=lambda: (open_intra(path).get_frames_at([1]), seen.append(_sws.checked()))
    )
    worker.start()
    worker.join()
    assert calls == ["gbrp", "gbrp"] and list(seen[0].values()) == [True]
