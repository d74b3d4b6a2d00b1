"""Random access to all-intra video by decoding each frame's packet directly (PyAV).

Our ingest stores video all-intra by default (``--gop 1``): every frame is its own keyframe
packet. A general decoder pays for generality on every random read: a container seek, a
decoder flush, demuxing, then packed RGB that ``(3, H, W)`` consumers must transpose. Here the
packet table (byte offset and size of every frame, in presentation order) is read once when
the decoder opens; a read is then ``pread`` of one packet, one ``avcodec`` decode, and one
``swscale`` conversion straight to planar RGB written into the output tensor (or the batch's
rows, or a packed buffer): by :mod:`._sws` where that gives PyAV's bits (widths that are
multiples of 64 pixels), else by PyAV's converter and one copy.

What this buys against torchcodec's ``get_frames_at`` plus the transpose, and what writing the
conversion into the batch's rows buys, is measured in ``docs/benchmarks.md``
(``bench.cpu_fraction`` and the loader rows).

:func:`open_intra` returns ``None`` for any stream this does not fit (not MP4, a non-keyframe,
a variable rate, packets out of presentation order); the caller then uses a general decoder.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import torch

from rayform.torch._decoding._sws import convert_into

if TYPE_CHECKING:
    from av import VideoFrame

__all__ = ["IntraDecoder", "open_intra"]

# FFmpeg's planar RGB is G, B, R: plane k goes to channel _RGB_OF_GBRP[k].
_RGB_OF_GBRP = (1, 2, 0)


class IntraDecoder:
    """Frames of an all-intra video by index; not thread-safe (one user at a time).

    Args:
        path: the video file.
        packets: ``(offset, size)`` in bytes of frame ``i``'s packet, for every frame.
        codec: FFmpeg decoder name (``"h264"``, ``"hevc"``, ...).
        extradata: the stream's codec extradata (parameter sets), or ``None``.
        width, height: frame size in pixels.
        signature: what the colour conversion depends on (codec, size, pixel format, colour
            space and range): videos with the same signature convert alike.
    """

    def __init__(
        self,
        path: Path,
        packets: list[tuple[int, int]],
        codec: str,
        extradata: bytes | None,
        width: int,
        height: int,
        signature: tuple[Any, ...] = (),
    ) -> None:
        import av
        from av.video.reformatter import VideoReformatter

        self._av = av
        self._packets = packets
        self.width, self.height = width, height
        self.signature = signature
        self._ctx: Any = av.CodecContext.create(codec, "r")
        if extradata:
            self._ctx.extradata = extradata
        self._ctx.thread_count = 1  # DataLoader workers (or decode_threads) are the parallelism
        self._reformatter = VideoReformatter()  # keeps its swscale context between frames
        # swscale's planar RGB output leaves the last columns wrong when the width is not a
        # multiple of 16 (seen with FFmpeg 7 in PyAV 18 for widths 24, 40, ..., 632): there,
        # convert to packed RGB and transpose instead.
        self._planar = width % 16 == 0
        self._fd = os.open(path, os.O_RDONLY)

    def __len__(self) -> int:
        return len(self._packets)

    def packet(self, index: int) -> bytes:
        """The stored bytes of frame ``index``'s packet."""
        offset, size = self._packets[index]
        return os.pread(self._fd, size, offset)

    def get_frames_at(
        self,
        indices: list[int],
        channels_last: bool = False,
        out: np.ndarray | None = None,
        rows: Sequence[Sequence[torch.Tensor]] | None = None,
    ) -> torch.Tensor:
        """Frames ``indices`` as a ``uint8 (N, 3, H, W)`` RGB tensor: contiguous, or laid out
        ``(N, H, W, 3)`` in memory with ``channels_last`` (packed RGB straight from the
        converter, which a resize reads fastest; the same values). ``out``, a ``uint8
        (N, H, W, C)`` array with ``C`` 3 or 4, receives the packed frames instead of a new
        buffer (implies ``channels_last``; the result is a view of it, ``(N, C, H, W)``); with
        four channels the fourth is 255 (RGBA: converted as fast as RGB, and what a resize
        reads without widening each pixel first). ``rows``: for each frame, contiguous ``uint8
        (3, H, W)`` tensors (rows of a batch) that receive it instead of a new tensor (then the
        result is empty)."""
        if channels_last or out is not None:
            if out is None:
                out = np.empty((len(indices), self.height, self.width, 3), dtype=np.uint8)
            elif out.shape[:3] != (len(indices), self.height, self.width) or out.shape[3] not in (
                3,
                4,
            ):
                raise ValueError(
                    f"out holds {out.shape} frames (N, H, W, 3 or 4), the video "
                    f"{(len(indices), self.height, self.width)}"
                )
            fmt = "rgb24" if out.shape[3] == 3 else "rgba"
            for k, index in enumerate(indices):
                self._convert(self._frame(index), fmt, out[k])
            return torch.from_numpy(out).permute(0, 3, 1, 2)
        if rows is None:
            result = torch.empty((len(indices), 3, self.height, self.width), dtype=torch.uint8)
            dests: Sequence[Sequence[np.ndarray]] = [[p] for p in result.numpy()]
        else:
            result = torch.empty((0, 3, self.height, self.width), dtype=torch.uint8)
            dests = [[d.numpy() for d in frame_rows] for frame_rows in rows]
        for index, into in zip(indices, dests, strict=True):
            if not into:
                continue
            frame = self._frame(index)
            if self._planar:
                self._convert(frame, "gbrp", into[0])
            else:
                rgb = np.empty((self.height, self.width, 3), dtype=np.uint8)
                self._convert(frame, "rgb24", rgb)
                into[0][...] = rgb.transpose(2, 0, 1)
            for picture in into[1:]:  # the same frame in more rows of the batch
                picture[...] = into[0]
        return result

    def _convert(self, frame: VideoFrame, fmt: str, dst: np.ndarray) -> None:
        """Colour-convert ``frame`` into ``dst``: ``(3, H, W)`` RGB planes for ``"gbrp"``,
        ``(H, W, C)`` packed for ``"rgb24"``/``"rgba"``. Straight into ``dst`` where swscale
        can write there with PyAV's bits (:mod:`._sws`), else PyAV's converter and a copy."""
        convert_into(frame, fmt, dst, self._pyav_convert)

    def _pyav_convert(self, frame: VideoFrame, fmt: str, dst: np.ndarray) -> None:
        converted = self._reformatter.reformat(frame, format=fmt, threads=1)
        if fmt == "gbrp":
            for plane, channel in zip(converted.planes, _RGB_OF_GBRP, strict=True):
                lines = np.frombuffer(cast(Any, plane), np.uint8).reshape(
                    self.height, plane.line_size
                )
                dst[channel] = lines[:, : self.width]
            return
        # Straight from the converter's buffer (rows padded to line_size) into the output:
        # to_ndarray would copy the picture once more.
        channels = dst.shape[2]
        plane = converted.planes[0]
        lines = np.frombuffer(cast(Any, plane), np.uint8).reshape(self.height, -1)
        dst[...] = lines[:, : self.width * channels].reshape(self.height, self.width, channels)

    def _frame(self, index: int) -> VideoFrame:
        """Decode frame ``index`` (an all-intra packet decodes alone)."""
        if not 0 <= index < len(self._packets):
            raise IndexError(f"frame {index} is outside the video's {len(self._packets)} frames")
        frames: list[VideoFrame] = self._ctx.decode(self._av.Packet(self.packet(index)))
        if not frames:  # a decoder holding frames back: drain it (then it starts afresh)
            frames = self._ctx.decode(None)
            self._ctx.flush_buffers()
        if len(frames) != 1:
            raise RuntimeError(f"frame {index}: its packet decoded to {len(frames)} frames")
        return frames[0]

    def __del__(self) -> None:
        fd = getattr(self, "_fd", None)
        if fd is not None:
            os.close(fd)


def open_intra(path: Path) -> IntraDecoder | None:
    """An :class:`IntraDecoder` for the first video stream of the MP4 file ``path``, or
    ``None`` (PyAV missing, another container, or the stream is not all-intra at a constant
    frame rate with packets stored in presentation order, which is what makes packet ``i``
    frame ``i``). Reads the container's index, not the packets."""
    try:
        import av
    except ImportError:
        return None
    with av.open(os.fspath(path)) as container:
        # MP4/MOV index every sample's byte range, and a packet is stored there verbatim
        # (Matroska, for one, reports the block's position, not the frame's).
        if "mp4" not in container.format.name.split(",") or not container.streams.video:
            return None
        stream = container.streams.video[0]
        entries = stream.index_entries
        if not stream.frames or len(entries) != stream.frames:
            return None
        # A sample an edit list drops (``is_discard``) is not a frame the general decoders return.
        table = [(e.timestamp, e.pos, e.size, e.is_keyframe and not e.is_discard) for e in entries]
        if not all(key and pos >= 0 and size > 0 for _, pos, size, key in table):
            return None
        first = bytes(next(container.demux(stream)))
        steps = [b[0] - a[0] for a, b in zip(table, table[1:], strict=False)]
        # A constant step (give or take the container's rounding of 1 tick): packet i is frame
        # i at the nominal rate, as the general decoders index it. Else variable or reordered.
        if steps and (min(steps) <= 0 or max(steps) - min(steps) > 1):
            return None
        ctx = stream.codec_context
        if not ctx.width or not ctx.height or ctx.format is None:
            return None
        decoder = IntraDecoder(
            path,
            [(pos, size) for _, pos, size, _ in table],
            ctx.name,
            ctx.extradata,
            ctx.width,
            ctx.height,
            signature=(
                ctx.name,
                ctx.width,
                ctx.height,
                ctx.format.name,
                int(ctx.colorspace),
                int(ctx.color_range),
            ),
        )
    # The index's byte range must hold the packet verbatim (checked on the first one).
    return decoder if decoder.packet(0) == first else None
