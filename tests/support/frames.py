"""Video frames for decoder tests: textured, moving pictures, and torchcodec's reading of a file."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch


def moving_frames(n: int, height: int, width: int) -> list[np.ndarray]:
    """``n`` ``uint8 (height, width, 3)`` frames with texture and motion, so that every frame
    decodes to different pixels."""
    y, x = np.mgrid[0:height, 0:width]
    return [
        np.stack(
            [(x * 3 + 7 * i) % 256, (y * 5 + 3 * i) % 256, ((x + y) * 2 + 11 * i) % 256], -1
        ).astype(np.uint8)
        for i in range(n)
    ]


def torchcodec_frames(path: Path | str, indices: list[int]) -> torch.Tensor:
    """Frames ``indices`` of the video at ``path`` as torchcodec decodes them, ``uint8
    (N, 3, H, W)``: the general backend every other decoder is held to."""
    from torchcodec.decoders import VideoDecoder

    return (
        VideoDecoder(str(path), seek_mode="approximate", num_ffmpeg_threads=1)
        .get_frames_at(indices)
        .data
    )
