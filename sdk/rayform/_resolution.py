"""Training resolution as data: the ``image_size=``/``resize=`` arguments and their geometry.

``EpisodeDataset(image_size=(H, W), resize=MODE)`` gives every camera of a sample as
``uint8 (3, H, W)``. Modes:

* ``"pad"``: keep the aspect ratio, fit inside ``(H, W)``, pad with zeros centred (pi0, pi0.5,
  SmolVLA);
* ``"squash"``: scale each axis to ``(H, W)`` (OpenVLA, Octo);
* ``"crop"``: scale the short side, crop the centre (Diffusion Policy, ResNet-style encoders).

This module holds the arguments' validation, their canonical text (dataset URIs, the CLI's
``--image-size 224x224``) and the geometry (:meth:`Target.plan`): which source box becomes
which part of the output. It needs neither torch nor a network; the pixels are resized by
:mod:`rayform.torch._decoding._resize`. The geometry is a function of the source size only.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rayform.errors import InvalidArgumentError
from rayform.manifest import (
    BlobRef,
    Rendition,
    Segment,
    Segments,
    Stream,
    chosen_blobs,
    first_kinds,
)

__all__ = [
    "MAX_SIZE",
    "RESIZE_MODES",
    "Plan",
    "Target",
    "check_image_size",
    "check_resize",
    "camera_streams",
    "check_size_value",
    "choose_rendition",
    "describe_resolution",
    "format_image_size",
    "image_size_of",
    "parse_image_size",
    "rendition_name",
    "resolution_blobs",
    "stream_blobs",
    "video_blob",
]

#: Values of ``resize=``.
RESIZE_MODES = ("pad", "squash", "crop")
#: Largest ``H`` or ``W`` accepted, in pixels (8K video is 4320 x 7680).
MAX_SIZE = 8192


@dataclass(frozen=True)
class Plan:
    """How one source size becomes a target: a source box, scaled, placed in the output.

    Attributes:
        box: ``(top, left, height, width)`` of the source region used, in source pixels.
        scaled: ``(height, width)`` the box is resized to, in output pixels.
        at: ``(top, left)`` of the scaled box in the ``(H, W)`` output (non-zero only for
            ``"pad"``; the rest is zeros).
    """

    box: tuple[int, int, int, int]
    scaled: tuple[int, int]
    at: tuple[int, int]

    @property
    def downscales(self) -> bool:
        """Whether no axis is enlarged: the source has at least the pixels the output needs."""
        return self.box[2] >= self.scaled[0] and self.box[3] >= self.scaled[1]


@dataclass(frozen=True)
class Target:
    """A camera's training resolution: ``height`` x ``width`` pixels, by ``mode``.

    Attributes:
        height: output rows ``H``.
        width: output columns ``W``.
        mode: ``"pad"``, ``"squash"`` or ``"crop"``.
    """

    height: int
    width: int
    mode: str

    def __post_init__(self) -> None:
        check_resize(self.mode)
        _check_hw("image_size", (self.height, self.width))

    def plan(self, height: int, width: int) -> Plan:
        """The :class:`Plan` for a ``height`` x ``width`` source (pixels)."""
        th, tw = self.height, self.width  # the target's size
        if self.mode == "squash":
            return Plan((0, 0, height, width), (th, tw), (0, 0))
        if self.mode == "crop":
            # The centred box of the target's aspect ratio, as large as the source allows.
            if width * th > height * tw:  # the source is wider: crop columns
                cw = min(width, max(1, _round(height * tw / th)))
                return Plan((0, (width - cw) // 2, height, cw), (th, tw), (0, 0))
            ch = min(height, max(1, _round(width * th / tw)))
            return Plan(((height - ch) // 2, 0, ch, width), (th, tw), (0, 0))
        scale = min(th / height, tw / width)
        sh, sw = min(th, max(1, _round(height * scale))), min(tw, max(1, _round(width * scale)))
        return Plan((0, 0, height, width), (sh, sw), ((th - sh) // 2, (tw - sw) // 2))


#: ``image_size=``: ``(H, W)`` in pixels for every camera, or ``{camera key: (H, W)}``.
ImageSize = tuple[int, int] | Mapping[str, tuple[int, int]]


def _round(x: float) -> int:
    # Half up, not Python's half to even: the geometry reads as plain arithmetic.
    return int(x + 0.5)


def _check_hw(name: str, value: Sequence[int]) -> tuple[int, int]:
    ok = (
        isinstance(value, Sequence)
        and not isinstance(value, str)
        and len(value) == 2
        and all(isinstance(v, numbers.Integral) and not isinstance(v, bool) for v in value)
    )
    if not ok or not all(1 <= int(v) <= MAX_SIZE for v in value):
        raise InvalidArgumentError(
            f"{name}={value!r}: use (height, width) in pixels, two integers from 1 to {MAX_SIZE}, "
            "e.g. (224, 224)"
        )
    return int(value[0]), int(value[1])


def check_resize(resize: str | None) -> str:
    """Return ``resize`` if it is a mode, else raise InvalidArgumentError naming the modes."""
    if resize not in RESIZE_MODES:
        raise InvalidArgumentError(
            f"resize={resize!r}: use one of {', '.join(map(repr, RESIZE_MODES))} ('pad' keeps the "
            "aspect ratio and pads, 'squash' scales each axis, 'crop' crops the centre)"
        )
    return str(resize)


def check_size_value(image_size: ImageSize | None, resize: str) -> None:
    """Check ``image_size`` (``(H, W)`` or a dict of them) and ``resize`` alone, where the
    cameras are not known (a columnar manifest's pull)."""
    check_resize(resize)
    if isinstance(image_size, Mapping):
        for key, value in image_size.items():
            _check_hw(f"image_size[{key!r}]", value)
    elif image_size is not None:
        _check_hw("image_size", image_size)


def check_image_size(
    image_size: ImageSize | None, resize: str, cameras: Sequence[str]
) -> dict[str, Target] | None:
    """Validate ``image_size=`` and ``resize=`` of a dataset whose camera keys are ``cameras``.

    Args:
        image_size: ``None`` (frames as stored), ``(H, W)`` for every camera, or a dict
            ``{camera key: (H, W)}`` naming every camera.
        resize: ``"pad"``, ``"squash"`` or ``"crop"``.
        cameras: the sample keys that are cameras, in the dataset's order.

    Returns:
        ``{camera key: Target}`` in ``cameras`` order, or ``None`` for ``image_size=None``.

    Raises:
        InvalidArgumentError: a value is not allowed (the message says what is and how to fix it).
    """
    check_resize(resize)
    if image_size is None:
        return None
    if not cameras:
        raise InvalidArgumentError(
            f"image_size={image_size!r} but obs has no camera (video) stream: leave image_size=None"
        )
    if isinstance(image_size, Mapping):
        unknown = [k for k in image_size if k not in cameras]
        if unknown:
            raise InvalidArgumentError(
                f"image_size names {unknown[0]!r}, which is not a camera of this dataset: key it by "
                f"the sample's camera keys ({', '.join(cameras)})"
            )
        missing = [k for k in cameras if k not in image_size]
        if missing:
            raise InvalidArgumentError(
                f"image_size has no size for camera {missing[0]!r}: give every camera a size "
                f"({', '.join(cameras)}), or pass one (H, W) for all"
            )
        sizes = {k: _check_hw(f"image_size[{k!r}]", image_size[k]) for k in cameras}
    else:
        hw = _check_hw("image_size", image_size)
        sizes = dict.fromkeys(cameras, hw)
    return {k: Target(h, w, resize) for k, (h, w) in sizes.items()}


def format_image_size(
    image_size: tuple[int, int] | Mapping[str, Sequence[int]], order: Sequence[str] = ()
) -> str:
    """The canonical text of an ``image_size`` (dataset URIs, the CLI): ``224x224`` when every
    camera has the same size, else ``cam0/rgb:224x224,wrist/rgb:128x128`` with the cameras in
    ``order`` (the dataset's), any others after them in sorted order.

    Raises:
        InvalidArgumentError: a size is not two integers from 1 to :data:`MAX_SIZE`.
    """
    if not isinstance(image_size, Mapping):
        h, w = _check_hw("image_size", image_size)
        return f"{h}x{w}"
    sizes = {k: _check_hw(f"image_size[{k!r}]", v) for k, v in image_size.items()}
    if not sizes:
        raise InvalidArgumentError(
            "image_size={}: name a size per camera, or pass one (H, W) for all"
        )
    if len(set(sizes.values())) == 1:
        h, w = next(iter(sizes.values()))
        return f"{h}x{w}"
    keys = [k for k in order if k in sizes] + sorted(k for k in sizes if k not in order)
    return ",".join(f"{k}:{sizes[k][0]}x{sizes[k][1]}" for k in keys)


def parse_image_size(text: str) -> tuple[int, int] | dict[str, tuple[int, int]]:
    """Inverse of :func:`format_image_size`: ``(H, W)`` or ``{camera key: (H, W)}``.

    Raises:
        InvalidArgumentError: not ``HxW`` nor ``KEY:HxW,...``.
    """

    def hw(item: str) -> tuple[int, int]:
        h, x, w = item.partition("x")
        # ASCII digits only: str.isdigit() also accepts "²", which int() refuses.
        if not (x and h.isascii() and w.isascii() and h.isdigit() and w.isdigit()):
            raise InvalidArgumentError(
                f"image_size={text!r}: write HEIGHTxWIDTH in pixels (e.g. 224x224), or "
                "KEY:HxW,KEY:HxW per camera"
            )
        return int(h), int(w)

    if ":" not in text:
        return hw(text)
    out: dict[str, tuple[int, int]] = {}
    for item in text.split(","):
        key, _, size = item.rpartition(":")
        if not key or key in out:
            raise InvalidArgumentError(
                f"image_size={text!r}: write KEY:HxW once per camera, e.g. cam0/rgb:224x224"
            )
        out[key] = hw(size)
    return out


# -- stored renditions ----------------------------------------------------------------------------
def choose_rendition(stream: Stream, target: Target | None) -> Rendition | None:
    """The rendition of a camera ``stream`` to read for ``target``: the smallest whose frames
    cover it (resizing it to the target enlarges no axis of the region ``target.mode`` uses),
    or ``None`` for the original (no target, no renditions, or none large enough).

    The dataset, its read-ahead and ``pull(image_size=...)`` all choose with this function, so
    a pull fetches exactly what training reads.
    """
    if target is None:
        return None
    for rendition in stream.renditions:  # smallest first
        if target.plan(rendition.height, rendition.width).downscales:
            return rendition
    return None


def video_blob(stream: Stream, target: Target | None) -> BlobRef:
    """The video blob read for ``target``: the chosen rendition's, else the original's."""
    chosen = choose_rendition(stream, target)
    return stream.blob if chosen is None else chosen.blob


def stream_blobs(stream: Stream, target: Target | None) -> list[BlobRef]:
    """Every blob reading ``stream`` at ``target`` needs: the chosen video and the timestamps
    blob (renditions share the original's), or a table's blob."""
    if stream.timestamps is None or target is None:
        return stream.blobs()
    return [video_blob(stream, target), stream.timestamps]


def rendition_name(stream: Stream, target: Target | None) -> str:
    """What :func:`choose_rendition` picks, for humans and trackers: ``"240x320"`` (height x
    width of a rendition) or ``"original"``."""
    chosen = choose_rendition(stream, target)
    return "original" if chosen is None else f"{chosen.height}x{chosen.width}"


def resolution_blobs(
    segments: Iterable[Segment],
    names: Sequence[str] | None,
    image_size: ImageSize | None,
    resize: str,
) -> dict[str, BlobRef]:
    """``{hash: BlobRef}`` a dataset at ``image_size``/``resize`` reads from ``segments``, for
    the streams ``names`` (all if ``None``): each camera's chosen rendition (or original) with
    its timestamps, and every table, exactly as the dataset chooses
    (``pull(image_size=...)``).

    Every manifest version answers from its columns (:func:`rayform.manifest.chosen_blobs`,
    the test of :func:`choose_rendition` per rendition size, no :class:`Segment` built; a
    pass would build one per row: ~22 s at 100,000 episodes); any other iterable of segments
    becomes such columns first. The dict's order is that of a pass over the segments.

    Raises:
        InvalidArgumentError: ``image_size`` or ``resize`` is not allowed; a dict names a stream
            that is not a camera, or leaves a camera out.
    """
    table = _as_segments(segments)
    chosen = check_image_size(image_size, resize, camera_streams(table, names)) or {}
    return chosen_blobs(table, names, {k: _covers(t) for k, t in chosen.items()})


def _as_segments(segments: Iterable[Segment]) -> Segments:
    return segments if isinstance(segments, Segments) else Segments(list(segments))


def camera_streams(segments: Iterable[Segment], names: Sequence[str] | None) -> list[str]:
    """The camera (video) streams among ``names`` (all if ``None``) of ``segments``, sorted:
    the keys a per-camera ``image_size`` dict must name for a pull."""
    return _videos(first_kinds(_as_segments(segments), names))


def _videos(kinds: Mapping[str, str]) -> list[str]:
    return [name for name, kind in sorted(kinds.items()) if kind == "video"]


def _covers(target: Target) -> Callable[[int, int], bool]:
    """Whether a ``height`` x ``width`` rendition covers ``target``: the test
    :func:`choose_rendition` applies to each rendition, smallest first."""
    return lambda height, width: target.plan(height, width).downscales


def image_size_of(
    targets: Mapping[str, Target] | None, key_of: Callable[[str], str] = str
) -> tuple[int, int] | dict[str, tuple[int, int]] | None:
    """``(H, W)`` when every camera of ``targets`` (stream -> target) has it, else ``{key_of(
    stream): (H, W)}``; ``None`` without targets."""
    if not targets:
        return None
    sizes = {key_of(k): (t.height, t.width) for k, t in targets.items()}
    same = set(sizes.values())
    return same.pop() if len(same) == 1 else sizes


def describe_resolution(
    targets: Mapping[str, Target] | None,
    stream_of: Callable[[str], Stream],
    key_of: Callable[[str], str] = str,
) -> dict[str, Any]:
    """``describe()``'s keys for trackers: ``image_size`` (``[H, W]``, or ``{camera key: [H,
    W]}`` when cameras differ), ``resize`` and ``renditions`` (which stored video each camera
    reads, :func:`rendition_name`, in the stream ``stream_of(stream)``: the first episode's;
    ingest gives every episode the same renditions); all ``None`` without a training
    resolution. ``targets`` is keyed by stream; the output by ``key_of(stream)``."""
    size = image_size_of(targets, key_of)
    if not targets or size is None:
        return {"image_size": None, "resize": None, "renditions": None}
    return {
        "image_size": list(size)
        if isinstance(size, tuple)
        else {k: list(v) for k, v in size.items()},
        "resize": next(iter(targets.values())).mode,
        "renditions": {key_of(k): rendition_name(stream_of(k), t) for k, t in targets.items()},
    }
