"""One decoded video frame as a JPEG: the viewer's path for codecs a browser cannot play.

Stored videos have constant frame rate: frame ``i`` has presentation time ``i / rate_hz``
(docs/manifest.md), so a frame is found by seeking to the keyframe at or before that time and
decoding forward. PyAV (FFmpeg) is the decoder; it is the ``view`` extra's one dependency.
"""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import av

__all__ = ["frame_jpeg"]


def frame_jpeg(path: Path, index: int, rate_hz: float, quality: int = 4) -> bytes:
    """JPEG bytes of frame ``index`` of the MP4 at ``path``.

    Args:
        path: the video file.
        index: frame index (0-based, in presentation order).
        rate_hz: the stream's nominal rate (frame ``i`` has pts ``i / rate_hz``).
        quality: MJPEG quantiser, 2 (best) to 31.

    Raises:
        LookupError: the file ends before frame ``index``.
    """
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        tb = stream.time_base or Fraction(1, 90000)
        target = int(round(Fraction(index) / Fraction(rate_hz).limit_denominator(1001) / tb))
        container.seek(target, stream=stream, backward=True, any_frame=False)
        half = int(Fraction(1, 2) / Fraction(rate_hz).limit_denominator(1001) / tb)
        for frame in container.decode(stream):
            if frame.pts is not None and frame.pts + half >= target:
                return _encode(frame, quality)
    raise LookupError(f"{path.name} ends before frame {index}")


def _encode(frame: av.VideoFrame, quality: int) -> bytes:
    enc = av.CodecContext.create("mjpeg", "w")
    enc.width, enc.height = frame.width, frame.height
    enc.pix_fmt = "yuvj420p"
    enc.time_base = Fraction(1, 25)
    enc.options = {"qmin": str(quality), "qmax": str(quality)}
    packets = [*enc.encode(frame.reformat(format="yuvj420p")), *enc.encode(None)]
    return b"".join(bytes(p) for p in packets)
