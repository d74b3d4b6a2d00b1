"""Coordinate conventions of Cartesian streams and the conversions between them.

Conventions (``frame=`` of :class:`~rayform.torch.EpisodeDataset`):

* ``"ros"`` (REP 103): x forward, y left, z up.
* ``"opencv"``: x right, y down, z forward.
* ``None``: values as stored.

Quaternions are ``(x, y, z, w)`` in every convention. A change of convention is a proper
rotation ``R`` of the axes (``det R = +1``), so a position ``p`` becomes ``R p`` and a
quaternion ``(v, w)`` becomes ``(R v, w)`` (conjugation by ``R`` rotates the vector part and
keeps the scalar part and its sign). A pose ``(x, y, z, qx, qy, qz, qw)`` converts both parts.
Streams whose manifest ``quantity`` is not ``position``/``quaternion``/``pose`` (joint space,
images) are never touched.
"""

from __future__ import annotations

import numpy as np

from rayform.errors import InvalidArgumentError
from rayform.manifest import Stream

__all__ = ["FRAMES", "check_frame", "convert", "needs_conversion"]

#: Values accepted by ``frame=``.
FRAMES = ("ros", "opencv", None)

# Rows: OpenCV axes expressed in ROS axes. x_cv = -y_ros, y_cv = -z_ros, z_cv = x_ros.
_ROS_TO_OPENCV = np.array([[0.0, -1.0, 0.0], [0.0, 0.0, -1.0], [1.0, 0.0, 0.0]])
_ROTATIONS = {("ros", "opencv"): _ROS_TO_OPENCV, ("opencv", "ros"): _ROS_TO_OPENCV.T}


def check_frame(frame: object) -> str | None:
    """Return ``frame`` if it is a supported convention, else raise InvalidArgumentError."""
    if frame is None or (isinstance(frame, str) and frame in FRAMES):
        return frame
    raise InvalidArgumentError(
        f"frame={frame!r} is not a supported coordinate convention: use 'ros' (REP 103: x "
        "forward, y left, z up), 'opencv' (x right, y down, z forward) or None (as stored)."
    )


def needs_conversion(stream: Stream, frame: str | None) -> bool:
    """Whether values of ``stream`` change when the sample is requested in ``frame``."""
    return (
        frame is not None
        and stream.quantity is not None
        and stream.frame is not None
        and stream.frame != frame
    )


def convert(values: np.ndarray, stream: Stream, frame: str | None) -> np.ndarray:
    """Convert records ``(..., D)`` of ``stream`` into convention ``frame``.

    Returns ``values`` unchanged when no conversion is needed; otherwise a new ``float32``
    array of the same shape.
    """
    if not needs_conversion(stream, frame):
        return values
    rot = _ROTATIONS[(str(stream.frame), str(frame))]
    out = np.array(values, dtype=np.float32, copy=True)
    quantity = stream.quantity
    if quantity in ("position", "pose"):
        out[..., 0:3] = values[..., 0:3] @ rot.T
    if quantity == "quaternion":
        out[..., 0:3] = values[..., 0:3] @ rot.T
    elif quantity == "pose":
        out[..., 3:6] = values[..., 3:6] @ rot.T
    return out
