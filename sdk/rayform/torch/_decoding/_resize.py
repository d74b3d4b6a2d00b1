"""Camera frames resized to the training resolution, right after decode.

``resize_frames`` runs in the process (and thread) that decoded the frames, a DataLoader
worker in training: bilinear with antialiasing (``torch.nn.functional.interpolate(mode=
"bilinear", antialias=True)`` on ``uint8``), on a channels-last ``(N, 3, h, w)`` tensor, following
the geometry of :class:`rayform._resolution.Target`. Every decoder backend returns the same
bits for a frame (``_video`` checks the packet decoder against the general one), and the
resize depends only on those bits and the tensor's layout (made channels-last first), so resized
pixels never depend on ``decoder_backend``. FFmpeg's own scaler (torchcodec's decoder-side
``Resize``, PyAV's ``reformat``) is not used: its pixels differ between those libraries (by up
to 48 levels on the demo's frames) and from the packet decoder's path.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F

from rayform._resolution import Target

__all__ = ["resize_frames"]


def resize_frames(
    frames: torch.Tensor,
    target: Target,
    out: torch.Tensor | None = None,
    rows: Sequence[Sequence[torch.Tensor]] | None = None,
) -> torch.Tensor | None:
    """Resize ``uint8 (N, C, h, w)`` frames to a contiguous ``uint8 (N, 3, H, W)``.

    Args:
        frames: decoded frames, any memory layout; ``C`` is 3 (RGB) or 4 (RGB and a fourth
            channel that is ignored). Torch's channels-last ``uint8`` kernel works on four
            channels: given three, it widens every frame to four and narrows the result back,
            which costs a third of its time; given four, it skips both. The RGB channels of
            the result are the same bits either way.
        target: the size and mode (``target.plan(h, w)`` says which box goes where).
        out: a contiguous ``uint8 (N, 3, H, W)`` tensor to write into (a slice of a larger
            batch, say), or ``None`` for a new one.
        rows: instead of ``out``, for each frame the contiguous ``uint8 (3, H, W)`` tensors
            it is written to (rows of a batch, in any order; the same bits as ``out``).

    Returns:
        ``out``, or new contiguous frames (a copy even when the size is already the target's
        and nothing is cropped or padded); ``None`` with ``rows``.
    """
    n, _, h, w = frames.shape
    plan = target.plan(h, w)
    top, left, bh, bw = plan.box
    src = frames[:, :, top : top + bh, left : left + bw]
    if (bh, bw) == plan.scaled:
        scaled = src
    else:
        # Frames already laid out channels-last (HWC pictures seen through a permute) take
        # torch's vectorised uint8 kernel as they are: 4x faster than making them NCHW first.
        # NCHW frames stay NCHW: converting them would cost more than it saves. Same bits
        # either way.
        channels_last = frames.is_contiguous(memory_format=torch.channels_last)
        layout = torch.channels_last if channels_last else torch.contiguous_format
        src = src.contiguous(memory_format=layout)
        scaled = F.interpolate(
            src, size=plan.scaled, mode="bilinear", antialias=True, align_corners=False
        )
    y, x = plan.at
    sh, sw = plan.scaled
    if rows is not None:
        pixels = scaled[:, :3].numpy()
        padded = (sh, sw) != (target.height, target.width)
        for picture, dests in zip(pixels, rows, strict=True):
            for dest in dests:
                row = dest.numpy()
                if padded:
                    row[:, :y] = 0
                    row[:, y + sh :] = 0
                    row[:, y : y + sh, :x] = 0
                    row[:, y : y + sh, x + sw :] = 0
                np.copyto(row[:, y : y + sh, x : x + sw], picture)
        return None
    if out is None:
        out = torch.empty((n, 3, target.height, target.width), dtype=frames.dtype)
    if (sh, sw) != (target.height, target.width):
        # Only the padding is zeroed: the picture overwrites the rest.
        out[:, :, :y].zero_()
        out[:, :, y + sh :].zero_()
        out[:, :, y : y + sh, :x].zero_()
        out[:, :, y : y + sh, x + sw :].zero_()
    _copy(out[:, :, y : y + sh, x : x + sw], scaled[:, :3])
    return out


def _copy(dst: torch.Tensor, src: torch.Tensor) -> None:
    """``dst[...] = src`` through numpy: from a channels-last ``src`` into a contiguous
    ``dst`` numpy's strided copy is about twice as fast as torch's (0.04 against 0.075 ms for
    a 168x224 frame on the development VM); the same bytes."""
    np.copyto(dst.numpy(), src.numpy())
