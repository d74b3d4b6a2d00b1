"""Decode the frames shown at given times from a video file (any codec FFmpeg reads).

Used to cut one episode out of a LeRobot video file that holds many episodes back to back:
for every target time the frame whose presentation time is nearest is yielded, so the
output has exactly one frame per target (frame ``i`` is the capture at target ``i``).
Frames are decoded lazily, in order, so long episodes never sit in memory.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence

import av
import numpy as np

from rayform.errors import InvalidArgumentError

__all__ = ["frames_at"]


def _decoded(path: str, start_s: float) -> Iterator[tuple[float, av.VideoFrame]]:
    """``(pts_seconds, frame)`` for every frame from the keyframe at or before ``start_s``."""
    try:
        container = av.open(path)
    except (av.FFmpegError, OSError) as exc:
        raise InvalidArgumentError(
            f"cannot open video {path}: {exc}. Is the file complete?"
        ) from exc
    with container:
        if not container.streams.video:
            raise InvalidArgumentError(f"{path} has no video stream")
        stream = container.streams.video[0]
        tb = stream.time_base
        if tb is None:
            raise InvalidArgumentError(f"{path}: its video stream has no time base")
        if start_s > 0:
            container.seek(int(start_s / tb), stream=stream, backward=True, any_frame=False)
        try:
            for frame in container.decode(stream):
                if frame.pts is not None:
                    yield float(frame.pts * tb), frame
        except av.FFmpegError as exc:
            raise InvalidArgumentError(f"cannot decode {path}: {exc}") from exc


def frames_at(
    path: str | os.PathLike[str],
    times_s: Sequence[float],
    *,
    tolerance_s: float,
    shape: tuple[int, int] | None = None,
) -> Iterator[np.ndarray]:
    """Yield, for each target time, the frame presented nearest to it, ``(H, W, 3) uint8`` RGB.

    Args:
        path: the video file.
        times_s: target presentation times in seconds (in the file's own timeline),
            non-decreasing.
        tolerance_s: the largest allowed distance, in seconds, between a target and the
            frame chosen for it (e.g. half a frame period).
        shape: ``(H, W)`` every frame must have, if known.

    Raises:
        InvalidArgumentError: the file cannot be read, or no frame lies within
            ``tolerance_s`` of a target (the metadata and the video disagree).
    """
    path = os.fspath(path)
    if len(times_s) == 0:
        return
    frames = _decoded(path, float(times_s[0]) - tolerance_s)
    prev: tuple[float, av.VideoFrame] | None = None
    nxt = next(frames, None)
    for t in times_s:
        while nxt is not None and nxt[0] <= t:
            prev, nxt = nxt, next(frames, None)
        candidates = [c for c in (prev, nxt) if c is not None]
        if not candidates:
            raise InvalidArgumentError(f"{path}: no frames at all near {t:.4f} s")
        best = min(candidates, key=lambda c: abs(c[0] - t))
        if abs(best[0] - t) > tolerance_s:
            raise InvalidArgumentError(
                f"{path}: the nearest frame to {t:.4f} s is at {best[0]:.4f} s (more than "
                f"{tolerance_s:.4f} s away): the dataset's timestamps and its video disagree. "
                "Check that the video file is complete."
            )
        image = best[1].to_ndarray(format="rgb24")
        if shape is not None and image.shape[:2] != tuple(shape):
            raise InvalidArgumentError(
                f"{path}: frame at {best[0]:.4f} s is {image.shape[1]}x{image.shape[0]}, the "
                f"metadata says {shape[1]}x{shape[0]}"
            )
        yield image
