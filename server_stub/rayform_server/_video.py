"""Encoding frames into the stored video format: H.264 in MP4, constant frame rate.

Frame ``i`` is written with presentation time ``i / rate_hz`` (constant frame rate), so
decoders can seek by index exactly even in torchcodec's ``approximate`` mode; the *real*
capture times live beside the video in a timestamps blob. No B-frames (decode order equals
presentation order) and a short keyframe interval (``gop``) keep random access cheap; see
``docs/video-encoding.md`` for the measurements behind the defaults.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from fractions import Fraction

import av
import numpy as np

from rayform.errors import InvalidArgumentError

__all__ = ["DEFAULT_CRF", "DEFAULT_GOP", "encode_video"]

#: Keyframe interval in frames. 1 (every frame a keyframe) makes a random frame cost one
#: decode, so a shuffled DataLoader runs at the sequential-decode speed; ~3x the bytes of
#: GOP 10. See docs/video-encoding.md for the measurements.
DEFAULT_GOP = 1
#: x264 constant rate factor (lower = better quality, larger files).
DEFAULT_CRF = 23


def encode_video(
    frames: Iterable[np.ndarray | av.VideoFrame],
    path: str | os.PathLike[str],
    *,
    rate_hz: float,
    gop: int = DEFAULT_GOP,
    crf: int = DEFAULT_CRF,
    preset: str = "veryfast",
    tune: str | None = None,
    x264_params: str | None = None,
) -> tuple[int, int, int]:
    """Encode RGB frames ``(H, W, 3) uint8`` to an H.264 MP4 at ``path``.

    Args:
        frames: every frame in order, each ``(H, W, 3) uint8`` RGB, or an ``av.VideoFrame``
            already in ``yuv420p`` (encoded as it is); H and W must be even and equal for all
            frames.
        path: output file.
        rate_hz: nominal frame rate in Hz (frame ``i`` gets pts ``i / rate_hz``).
        gop: keyframe interval in frames.
        crf: x264 constant rate factor.
        preset: x264 preset.
        tune: x264 tuning (e.g. ``"psnr"``), or ``None``.
        x264_params: extra x264 options, ``"key=value:key=value"``, or ``None``.

    Returns:
        ``(count, height, width)``.

    Raises:
        InvalidArgumentError: a frame has the wrong dtype/shape, odd dimensions, or there are no frames.
    """
    rate = Fraction(rate_hz).limit_denominator(1001)
    count = 0
    height = width = 0
    container = av.open(os.fspath(path), mode="w", format="mp4")
    try:
        stream = None
        for item in frames:
            if isinstance(item, av.VideoFrame):
                # Already in the stored pixel format: encoded without a conversion.
                vf, size = item, (item.height, item.width)
            else:
                frame = np.asarray(item)
                if frame.dtype != np.uint8 or frame.ndim != 3 or frame.shape[2] != 3:
                    raise InvalidArgumentError(
                        f"frame {count}: expected (H, W, 3) uint8, got {frame.dtype} {frame.shape}"
                    )
                vf, size = av.VideoFrame.from_ndarray(frame, format="rgb24"), frame.shape[:2]
            if stream is None:
                height, width = size
                if height % 2 or width % 2:
                    raise InvalidArgumentError(
                        f"frame size {width}x{height} must be even for H.264 4:2:0"
                    )
                stream = container.add_stream("libx264", rate=rate)
                stream.width, stream.height = width, height
                stream.pix_fmt = "yuv420p"
                options: dict[str, object] = {
                    "g": str(gop),
                    "keyint_min": str(gop),
                    "bf": "0",
                    "crf": str(crf),
                    "preset": preset,
                    "sc_threshold": "0",
                }
                if tune:
                    options["tune"] = tune
                if x264_params:
                    options["x264-params"] = x264_params
                stream.options = options
                stream.thread_count = 1
            elif size != (height, width):
                raise InvalidArgumentError(
                    f"frame {count} is {size[1]}x{size[0]}, earlier frames are "
                    f"{width}x{height}: all frames of a stream must have one size"
                )
            vf.pts = count
            vf.time_base = 1 / rate
            for packet in stream.encode(vf):
                container.mux(packet)
            count += 1
        if stream is None:
            raise InvalidArgumentError("no frames to encode")
        for packet in stream.encode(None):
            container.mux(packet)
    finally:
        container.close()
    return count, height, width
