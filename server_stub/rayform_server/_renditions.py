"""Renditions: smaller copies of a camera video, rendered at ingest from the stored original.

A model trains at 96-512 px; decoding a 480x640 frame to shrink it costs more than decoding a
frame stored at the size it needs. For each requested height below the original's, the stored
original is decoded and each frame scaled to that height and the width that keeps the aspect
ratio (rounded to even, as H.264 4:2:0 needs), in YUV as stored, with FFmpeg's bilinear scaler
(which, shrinking, filters over each output pixel's whole footprint, as ``torch.nn.functional.
interpolate(mode="bilinear", antialias=True)`` does). It is encoded with the original's
structure: the same codec, frame rate and keyframe interval, no B-frames, so the packet decoder
and random access work on it alike. The rendition shares the original's timestamps blob; its
frame count is checked against the original's.

Its quality settings are its own (:data:`RENDITION_ENCODING`), whatever the original's crf:
a rendition is a second lossy encode on top of the original's, so it is encoded finer (crf 20,
x264 tuned for PSNR, the slow preset, which packs those bits tighter) to stay above 38 dB
against resizing the original; and without H.264's deblocking filter, whose decode time pays
for the extra bits. docs/benchmarks.md compares these settings with the original's own (crf
23, the veryfast preset, deblocking) in PSNR, bytes and decode time.

Rendering from the decoded original (not from the camera's frames) makes ingest of stored
MP4s and of raw frames alike, and keeps a rendition's pixels what resizing the original
would give (docs/benchmarks.md reports the PSNR).
"""

from __future__ import annotations

import argparse
import os
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import av

from rayform.errors import InvalidArgumentError
from rayform_server._video import encode_video

__all__ = [
    "MAX_RENDITIONS",
    "RENDITION_ENCODING",
    "RenditionSkipped",
    "check_heights",
    "heights_argument",
    "keyframe_interval",
    "parse_heights",
    "render",
    "rendition_sizes",
]


#: x264 settings of every rendition (keyword arguments of ``encode_video``; see above).
RENDITION_ENCODING: dict[str, Any] = {
    "crf": 20,
    "preset": "slow",
    "tune": "psnr",
    "x264_params": "no-deblock=1",
}


#: Renditions one stream may list: the readers' limit (``rayform.manifest``'s private
#: ``_rendcols.MAX_RENDITIONS``, which the server may not import; tests/server keeps the two
#: equal). A manifest with more is refused by every reader, so ingest never writes one.
MAX_RENDITIONS = 16


class RenditionSkipped(UserWarning):
    """A requested rendition height is at or above the original's: nothing to store."""


def parse_heights(text: str) -> tuple[int, ...]:
    """``"240,120"`` -> ``(120, 240)`` (the CLI's ``--renditions``).

    Raises:
        InvalidArgumentError: not a comma-separated list of even positive integers.
    """
    items = [x.strip() for x in text.split(",") if x.strip()]
    # ASCII digits only: str.isdigit() also accepts "²", which int() refuses.
    if not items or not all(x.isascii() and x.isdigit() for x in items):
        raise InvalidArgumentError(
            f"--renditions {text!r}: give frame heights in pixels, comma-separated, e.g. --renditions 240,120"
        )
    return check_heights([int(x) for x in items])


def heights_argument(text: str) -> tuple[int, ...]:
    """:func:`parse_heights` as an argparse ``type``: a bad value is reported with what to
    write instead (argparse would only say "invalid value")."""
    try:
        return parse_heights(text)
    except InvalidArgumentError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def check_heights(heights: Sequence[int]) -> tuple[int, ...]:
    """Distinct, sorted, even heights >= 2, at most :data:`MAX_RENDITIONS` of them.

    Raises:
        InvalidArgumentError: a height is odd or below 2 (H.264 4:2:0 needs even sides); more
            distinct heights than a stream may list (readers refuse such a manifest).
    """
    for h in heights:
        if isinstance(h, bool) or not isinstance(h, int) or h < 2 or h % 2:
            raise InvalidArgumentError(
                f"rendition height {h!r}: use an even number of pixels >= 2 (H.264 stores 4:2:0 "
                "colour, so frame sides are even), e.g. 240"
            )
    distinct = tuple(sorted(set(heights)))
    if len(distinct) > MAX_RENDITIONS:
        raise InvalidArgumentError(
            f"{len(distinct)} rendition heights given: a stream lists at most {MAX_RENDITIONS} "
            "renditions (readers refuse more); give fewer heights"
        )
    return distinct


def rendition_sizes(
    height: int, width: int, heights: Sequence[int], name: str = ""
) -> list[tuple[int, int]]:
    """``(h, w)`` of each rendition of a ``height`` x ``width`` video, smallest first.

    The width keeps the aspect ratio, rounded to even. A height at or above the original's is
    skipped with a :class:`RenditionSkipped` warning.
    """
    out = []
    for h in sorted(set(heights)):
        if h >= height:
            warnings.warn(
                f"{name or 'video'}: no {h}-pixel rendition: the original is {width}x{height}, "
                "already that small",
                RenditionSkipped,
                stacklevel=2,
            )
            continue
        out.append((h, max(2, 2 * round(width * h / height / 2))))
    return out


def keyframe_interval(path: str | os.PathLike[str]) -> int:
    """The keyframe interval of the MP4 at ``path``, in frames, from its packet flags (no
    decoding): 1 for all-intra video; the distance between the first two keyframes otherwise
    (the frame count when there is one keyframe)."""
    with av.open(os.fspath(path)) as container:
        stream = container.streams.video[0]
        keys = [
            i for i, p in enumerate(p for p in container.demux(stream) if p.size) if p.is_keyframe
        ]
        frames = stream.frames or (keys[-1] + 1 if keys else 1)
    return keys[1] - keys[0] if len(keys) > 1 else max(1, int(frames))


def _scaled(path: Path, height: int, width: int) -> Iterator[av.VideoFrame]:
    # Scaled as stored, in YUV 4:2:0 (luma and chroma planes each filtered), never through RGB:
    # an RGB round trip re-subsamples the chroma and costs 0.6 dB of PSNR against resizing the
    # decoded original (measured on the loader benchmark's table camera).
    with av.open(os.fspath(path)) as container:
        stream = container.streams.video[0]
        stream.thread_count = 1
        for frame in container.decode(stream):
            yield frame.reformat(
                width=width, height=height, format="yuv420p", interpolation="BILINEAR"
            )


def render(
    original: Path,
    size: tuple[int, int],
    out: Path,
    *,
    rate_hz: float,
    gop: int,
    count: int,
    name: str = "",
) -> None:
    """Encode the ``(h, w)`` rendition of the video ``original`` into ``out``.

    Args:
        original: the stored original MP4.
        size: ``(h, w)`` in pixels, both even.
        out: where to write the MP4.
        rate_hz: the original's nominal rate (frame ``i`` at ``i / rate_hz``, as the original).
        gop: the original's keyframe interval in frames.
        count: the original's frame count.
        name: the stream's name, for messages.

    Raises:
        InvalidArgumentError: the rendition's frame count differs from the original's.
    """
    n, h, w = encode_video(
        _scaled(original, *size), out, rate_hz=rate_hz, gop=gop, **RENDITION_ENCODING
    )
    if (n, h, w) != (count, *size):
        raise InvalidArgumentError(
            f"{name}: the {size[1]}x{size[0]} rendition has {n} frames of {w}x{h}, the original "
            f"{count}: a rendition must hold every frame of the original"
        )
