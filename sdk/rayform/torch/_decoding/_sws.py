"""A decoded frame's colour conversion written straight into the caller's memory.

PyAV's ``VideoReformatter.reformat`` allocates a new frame for every conversion, and its
planes must then be copied into the batch. Here the same ``libswscale`` that PyAV loaded
converts into the destination given (a batch row, a decode buffer), with no frame and no copy
in between (what that buys: docs/benchmarks.md, the ablation).

Calls go through :mod:`ctypes` to the library PyAV itself loaded (its wheel's bundled FFmpeg,
else the one mapped into this process), so the conversion is FFmpeg's own. A converter is
used only after it proved itself: :func:`convert_into` converts the first frame of each kind
(layout, pixel format, size, colour space, range) in each thread both ways, and keeps PyAV's
path for that kind unless the bits are the same.
"""

from __future__ import annotations

import ctypes
import functools
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from av import VideoFrame

__all__ = ["Converter", "Kind", "checked", "convert_into", "converter", "forget"]

_P4 = ctypes.c_void_p * 4
_I4 = ctypes.c_int * 4
#: ``SWS_BILINEAR``: PyAV's default interpolation (sizes are equal here, so it only picks the
#: chroma upsampling, which must be PyAV's for the same bits).
_SWS_BILINEAR = 2
#: ``AVCOL_RANGE_JPEG``: full-range YUV.
_RANGE_FULL = 2
#: Widths (pixels) converted here are multiples of this. swscale's SIMD writes whole blocks of
#: pixels and counts on FFmpeg's padded lines and buffers: at 120 pixels wide the packed RGB
#: output ran past a tight buffer's end (the process aborted), and planar RGB is wrong at widths
#: that are not multiples of 16. Lines of 64 pixels end every block exactly, in every layout.
_WIDTH_STEP = 64


class _Lib:
    """``libswscale``'s and ``libavutil``'s entry points used here, typed."""

    def __init__(self, swscale: str, avutil: str) -> None:
        sws = ctypes.CDLL(swscale)
        avu = ctypes.CDLL(avutil)
        self.get_pix_fmt = avu.av_get_pix_fmt
        self.get_pix_fmt.restype = ctypes.c_int
        self.get_pix_fmt.argtypes = [ctypes.c_char_p]
        self.get_context = sws.sws_getContext
        self.get_context.restype = ctypes.c_void_p
        self.get_context.argtypes = [ctypes.c_int] * 7 + [ctypes.c_void_p] * 3
        self.coefficients = sws.sws_getCoefficients
        self.coefficients.restype = ctypes.c_void_p
        self.coefficients.argtypes = [ctypes.c_int]
        self.set_colorspace = sws.sws_setColorspaceDetails
        self.set_colorspace.restype = ctypes.c_int
        # (context, source coefficients, source full range, destination coefficients,
        # destination full range, brightness, contrast, saturation)
        self.set_colorspace.argtypes = [
            ctypes.c_void_p,
            ctypes.c_void_p,
            ctypes.c_int,
            ctypes.c_void_p,
            ctypes.c_int,
            ctypes.c_int,
            ctypes.c_int,
            ctypes.c_int,
        ]
        self.scale = sws.sws_scale
        self.scale.restype = ctypes.c_int
        self.scale.argtypes = [ctypes.c_void_p, _P4, _I4, ctypes.c_int, ctypes.c_int, _P4, _I4]
        self.free_context = sws.sws_freeContext
        self.free_context.restype = None
        self.free_context.argtypes = [ctypes.c_void_p]


@functools.cache
def _lib() -> _Lib | None:
    """The libraries PyAV uses (``None`` where they cannot be found: no PyAV, not Linux)."""
    try:
        import av
    except ImportError:
        return None
    # A PyAV wheel bundles its FFmpeg beside the package; another install links the system's.
    # (The process may map a second FFmpeg too: torchcodec loads the system's.)
    bundled = Path(av.__file__).parent.parent / "av.libs"
    found = {}
    for name in ("libswscale", "libavutil"):
        hits = sorted(bundled.glob(f"{name}-*.so*")) if bundled.is_dir() else []
        if not hits:
            hits = sorted(Path(p) for p in _mapped() if Path(p).name.startswith(name + "."))
        if len(hits) != 1:  # none, or two to choose from: keep PyAV's own path
            return None
        found[name] = os.fspath(hits[0])
    try:
        return _Lib(found["libswscale"], found["libavutil"])
    except (OSError, AttributeError):
        return None


def _mapped() -> set[str]:
    """Paths of the shared libraries mapped into this process (none where ``/proc`` is not)."""
    try:
        with open("/proc/self/maps") as maps:
            return {line.split(None, 5)[-1].strip() for line in maps if ".so" in line}
    except OSError:
        return set()


class Converter:
    """Converts frames of one size, pixel format, colour space and range to ``dst_format``
    (``"gbrp"``, ``"rgb24"`` or ``"rgba"``) into the caller's memory. Not thread-safe: one
    thread uses it (:func:`convert_into` keeps one per thread)."""

    def __init__(self, lib: _Lib, frame: VideoFrame, dst_format: str) -> None:
        self._lib = lib
        self.width, self.height = frame.width, frame.height
        self.dst_format = dst_format
        src = lib.get_pix_fmt(frame.format.name.encode())
        dst = lib.get_pix_fmt(dst_format.encode())
        if src < 0 or dst < 0:
            raise ValueError(f"no pixel format {frame.format.name} or {dst_format}")
        self._ctx = lib.get_context(
            self.width,
            self.height,
            src,
            self.width,
            self.height,
            dst,
            _SWS_BILINEAR,
            None,
            None,
            None,
        )
        if not self._ctx:
            raise ValueError(f"swscale cannot convert {frame.format.name} to {dst_format}")
        # As PyAV's frame conversion reads them: the frame's colour space picks the
        # coefficients (unspecified gives BT.601's), its range the input levels; RGB is full.
        table = lib.coefficients(int(frame.colorspace))
        full = 1 if int(frame.color_range) == _RANGE_FULL else 0
        if lib.set_colorspace(self._ctx, table, full, table, 1, 0, 1 << 16, 1 << 16) < 0:
            raise ValueError("swscale refused the colour space")
        self._planes = len(frame.planes)
        h, w = self.height, self.width
        # The destination's layout, and where swscale writes in it (offsets, line strides).
        if dst_format == "gbrp":  # FFmpeg's planar RGB is G, B, R: into planes 1, 2, 0
            self._shape: tuple[int, ...] = (3, h, w)
            self._offsets: tuple[int, ...] = (h * w, 2 * h * w, 0)
            self._strides = _I4(w, w, w, 0)
        else:
            channels = 3 if dst_format == "rgb24" else 4
            self._shape = (h, w, channels)
            self._offsets = (0,)
            self._strides = _I4(w * channels, 0, 0, 0)

    def into(self, frame: VideoFrame, dst: np.ndarray) -> None:
        """Convert ``frame`` into ``dst``: ``uint8 (3, H, W)`` for ``"gbrp"`` (RGB planes, in
        that order), ``(H, W, 3)`` for ``"rgb24"``, ``(H, W, 4)`` for ``"rgba"``; C-contiguous
        (anything else raises ``ValueError``, before swscale touches memory)."""
        if (
            dst.shape != self._shape
            or dst.dtype != np.uint8
            or not dst.flags.c_contiguous
            or not dst.flags.writeable
        ):
            raise ValueError(
                f"{self.dst_format} needs a writable contiguous {self._shape} uint8 array"
            )
        planes = frame.planes
        if (frame.width, frame.height) != (self.width, self.height) or len(planes) != self._planes:
            raise ValueError("the frame's size or layout is not the converter's")
        src = _P4(*(p.buffer_ptr for p in planes), *([None] * (4 - len(planes))))
        strides = _I4(*(p.line_size for p in planes), *([0] * (4 - len(planes))))
        base = dst.ctypes.data
        out = _P4(*(base + o for o in self._offsets), *([None] * (4 - len(self._offsets))))
        self._lib.scale(self._ctx, src, strides, 0, self.height, out, self._strides)

    def __del__(self) -> None:
        ctx = getattr(self, "_ctx", None)
        if ctx:
            self._lib.free_context(ctx)


_lock = threading.Lock()


def converter(frame: VideoFrame, dst_format: str, reference: np.ndarray) -> Converter | None:
    """A :class:`Converter` for frames like ``frame``, or ``None``: the width is not a
    multiple of 64 pixels, the libraries are not found, swscale refuses the conversion, or it
    does not give ``reference`` (PyAV's own conversion of ``frame``, laid out as
    :meth:`Converter.into` writes it) bit for bit."""
    if frame.width % _WIDTH_STEP:
        return None
    with _lock:
        lib = _lib()
    if lib is None:
        return None
    try:
        conv = Converter(lib, frame, dst_format)
        mine = np.empty_like(reference)
        conv.into(frame, mine)
    except (ValueError, OSError):
        return None
    return conv if np.array_equal(mine, reference) else None


#: What a conversion's bits depend on: the output layout, then the frame's pixel format, size,
#: colour space and range.
Kind = tuple[str, str, int, int, int, int]


class _Known(threading.local):
    """This thread's converters by :data:`Kind` (``None``: checked, and PyAV's path is kept).
    Per thread because a swscale context is not thread-safe; kept for the process's life
    because making one costs more than converting several frames (its tables), and a
    decoder is opened per video."""

    def __init__(self) -> None:
        self.by_kind: dict[Kind, Converter | None] = {}


_known = _Known()


def convert_into(
    frame: VideoFrame,
    dst_format: str,
    dst: np.ndarray,
    pyav: Callable[[VideoFrame, str, np.ndarray], None],
) -> None:
    """Convert ``frame`` into ``dst`` (laid out as :meth:`Converter.into` says): straight
    into it where this thread's converter for frames of its kind gives PyAV's bits, else by
    ``pyav(frame, dst_format, dst)``. The first frame of each kind goes through ``pyav`` and
    then checks the converter against it."""
    if not (dst.flags.c_contiguous and dst.flags.writeable):
        pyav(frame, dst_format, dst)
        return
    kind = (
        dst_format,
        frame.format.name,
        frame.width,
        frame.height,
        int(frame.colorspace),
        int(frame.color_range),
    )
    known = _known.by_kind
    if kind not in known:
        pyav(frame, dst_format, dst)
        known[kind] = converter(frame, dst_format, dst)
        return
    conv = known[kind]
    if conv is None:
        pyav(frame, dst_format, dst)
    else:
        conv.into(frame, dst)


def checked() -> dict[Kind, bool]:
    """This thread's checks so far (a copy): kind of frame -> whether the converter is used."""
    return {kind: conv is not None for kind, conv in _known.by_kind.items()}


def forget() -> None:
    """Drop this thread's converters: the next frame of each kind is checked again."""
    _known.by_kind.clear()
