"""The demo's little world: a bimanual arm over a textured table, its kinematics and cameras.

Everything here is procedural numpy (no simulator), fast enough to render thousands of
frames in seconds on one core, yet not flat colours: a wood or laminate table texture, shaded
arm links with soft edges, a box with visible sides and soft shadows, and a wrist camera that
looks down through the gripper fingers.

World frame (ROS convention, metres): x forward, y left, z up; the table top is ``z = 0``.
Each arm has 7 joints ``(waist, shoulder, elbow, forearm_roll, wrist_pitch, wrist_roll,
gripper)`` in radians; 14-D joint vectors are ``left`` then ``right``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["ARM_BASES", "Scene", "fk", "ik_down", "pose_ros_to_opencv", "table_texture"]

#: Shoulder height and link lengths (m): shoulder->elbow, elbow->wrist, wrist->fingertip.
L0, L1, L2, L3 = 0.12, 0.34, 0.32, 0.10
#: (x, y) of the left and right arm bases (m).
ARM_BASES = ((0.0, 0.30), (0.0, -0.30))
#: Texture extent (m) and resolution (m per texel).
_TEX_X0, _TEX_Y0, _TEX_RES = -0.4, -0.9, 0.0025
_TEX_SHAPE = (720, 720)  # rows along x, columns along y
BOX_SIZE = 0.05  # m, edge of the manipulated box


def ik_down(tip: np.ndarray, base: tuple[float, float]) -> np.ndarray:
    """Joint angles ``(waist, shoulder, elbow, wrist_pitch)`` (rad) putting the fingertip at
    ``tip`` (x, y, z in m) with the tool pointing straight down (elbow up)."""
    dx, dy = tip[0] - base[0], tip[1] - base[1]
    q0 = np.arctan2(dy, dx)
    r, h = np.hypot(dx, dy), tip[2] + L3 - L0
    d = np.clip((r * r + h * h - L1 * L1 - L2 * L2) / (2 * L1 * L2), -1.0, 1.0)
    q2 = -np.arccos(d)
    q1 = np.arctan2(h, r) - np.arctan2(L2 * np.sin(q2), L1 + L2 * np.cos(q2))
    q4 = -np.pi / 2 - q1 - q2
    return np.array([q0, q1, q2, q4])


def fk(q: np.ndarray, base: tuple[float, float]) -> dict[str, np.ndarray]:
    """Forward kinematics of one arm for joint vectors ``q (..., 7)`` (rad).

    Returns:
        ``shoulder``, ``elbow``, ``wrist``, ``tip``: points ``(..., 3)`` in m;
        ``yaw``, ``pitch``, ``roll``: tool orientation ``(...)`` in rad (Z-Y-X Euler, ROS).
    """
    q0, q1, q2, q3, q4, q5 = (q[..., i] for i in range(6))
    a1, a2, a3 = q1, q1 + q2, q1 + q2 + q4
    c, s = np.cos(q0), np.sin(q0)

    def point(r: np.ndarray, z: np.ndarray) -> np.ndarray:
        return np.stack([base[0] + r * c, base[1] + r * s, z], axis=-1)

    r1, z1 = L1 * np.cos(a1), L0 + L1 * np.sin(a1)
    r2, z2 = r1 + L2 * np.cos(a2), z1 + L2 * np.sin(a2)
    r3, z3 = r2 + L3 * np.cos(a3), z2 + L3 * np.sin(a3)
    zero = np.zeros_like(q0)
    return {
        "shoulder": point(zero, zero + L0),
        "elbow": point(r1, z1),
        "wrist": point(r2, z2),
        "tip": point(r3, z3),
        "yaw": q0,
        "pitch": -a3,
        "roll": q3 + q5,
    }


def pose_ros_to_opencv(
    tip: np.ndarray, yaw: np.ndarray, pitch: np.ndarray, roll: np.ndarray
) -> np.ndarray:
    """Tool poses ``(N, 7)`` = x, y, z (m), qx, qy, qz, qw in the OpenCV convention.

    The world axes are re-expressed as OpenCV's (x right, y down, z forward):
    ``p_cv = C p_ros`` with ``C = [[0,-1,0],[0,0,-1],[1,0,0]]`` and ``R_cv = C R_ros C^T``,
    whose quaternion is the ROS one with its vector part rotated by ``C``.
    """
    cy, sy = np.cos(yaw / 2), np.sin(yaw / 2)
    cp, sp = np.cos(pitch / 2), np.sin(pitch / 2)
    cr, sr = np.cos(roll / 2), np.sin(roll / 2)
    qw = cr * cp * cy + sr * sp * sy
    qx = sr * cp * cy - cr * sp * sy
    qy = cr * sp * cy + sr * cp * sy
    qz = cr * cp * sy - sr * sp * cy
    x, y, z = tip[:, 0], tip[:, 1], tip[:, 2]
    return np.stack([-y, -z, x, -qy, -qz, qx, qw], axis=1)


def _smooth_noise(
    rng: np.random.Generator, shape: tuple[int, int], cells: tuple[int, int]
) -> np.ndarray:
    """Bilinearly upsampled uniform noise in [0, 1), ``shape``."""
    coarse = rng.random((cells[0] + 1, cells[1] + 1))
    ry = np.linspace(0, cells[0], shape[0])
    rx = np.linspace(0, cells[1], shape[1])
    rows = np.array(
        [np.interp(ry, np.arange(cells[0] + 1), coarse[:, j]) for j in range(cells[1] + 1)]
    ).T
    return np.array([np.interp(rx, np.arange(cells[1] + 1), row) for row in rows])


def table_texture(site_index: int, seed: int) -> np.ndarray:
    """A table-top texture ``(720, 720, 3) float32`` (0-255): wood (even sites) or a grey
    cutting mat with a 5 cm grid (odd sites). Rows run along world x, columns along y."""
    rng = np.random.default_rng([seed, 7919, site_index])
    n1 = _smooth_noise(rng, _TEX_SHAPE, (9, 9))
    n2 = _smooth_noise(rng, _TEX_SHAPE, (60, 60))
    fine = rng.random(_TEX_SHAPE)
    xs = np.arange(_TEX_SHAPE[0])[:, None] * _TEX_RES
    ys = np.arange(_TEX_SHAPE[1])[None, :] * _TEX_RES
    if site_index % 2 == 0:
        grain = np.sin(2 * np.pi * (ys * 22.0 + 2.5 * n1 + 0.15 * n2))
        light = 0.80 + 0.10 * grain + 0.12 * n2 + 0.04 * fine
        base = np.array([176.0, 128.0, 82.0])
    else:
        gx = np.abs(((xs + 0.0125) % 0.05) - 0.025) < 0.0013
        gy = np.abs(((ys + 0.0125) % 0.05) - 0.025) < 0.0013
        light = 0.86 + 0.07 * n1 + 0.05 * n2 + 0.06 * fine - 0.18 * (gx | gy)
        base = np.array([92.0, 116.0, 104.0])
    return (light[..., None] * base).astype(np.float32)


def _tex_index(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    ix = np.clip(((x - _TEX_X0) * (1 / _TEX_RES)).astype(np.int32), 0, _TEX_SHAPE[0] - 1)
    iy = np.clip(((y - _TEX_Y0) * (1 / _TEX_RES)).astype(np.int32), 0, _TEX_SHAPE[1] - 1)
    return ix, iy


def paint_tape(
    tex: np.ndarray, center: tuple[float, float], half: float, color: tuple[float, ...]
) -> None:
    """Draw a square tape outline (the place target) of half-size ``half`` m onto ``tex``."""
    x0, y0 = _tex_index(np.array(center[0] - half), np.array(center[1] - half))
    x1, y1 = _tex_index(np.array(center[0] + half), np.array(center[1] + half))
    w = max(2, int(0.008 / _TEX_RES))
    col = np.array(color, dtype=np.float32)
    for sl in (
        (slice(x0, x1), slice(y0, y0 + w)),
        (slice(x0, x1), slice(y1 - w, y1)),
        (slice(x0, x0 + w), slice(y0, y1)),
        (slice(x1 - w, x1), slice(y0, y1)),
    ):
        tex[sl] = 0.35 * tex[sl] + 0.65 * col


def _blend(
    img: np.ndarray, box: tuple[int, int, int, int], alpha: np.ndarray, color: np.ndarray
) -> None:
    y0, y1, x0, x1 = box
    region = img[y0:y1, x0:x1]
    a = alpha[..., None]
    region *= 1 - a
    region += a * color


def _box(h: int, w: int, cx: float, cy: float, r: float) -> tuple[int, int, int, int] | None:
    x0, x1 = max(0, int(cx - r - 1)), min(w, int(cx + r + 2))
    y0, y1 = max(0, int(cy - r - 1)), min(h, int(cy + r + 2))
    return None if x0 >= x1 or y0 >= y1 else (y0, y1, x0, x1)


def capsule(
    img: np.ndarray, p: np.ndarray, q: np.ndarray, r0: float, r1: float, color: np.ndarray
) -> None:
    """A shaded, anti-aliased capsule from pixel ``p`` (radius ``r0``) to ``q`` (``r1``)."""
    h, w = img.shape[:2]
    rmax = max(r0, r1)
    x0, x1 = max(0, int(min(p[0], q[0]) - rmax - 1)), min(w, int(max(p[0], q[0]) + rmax + 2))
    y0, y1 = max(0, int(min(p[1], q[1]) - rmax - 1)), min(h, int(max(p[1], q[1]) + rmax + 2))
    if x0 >= x1 or y0 >= y1:
        return
    xs = np.arange(x0, x1, dtype=np.float32)[None, :] - p[0]
    ys = np.arange(y0, y1, dtype=np.float32)[:, None] - p[1]
    d = q - p
    ll = float(d @ d) or 1e-6
    t = np.clip((xs * d[0] + ys * d[1]) / ll, 0.0, 1.0)
    dist = np.sqrt((xs - t * d[0]) ** 2 + (ys - t * d[1]) ** 2)
    r = r0 + t * (r1 - r0)
    alpha = np.clip(r - dist + 0.5, 0.0, 1.0)
    shade = 1.0 - 0.5 * np.clip(dist / np.maximum(r, 0.5), 0, 1) ** 2
    y_, x_ = slice(y0, y1), slice(x0, x1)
    a = alpha[..., None]
    img[y_, x_] = img[y_, x_] * (1 - a) + a * (shade[..., None] * color)


def blob(img: np.ndarray, cx: float, cy: float, sigma: float, strength: float) -> None:
    """A soft Gaussian shadow centred at pixel ``(cx, cy)``."""
    b = _box(img.shape[0], img.shape[1], cx, cy, 3 * sigma)
    if b is None:
        return
    y0, y1, x0, x1 = b
    xs = np.arange(x0, x1, dtype=np.float32)[None, :] - cx
    ys = np.arange(y0, y1, dtype=np.float32)[:, None] - cy
    alpha = strength * np.exp(-(xs * xs + ys * ys) / (2 * sigma * sigma))
    _blend(img, b, alpha.astype(np.float32), np.zeros(3, np.float32))


def square(
    img: np.ndarray, cx: float, cy: float, half: float, angle: float, color: np.ndarray
) -> None:
    """A filled, anti-aliased square of half-size ``half`` px rotated by ``angle`` rad."""
    b = _box(img.shape[0], img.shape[1], cx, cy, half * 1.5)
    if b is None:
        return
    y0, y1, x0, x1 = b
    xs = np.arange(x0, x1, dtype=np.float32)[None, :] - cx
    ys = np.arange(y0, y1, dtype=np.float32)[:, None] - cy
    c, s = np.cos(angle), np.sin(angle)
    lx, ly = np.abs(c * xs + s * ys), np.abs(-s * xs + c * ys)
    alpha = np.clip(half - np.maximum(lx, ly) + 0.5, 0.0, 1.0)
    shade = 1.0 - 0.15 * (lx + ly) / max(half, 1.0)
    y_, x_ = slice(y0, y1), slice(x0, x1)
    a = alpha[..., None]
    img[y_, x_] = img[y_, x_] * (1 - a) + a * (shade[..., None] * color)


@dataclass
class State:
    """What a camera sees at one instant."""

    q: np.ndarray  # (14,) joint angles, rad
    box: np.ndarray  # (4,) box x, y, z of its bottom (m), yaw (rad)


class Scene:
    """Renders the overhead camera ``cam0`` and the left wrist camera for one episode.

    Args:
        tex: table texture from :func:`table_texture` (with tape painted on).
        size: ``(H, W)`` of both cameras in pixels (even numbers).
        box_color: RGB of the manipulated box (0-255).
    """

    _CAM0 = (0.36, 0.0, 1.15)  # overhead camera position (m), looking straight down
    _ARM_COLORS = (np.array([205, 205, 212], np.float32), np.array([60, 62, 70], np.float32))

    def __init__(self, tex: np.ndarray, size: tuple[int, int], box_color: np.ndarray) -> None:
        self.h, self.w = size
        self.f0 = 1.2 * self.w
        self.fw = 0.75 * self.w
        self.box_color = box_color.astype(np.float32)
        self.tex = tex
        # cam0 background: the table seen from above (done once per episode).
        u = np.arange(self.w, dtype=np.float32)[None, :]
        v = np.arange(self.h, dtype=np.float32)[:, None]
        cx, cy, cz = self._CAM0
        x = cx - (v - self.h / 2) * cz / self.f0 + 0 * u
        y = cy - (u - self.w / 2) * cz / self.f0 + 0 * v
        ix, iy = _tex_index(x, y)
        self.background = tex[ix, iy]
        # Wrist camera rays (tangent plane offsets) and a lens vignette.
        self.ra = (u - self.w / 2) / self.fw + 0 * v
        self.rb = (self.h / 2 - v) / self.fw + 0 * u
        rr = self.ra**2 + self.rb**2
        # Lens vignette times the arm's soft shadow (always below the wrist camera), once.
        shade = np.ones((self.h, self.w, 3), np.float32)
        blob(shade, self.w / 2, self.h / 2 + 0.1 * self.h, 0.12 * self.w, 0.35)
        self.wrist_shade = shade * (1.0 - 0.35 * rr / rr.max())[..., None].astype(np.float32)
        self.tex_flat = tex.reshape(-1, 3)

    def _px0(self, p: np.ndarray) -> np.ndarray:
        """World points ``(..., 3)`` to cam0 pixels ``(..., 2)`` (u right, v down)."""
        cx, cy, cz = self._CAM0
        depth = cz - p[..., 2]
        u = self.w / 2 - (p[..., 1] - cy) * self.f0 / depth
        v = self.h / 2 - (p[..., 0] - cx) * self.f0 / depth
        return np.stack([u, v], axis=-1).astype(np.float32)

    def _draw_box0(self, img: np.ndarray, box: np.ndarray) -> None:
        x, y, z, yaw = box
        for zz, dim in ((z, 0.7), (z + BOX_SIZE, 1.0)):
            c = self._px0(np.array([x, y, zz]))
            half = BOX_SIZE / 2 * self.f0 / (self._CAM0[2] - zz)
            square(img, c[0], c[1], half, -yaw, self.box_color * dim)

    def render_cam0(self, st: State) -> np.ndarray:
        """The overhead camera image ``(H, W, 3) uint8``."""
        img = self.background.copy()
        px_per_m = self.f0 / self._CAM0[2]
        bx = self._px0(np.array([st.box[0], st.box[1], 0.0]))
        blob(img, bx[0] + 3, bx[1] + 3, 0.6 * BOX_SIZE * px_per_m, 0.45)
        arms = []
        for k, base in enumerate(ARM_BASES):
            pts = fk(st.q[7 * k : 7 * k + 7], base)
            arms.append(pts)
            sh = self._px0(np.array([pts["tip"][0], pts["tip"][1], 0.0]))
            blob(img, sh[0] + 4, sh[1] + 4, (0.02 + 0.15 * pts["tip"][2]) * px_per_m, 0.5)
        self._draw_box0(img, st.box)
        for k, pts in enumerate(arms):
            color = self._ARM_COLORS[k]
            q = st.q[7 * k : 7 * k + 7]
            s, e, wr, tp = (self._px0(pts[n]) for n in ("shoulder", "elbow", "wrist", "tip"))
            scale = lambda p3: self.f0 / (self._CAM0[2] - p3[2])  # noqa: E731
            # Fingers: two thin capsules either side of the tool axis.
            yaw = pts["yaw"] + pts["roll"]
            side = np.array([-np.cos(yaw), np.sin(yaw)], np.float32)  # world (-sin, cos) in pixels
            sep = (0.012 + 0.035 * np.clip(q[6], 0, 1)) * scale(pts["tip"])
            for sgn in (-1, 1):
                off = sgn * sep * side
                capsule(
                    img,
                    wr + off * 0.6,
                    tp + off,
                    0.006 * scale(pts["wrist"]),
                    0.004 * scale(pts["tip"]),
                    color * 0.55,
                )
            capsule(img, e, wr, 0.028 * scale(pts["elbow"]), 0.022 * scale(pts["wrist"]), color)
            capsule(
                img, s, e, 0.035 * scale(pts["shoulder"]), 0.028 * scale(pts["elbow"]), color * 0.95
            )
            capsule(
                img, wr, wr, 0.03 * scale(pts["wrist"]), 0.03 * scale(pts["wrist"]), color * 0.8
            )
        return np.clip(img, 0, 255).astype(np.uint8)

    def render_wrist(self, st: State) -> np.ndarray:
        """The left wrist camera image ``(H, W, 3) uint8``: looks down the tool axis."""
        pts = fk(st.q[:7], ARM_BASES[0])
        cam = pts["wrist"]
        psi = float(pts["yaw"] + pts["roll"])
        fx, fy = np.cos(psi), np.sin(psi)  # image up
        rx, ry = np.sin(psi), -np.cos(psi)  # image right
        hgt = max(float(cam[2]), 0.03)
        x = float(cam[0]) + self.ra * float(hgt * rx) + self.rb * float(hgt * fx)
        y = float(cam[1]) + self.ra * float(hgt * ry) + self.rb * float(hgt * fy)
        ix, iy = _tex_index(x, y)
        img = np.take(self.tex_flat, ix * _TEX_SHAPE[1] + iy, axis=0)
        img *= self.wrist_shade
        bx, by, bz, byaw = st.box
        for zz, dim in ((bz, 0.7), (bz + BOX_SIZE, 1.0)):
            depth = hgt - zz
            if depth < 0.02:
                continue
            dx, dy = bx - cam[0], by - cam[1]
            u = self.w / 2 + (dx * rx + dy * ry) / depth * self.fw
            v = self.h / 2 - (dx * fx + dy * fy) / depth * self.fw
            half = BOX_SIZE / 2 / depth * self.fw
            if half < 2 * self.w:
                square(img, u, v, half, psi - byaw, self.box_color * dim)
        sep = (0.1 + 0.25 * np.clip(st.q[6], 0, 1)) * self.w
        finger = np.array([70, 72, 80], np.float32)
        for sgn in (-1, 1):
            cx = self.w / 2 + sgn * sep / 2
            capsule(
                img,
                np.array([cx, self.h * 1.05], np.float32),
                np.array([cx, self.h * 0.62], np.float32),
                0.07 * self.w,
                0.045 * self.w,
                finger,
            )
        return np.clip(img, 0, 255).astype(np.uint8)
