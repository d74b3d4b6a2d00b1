"""Convert decoded ROS 2 messages (from ``mcap_ros2``) to arrays.

Supported types: ``sensor_msgs/msg/Image`` (``rgb8``, ``bgr8``, ``rgba8``, ``bgra8``,
``mono8``), ``sensor_msgs/msg/CompressedImage`` (JPEG or PNG, decoded with PyAV),
``sensor_msgs/msg/JointState`` (``position``, ``velocity``, ``effort``),
``geometry_msgs/msg/PoseStamped`` and ``geometry_msgs/msg/TransformStamped`` (as
``(x, y, z, qx, qy, qz, qw)``, metres, ROS convention).
"""

from __future__ import annotations

from typing import Any

import av
import numpy as np

from rayform.errors import InvalidArgumentError

__all__ = [
    "COMPRESSED",
    "IMAGE",
    "JOINT_FIELDS",
    "JOINT_STATE",
    "POSE",
    "STRING",
    "TRANSFORM",
    "compressed_rgb",
    "image_rgb",
    "joint_field",
    "pose7",
    "schema_kind",
    "stamp_ns",
]

IMAGE = "sensor_msgs/msg/Image"
COMPRESSED = "sensor_msgs/msg/CompressedImage"
JOINT_STATE = "sensor_msgs/msg/JointState"
POSE = "geometry_msgs/msg/PoseStamped"
TRANSFORM = "geometry_msgs/msg/TransformStamped"
#: Instructions as plain strings (no header: timed by the message's log time).
STRING = "std_msgs/msg/String"
JOINT_FIELDS = ("position", "velocity", "effort")
_KINDS = {
    IMAGE: "image",
    COMPRESSED: "compressed",
    JOINT_STATE: "joint",
    POSE: "pose",
    TRANSFORM: "transform",
    STRING: "string",
}


def schema_kind(schema_name: str) -> str | None:
    """``"image"``, ``"compressed"``, ``"joint"``, ``"pose"``, ``"transform"``, ``"string"``
    or ``None``.

    Accepts both ``pkg/msg/Type`` and ROS 1 style ``pkg/Type`` names.
    """
    pkg, _, typ = schema_name.partition("/")
    typ = typ.split("/")[-1]
    return _KINDS.get(f"{pkg}/msg/{typ}")


def stamp_ns(msg: Any) -> int:
    """``header.stamp`` in ns."""
    stamp = msg.header.stamp
    return int(stamp.sec) * 1_000_000_000 + int(stamp.nanosec)


def image_rgb(msg: Any) -> np.ndarray:
    """A ``sensor_msgs/msg/Image`` as ``(H, W, 3) uint8`` RGB.

    Raises:
        InvalidArgumentError: an encoding other than rgb8/bgr8/rgba8/bgra8/mono8, or a
            ``data`` size that does not match ``height * step``.
    """
    enc = str(msg.encoding).lower()
    channels = {"rgb8": 3, "bgr8": 3, "rgba8": 4, "bgra8": 4, "mono8": 1, "8uc1": 1, "8uc3": 3}.get(
        enc
    )
    if channels is None:
        raise InvalidArgumentError(
            f"image encoding {msg.encoding!r} is not supported (rgb8, bgr8, rgba8, bgra8, mono8 are)"
        )
    h, w, step = int(msg.height), int(msg.width), int(msg.step)
    buf = np.frombuffer(bytes(msg.data), dtype=np.uint8)
    if buf.size != h * step or step < w * channels:
        raise InvalidArgumentError(
            f"image data has {buf.size} bytes, expected height*step = {h}*{step} for {w}x{h} {enc}"
        )
    img = buf.reshape(h, step)[:, : w * channels].reshape(h, w, channels)
    if channels == 1:
        return np.repeat(img, 3, axis=2)
    if enc.startswith("bgr"):
        img = img[:, :, 2::-1]
    return np.ascontiguousarray(img[:, :, :3])


def compressed_rgb(msg: Any) -> np.ndarray:
    """A ``sensor_msgs/msg/CompressedImage`` (JPEG or PNG) as ``(H, W, 3) uint8`` RGB."""
    fmt = str(msg.format).lower()
    codec = av.CodecContext.create("png" if "png" in fmt else "mjpeg", "r")
    try:
        frames = list(codec.decode(av.Packet(bytes(msg.data))))
        frames += list(codec.decode(None))
    except av.FFmpegError as exc:
        raise InvalidArgumentError(
            f"cannot decode a compressed image (format {msg.format!r}): {exc}"
        ) from exc
    if not frames:
        raise InvalidArgumentError(f"a compressed image (format {msg.format!r}) decoded to nothing")
    return frames[0].to_ndarray(format="rgb24")


def joint_field(msg: Any, field: str) -> np.ndarray:
    """``position``, ``velocity`` or ``effort`` of a ``JointState`` as ``float64 (D,)``."""
    return np.asarray(getattr(msg, field), dtype=np.float64)


def pose7(msg: Any, kind: str) -> np.ndarray:
    """A ``PoseStamped`` or ``TransformStamped`` as ``(x, y, z, qx, qy, qz, qw)`` float64."""
    if kind == "pose":
        p, q = msg.pose.position, msg.pose.orientation
    else:
        p, q = msg.transform.translation, msg.transform.rotation
    return np.array([p.x, p.y, p.z, q.x, q.y, q.z, q.w], dtype=np.float64)
