"""Exporting a camera without re-encoding: the stored packets copied into LeRobot's MP4.

Our ingest stores video all-intra (every frame its own keyframe packet, docs/video-encoding.md),
so any frame can be copied alone: row ``k`` of an episode gets the packet of the frame
``EpisodeDataset`` would decode at that row (the latest frame at or before the row's grid time,
the reader's own rule, ``rayform.torch._align.latest_at_or_before``), at pts ``k / fps``. The
pixels are the slice's, bit for bit, and nothing is decoded or encoded.

Possible when the dataset keeps the stored size (no ``image_size``) and every video of a file is
all-intra H.264 with the same parameter sets (one MP4 stream holds them all); otherwise the
export re-encodes.
"""

from __future__ import annotations

import os
from fractions import Fraction
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from rayform.files import unique_tmp_name
from rayform.format import decode_timestamps
from rayform.torch._align import latest_at_or_before
from rayform.torch._decoding import open_intra

if TYPE_CHECKING:
    from rayform.manifest import Segment

__all__ = ["PacketCopier", "copyable"]


def copyable(segments: list[Segment], stream: str) -> bool:
    """Whether the manifest says ``stream`` of these segments is all-intra H.264 of one size."""
    shapes = set()
    for seg in segments:
        st = seg.streams.get(stream)
        if st is None or st.kind != "video" or st.codec != "h264" or st.gop != 1:
            return False
        shapes.add(tuple(st.shape))
    return len(shapes) == 1


class PacketCopier:
    """One MP4 of copied packets: episodes back to back, frame ``i`` at ``i / fps``.

    Args:
        path: the final file (written to a temporary name, renamed by :meth:`close`).
        fps: the dataset's rate.
        sources: per episode of the file, ``(video path, timestamps path, grid times ns)``.

    Raises:
        ValueError: a source is not all-intra MP4, or its parameter sets differ from the
            first one's (the caller re-encodes instead).
    """

    def __init__(self, path: Path, fps: float, sources: list[tuple[Path, Path, np.ndarray]]):
        import av

        self.path = path
        self.tmp = path.parent / unique_tmp_name(path.name)
        self.frames = 0
        self._plan = []
        extradata = None
        for video, stamps, grid in sources:
            decoder = open_intra(video)
            if decoder is None:
                raise ValueError(f"{video} is not all-intra MP4")
            with av.open(os.fspath(video)) as c:
                ctx = c.streams.video[0].codec_context
                if extradata is None:
                    extradata = ctx.extradata
                elif ctx.extradata != extradata:
                    raise ValueError(f"{video}: other parameter sets")
            t_frames = decode_timestamps(stamps.read_bytes())
            self._plan.append((decoder, latest_at_or_before(t_frames, grid)))
        path.parent.mkdir(parents=True, exist_ok=True)
        self._container: Any = av.open(str(self.tmp), mode="w", format="mp4")
        self._rate = Fraction(fps).limit_denominator(1001)
        with av.open(os.fspath(sources[0][0])) as c:
            self._stream = self._container.add_stream_from_template(c.streams.video[0])
        self._stream.time_base = 1 / self._rate

    def copy(self, episode: int) -> int:
        """Append episode ``episode`` (its position in ``sources``); returns its frame count."""
        import av

        decoder, frames = self._plan[episode]
        for index in frames:
            packet = av.Packet(decoder.packet(int(index)))
            packet.stream = self._stream
            packet.time_base = 1 / self._rate
            packet.pts = packet.dts = self.frames
            packet.duration = 1
            packet.is_keyframe = True
            self._container.mux(packet)
            self.frames += 1
        return len(frames)

    def close(self) -> None:
        """Finish the file and rename it into place."""
        self._container.close()
        os.replace(self.tmp, self.path)

    def abort(self) -> None:
        """Close and remove the temporary file (after an error)."""
        try:
            self._container.close()
        finally:
            self.tmp.unlink(missing_ok=True)
