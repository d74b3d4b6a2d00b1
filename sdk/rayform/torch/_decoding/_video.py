"""Video decoding: a bounded, per-process LRU of open decoders.

Decoders are opened lazily, on first use, in the process that uses them: nothing is opened
at dataset construction. A :class:`DecoderCache` serves one process: its owner holds it in a
:class:`~rayform._process.PerProcess` with ``keep_inherited=True``, so a forked DataLoader
worker starts with an empty cache and never frees (nor uses) the decoders it inherited.

Backends, chosen per video when the backend is left to us (``None``):

* all-intra video (our ingest's default): :mod:`._intra`, which decodes each frame's packet
  directly into planar RGB. It is used only after its first and last frames came out
  bit-identical to the general backend's, so the choice never changes a pixel (the verdict is
  kept on disk for later processes with the same decoders, :mod:`._checks`);
* otherwise torchcodec's ``VideoDecoder(path, seek_mode="approximate", num_ffmpeg_threads=1)``
  (the stored videos have constant frame rate and no B-frames, so approximate seeking by index
  is exact and skips the full-file scan), or PyAV when torchcodec cannot be imported.

``"torchcodec"`` or ``"pyav"`` forces that backend for every video. Frame ``i`` of a stored
video is its ``i``-th frame; which index to fetch for a time is decided by the caller from the
timestamps blob.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from fractions import Fraction
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from rayform._untrusted import shown
from rayform.cache import read_blob
from rayform.errors import CacheError, IntegrityError, RayformError
from rayform.torch._decoding import _checks
from rayform.torch._decoding._intra import IntraDecoder, open_intra

__all__ = ["BACKENDS", "DecoderCache", "default_backend", "forget_intra_checks", "intra_checks"]

BACKENDS = ("torchcodec", "pyav")


class _Decoder(Protocol):
    def get_frames_at(self, indices: list[int], channels_last: bool = False) -> torch.Tensor: ...


def default_backend() -> str:
    """``"torchcodec"`` if it imports (with its FFmpeg libraries), else ``"pyav"``."""
    try:
        import torchcodec.decoders  # noqa: F401
    except Exception:  # ImportError, or OSError/RuntimeError when FFmpeg libs do not load
        return "pyav"
    return "torchcodec"


class _TorchCodecDecoder:
    def __init__(self, path: Path) -> None:
        from torchcodec.decoders import VideoDecoder

        self._dec = VideoDecoder(os.fspath(path), seek_mode="approximate", num_ffmpeg_threads=1)

    def get_frames_at(self, indices: list[int], channels_last: bool = False) -> torch.Tensor:
        return self._dec.get_frames_at(indices).data  # NCHW whatever is asked: its own layout


class _PyAVDecoder:
    """Sequential decoding with keyframe seeks, for sorted index batches."""

    def __init__(self, path: Path, rate_hz: float) -> None:
        import av

        self._container: Any = av.open(os.fspath(path))
        self._stream: Any = self._container.streams.video[0]
        self._stream.thread_count = 1
        self._rate = Fraction(rate_hz).limit_denominator(1001)
        self._frames: Any = None
        self._last = -1  # index of the last frame the iterator produced

    def _index_of(self, frame: Any) -> int:
        return int(round(frame.pts * self._stream.time_base * self._rate))

    def _seek(self, index: int) -> None:
        target = int(Fraction(index) / self._rate / self._stream.time_base)
        self._container.seek(target, stream=self._stream, backward=True, any_frame=False)
        self._frames = self._container.decode(self._stream)
        self._last = -1

    def get_frames_at(self, indices: list[int], channels_last: bool = False) -> torch.Tensor:
        out = []
        for index in indices:
            if self._frames is None or index <= self._last or index - self._last > 30:
                self._seek(index)
            for frame in self._frames:
                self._last = self._index_of(frame)
                if self._last >= index:
                    break
            else:
                raise IndexError(f"frame {index} is past the end of the video")
            # One converter thread: the workers are the parallelism, and a threaded swscale
            # context cannot be freed in a forked child (it waits on the parent's threads).
            out.append(torch.from_numpy(frame.to_ndarray(format="rgb24", threads=1)))
        return (
            torch.stack(out).permute(0, 3, 1, 2)
            if channels_last
            else torch.stack([f.permute(2, 0, 1) for f in out])
        )

    def __del__(self) -> None:
        container = getattr(self, "_container", None)
        if container is not None:
            container.close()


def _general(backend: str, path: Path, rate_hz: float) -> _Decoder:
    return _TorchCodecDecoder(path) if backend == "torchcodec" else _PyAVDecoder(path, rate_hz)


def _backend_name(decoder: _Decoder) -> str:
    if isinstance(decoder, IntraDecoder):
        return "intra"
    return "torchcodec" if isinstance(decoder, _TorchCodecDecoder) else "pyav"


#: Per process: video signature (codec, size, pixel format, colour space and range) -> whether
#: the packet decoder gave the general backend's bits on the first video with it. A forked
#: child keeps its parent's verdicts: they are facts about the decoders, not open resources.
_VERIFIED: dict[tuple[Any, ...], bool] = {}


def intra_checks() -> dict[tuple[Any, ...], bool]:
    """The packet decoder's checks so far in this process (a copy): video signature (codec,
    size, pixel format, colour space and range) -> whether it gave the general backend's bits."""
    return dict(_VERIFIED)


def forget_intra_checks() -> None:
    """Forget every check, this process's and those kept on disk for these decoders: the next
    video of each signature is checked again before the packet decoder is used for it."""
    _VERIFIED.clear()
    _checks.forget()


def _checked_intra(path: Path, rate_hz: float) -> _Decoder | None:
    """The packet decoder for an all-intra video, if it decodes to the same bits as the general
    backend. Checked on the first and last frames (colour conversion, frame count) of the first
    video of each signature in this process; the decode itself is bit-exact by the codec's
    standard, so later videos with that signature only need their own frame table, which
    :func:`open_intra` checks (constant rate, one keyframe packet per frame)."""
    try:
        intra = open_intra(path)
    except Exception:  # a stream PyAV cannot parse: the general backend will say what is wrong
        return None
    if intra is None:
        return None
    if intra.signature not in _VERIFIED:
        kept = _checks.load(intra.signature)  # another process's check with these decoders
        if kept is None:
            ends = [0, len(intra) - 1]
            try:
                general = _general(default_backend(), path, rate_hz).get_frames_at(ends)
                kept = torch.equal(intra.get_frames_at(ends), general)
            except Exception:
                return None
            _checks.store(intra.signature, kept)
        _VERIFIED[intra.signature] = kept
    return intra if _VERIFIED[intra.signature] else None


class _Entry:
    """One cached video: its decoder (opened on first use) and the lock of whoever uses it."""

    __slots__ = ("decoder", "lock")

    def __init__(self) -> None:
        self.decoder: _Decoder | None = None
        self.lock = threading.Lock()


class DecoderCache:
    """At most ``max_open`` open decoders in this process, least recently used evicted.

    Thread-safe: several threads may call :meth:`get_frames` at once (a decoder is used by one
    thread at a time; two threads asking for the same video take turns).

    Args:
        max_open: decoders kept open per process (each holds an open file and FFmpeg state).
        backend: ``"torchcodec"``, ``"pyav"`` or ``None``: per video, the packet decoder for
            all-intra video, else :func:`default_backend`.
        refetch: the path of a video blob (by key) after fetching it again: a video removed
            from the cache while it is read (another node's eviction) is fetched and read
            again, with a warning (:func:`rayform.cache.read_blob`), never a false error.
    """

    def __init__(
        self,
        max_open: int = 16,
        backend: str | None = None,
        refetch: Callable[[str], Path] | None = None,
    ) -> None:
        self.max_open = max_open
        self._backend = backend
        self._refetch = refetch
        self._lock = threading.Lock()
        self._open: OrderedDict[str, _Entry] = OrderedDict()

    def holds(self, key: str) -> bool:
        """Whether a decoder of the video ``key`` is open here (it reads through its open
        file, whatever happens to the path meanwhile)."""
        return key in self._open

    @property
    def backend(self) -> str:
        """The general backend: the one asked for, else :func:`default_backend`."""
        return self._backend or default_backend()

    def get_frames(
        self,
        key: str,
        path: Path,
        indices: np.ndarray,
        rate_hz: float,
        stream: str = "",
        *,
        channels_last: bool = False,
        out: np.ndarray | None = None,
        rows: Sequence[Sequence[torch.Tensor]] | None = None,
    ) -> torch.Tensor:
        """Frames at sorted, unique ``indices`` of the video at ``path``.

        Args:
            key: cache key (the video blob's hash).
            path: local file.
            indices: frame indices, sorted ascending, unique, ``(N,)``.
            rate_hz: the stream's nominal rate in Hz (frame ``i`` has pts ``i / rate_hz``).
            stream: the stream's name, for errors.
            channels_last: frames laid out ``(N, H, W, 3)`` in memory where the decoder can
                (what a resize reads fastest); the values are the same.
            out: a ``uint8 (N, H, W, C)`` array (a slice of a batch's buffer) that receives
                the frames, or ``None``. The packet decoder writes into it directly. ``C`` is 3,
                or 4 for RGBA frames (what a resize reads fastest): the packet decoder writes
                255 in the fourth channel, the other backends leave it as it was (a resize never
                mixes channels, so its RGB does not depend on it).
            rows: for each frame, the contiguous ``uint8 (3, H, W)`` tensors (rows of a
                batch) it is written to, or ``None``. The packet decoder writes into them
                directly.

        Returns:
            ``uint8 (N, 3, H, W)``; with ``out``, a view of it (``(N, C, H, W)``); with
            ``rows``, an empty ``(0, 3, H, W)`` tensor.

        Raises:
            IntegrityError: the video (already verified against its hash) cannot be decoded,
                has fewer frames than its timestamps blob, or frames of another size than
                ``out``'s.
        """
        refetch = self._refetch
        try:
            return read_blob(
                lambda p: (
                    self._get_frames(key, p, indices, rate_hz, channels_last, out)
                    if rows is None
                    else self._place_frames(key, p, indices, rate_hz, rows)
                ),
                path,
                key,
                refetch=None if refetch is None else lambda: refetch(key),
                what=f"video blob {key[:12]}... of stream {stream or '?'}",
                reset=lambda: self._forget(key),
            )
        except RayformError:
            raise
        except Exception as exc:  # whatever the decoder raises on bytes that are not a video
            if not path.exists():  # not the data's fault: the cache lost the file meanwhile
                raise CacheError(
                    f"video blob {key} of stream {stream or '?'} was removed from the cache while "
                    "it was being opened (a `rayform cache prune`, or an eviction by another "
                    "process); read the sample again: it is fetched anew"
                ) from exc
            raise IntegrityError(
                f"video blob {key} of stream {stream or '?'} matches its hash but cannot be "
                f"decoded ({type(exc).__name__}: {shown(exc)}); the data on the server is "
                "broken: report it to the data owners"
            ) from exc

    def _forget(self, key: str) -> None:
        """Drop the decoder of ``key`` (its file was removed or replaced): the next read opens it."""
        with self._lock:
            self._open.pop(key, None)

    def _get_frames(
        self,
        key: str,
        path: Path,
        indices: np.ndarray,
        rate_hz: float,
        channels_last: bool,
        out: np.ndarray | None,
    ) -> torch.Tensor:
        with self._lock:
            entry = self._open.get(key)
            if entry is None:
                entry = self._open[key] = _Entry()
                while len(self._open) > self.max_open:
                    self._open.popitem(last=False)  # a thread still using it keeps it alive
            else:
                self._open.move_to_end(key)
        with entry.lock:
            if entry.decoder is None:  # opened outside the cache lock: other videos go on
                decoder = _checked_intra(path, rate_hz) if self._backend is None else None
                entry.decoder = decoder or _general(self.backend, path, rate_hz)
            decoder = entry.decoder
            wanted = [int(i) for i in indices]
            if out is None:
                return decoder.get_frames_at(wanted, channels_last)
            if isinstance(decoder, IntraDecoder) and out.shape[1:3] == (
                decoder.height,
                decoder.width,
            ):
                return decoder.get_frames_at(wanted, out=out)
            frames = decoder.get_frames_at(wanted, True)
        if tuple(frames.shape[2:]) != out.shape[1:3]:
            raise IntegrityError(
                f"video blob {key} holds frames of {frames.shape[3]}x{frames.shape[2]}, its "
                f"manifest says {out.shape[2]}x{out.shape[1]}; the data on the server is broken: "
                "report it to the data owners"
            )
        into = torch.from_numpy(out)
        into[..., :3].copy_(frames.permute(0, 2, 3, 1))
        return into.permute(0, 3, 1, 2)

    def _place_frames(
        self,
        key: str,
        path: Path,
        indices: np.ndarray,
        rate_hz: float,
        rows: Sequence[Sequence[torch.Tensor]],
    ) -> torch.Tensor:
        """:meth:`get_frames` with ``rows``: the packet decoder writes each frame into its
        rows; the other backends' frames are copied there."""
        size = tuple(rows[0][0].shape[1:]) if rows and rows[0] else None
        with self._lock:
            entry = self._open.get(key)
            if entry is not None:
                self._open.move_to_end(key)
        if (
            entry is not None
            and isinstance(entry.decoder, IntraDecoder)
            and (entry.decoder.height, entry.decoder.width) == size
        ):
            with entry.lock:
                return entry.decoder.get_frames_at([int(i) for i in indices], rows=rows)
        frames = self._get_frames(key, path, indices, rate_hz, False, None)
        if size is not None and tuple(frames.shape[2:]) != size:
            raise IntegrityError(
                f"video blob {key} holds frames of {frames.shape[3]}x{frames.shape[2]}, its "
                f"manifest says {size[1]}x{size[0]}; the data on the server is broken: "
                "report it to the data owners"
            )
        for frame, dests in zip(frames, rows, strict=True):
            for dest in dests:
                dest.copy_(frame)
        return frames[:0]

    def __len__(self) -> int:
        return len(self._open)

    def open_backends(self) -> list[str]:
        """Backend of each video in the cache, least recently used first: ``"intra"`` (the
        packet decoder), ``"torchcodec"`` or ``"pyav"`` (a video still being opened is left out)."""
        with self._lock:
            entries = list(self._open.values())
        return [_backend_name(e.decoder) for e in entries if e.decoder is not None]
