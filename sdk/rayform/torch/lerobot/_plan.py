"""What an export writes: the stream-to-feature mapping, the episodes and the files they go in.

Everything here is decided from the manifest and the dataset's grid before any frame is read,
so a resumed export makes the same plan and can skip the files a killed run completed.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rayform.errors import InvalidArgumentError
from rayform.lerobot_layout import BOOKKEEPING_FEATURES, VERSIONS

if TYPE_CHECKING:
    from rayform.slice import Slice

__all__ = [
    "ACTION",
    "FILE_BYTES",
    "STATE",
    "Plan",
    "Unit",
    "check_version",
    "default_feature_name",
    "pick_features",
    "state_and_action",
]

#: Source bytes (of the streams exported) per v3.0 file: LeRobot's 200 MB video file size.
FILE_BYTES = 200_000_000
_FEATURE_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")


def check_version(version: str) -> str:
    """``"3.0"`` or ``"2.1"`` (a leading ``v`` is accepted)."""
    v = str(version).removeprefix("v")
    if v not in VERSIONS:
        raise InvalidArgumentError(
            f"lerobot version {version!r}: use one of {', '.join(VERSIONS)} (3.0 is LeRobot's "
            "current format; 2.1 is what openpi and GR00T read)"
        )
    return v


def default_feature_name(stream: str, kind: str) -> str:
    """The LeRobot feature a stream becomes without ``--stream`` (the reverse of ingest's names).

    Cameras: ``top/rgb`` -> ``observation.images.top`` (a trailing ``/rgb`` dropped, ``/``
    become ``.``); tables: ``observation/state`` -> ``observation.state``, ``action`` ->
    ``action``, ``joints/position`` -> ``joints.position``.
    """
    words = stream.split("/")
    if kind == "video":
        if len(words) > 1 and words[-1] == "rgb":
            words = words[:-1]
        return ".".join(["observation", "images", *words])
    return ".".join(words)


#: LeRobot's own names of a robot's state and action features.
STATE, ACTION = "observation.state", "action"
#: A table stream ``P`` with a table stream ``P + DELTA`` beside it is a state and the action
#: that moves it (the demo's ``joints/position`` and ``joints/position_delta``).
DELTA = "_delta"


def state_and_action(streams: Mapping[str, str]) -> dict[str, str]:
    """``{stream: "observation.state" or "action"}`` for the streams of ``{stream: kind}``
    that say they are a robot's state and its action, for an export without ``--stream``.

    Where the slice has neither ``observation/state`` nor ``action`` (the streams LeRobot's
    own features are ingested as) and exactly one table stream ``P`` has a table stream
    ``P_delta`` beside it, ``P`` is the state and ``P_delta`` the action. Anything else is
    left to :func:`default_feature_name`: a guess between two pairs would be a silent one.
    """
    tables = {name for name, kind in streams.items() if kind != "video"}
    if "observation/state" in tables or "action" in tables:
        return {}
    pairs = sorted(p for p in tables if p + DELTA in tables)
    if len(pairs) != 1:
        return {}
    return {pairs[0]: STATE, pairs[0] + DELTA: ACTION}


def pick_features(
    slice_: Slice, streams: Mapping[str, str] | None
) -> tuple[dict[str, str], dict[str, str]]:
    """``({feature: stream}, {feature: kind})`` to export, checked.

    Raises:
        InvalidArgumentError: an unknown stream, a feature name LeRobot refuses or reserves, or
            two streams mapped to one feature.
    """
    kinds: dict[str, str] = {}
    segs = slice_.segments
    first = segs[0]
    available = slice_.streams
    texts = set(slice_.text_streams())  # tasks and language columns: _language
    if streams:
        chosen = dict(streams)
    else:
        kind_of = {
            s: first.streams[s].kind if s in first.streams else "table"
            for s in available
            if s not in texts
        }
        chosen = {s: "" for s in available} | state_and_action(kind_of)
    out: dict[str, str] = {}
    for stream, feature in chosen.items():
        if stream in texts:
            continue
        if stream not in available:
            raise InvalidArgumentError(
                f"--stream {stream}={feature}: the slice has no stream {stream!r}; its streams "
                f"are {', '.join(available)}"
            )
        kind = first.streams[stream].kind if stream in first.streams else "table"
        feature = feature or default_feature_name(stream, kind)
        if not _FEATURE_RE.fullmatch(feature):
            raise InvalidArgumentError(
                f"stream {stream!r} -> feature {feature!r}: LeRobot feature names are letters, "
                "digits, '_', '-' and '.' (no '/'); name it with --stream "
                f"{stream}=observation.NAME"
            )
        if feature in BOOKKEEPING_FEATURES or feature == "task":
            raise InvalidArgumentError(
                f"stream {stream!r} -> feature {feature!r}: LeRobot reserves that name; choose "
                f"another with --stream {stream}=NAME"
            )
        if feature in out:
            raise InvalidArgumentError(
                f"streams {out[feature]!r} and {stream!r} both map to feature {feature!r}: "
                f"name them with --stream, e.g. --stream {stream}={feature}2"
            )
        out[feature] = stream
        kinds[feature] = kind
    if not out:
        raise InvalidArgumentError(
            f"slice {slice_.id} has no camera or table streams to export"
            + (" (only text streams)" if texts else "")
        )
    return out, kinds


@dataclass(frozen=True)
class Unit:
    """One file of each kind (a data parquet, one MP4 per camera) and the episodes in it.

    Attributes:
        file: the file number (v3.0: chunk = file // 1000; v2.1: the episode index).
        episodes: positions of its episodes in the export (= their ``episode_index``).
    """

    file: int
    episodes: tuple[int, ...]


@dataclass(frozen=True)
class Plan:
    """The episodes (non-empty segments of the dataset's grid) and their files.

    Attributes:
        positions: per exported episode, its segment's position in the dataset.
        lengths: per exported episode, its number of frames (grid samples).
        units: the files, in order.
    """

    positions: tuple[int, ...]
    lengths: tuple[int, ...]
    units: tuple[Unit, ...]

    @property
    def first_index(self) -> list[int]:
        """Per episode, the global ``index`` of its first frame."""
        out, total = [], 0
        for n in self.lengths:
            out.append(total)
            total += n
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "positions": list(self.positions),
            "lengths": list(self.lengths),
            "units": [[u.file, list(u.episodes)] for u in self.units],
        }


def make_plan(
    lengths: list[int],
    source_bytes: list[int],
    version: str,
    episodes_per_file: int | None,
) -> Plan:
    """Episodes with at least one frame, grouped into files.

    Args:
        lengths: grid samples per segment of the dataset.
        source_bytes: bytes of the exported streams per segment (sizes the v3.0 files).
        version: ``"3.0"`` or ``"2.1"`` (one episode per file).
        episodes_per_file: v3.0: a fixed number of episodes per file instead of
            :data:`FILE_BYTES` of source per file.
    """
    positions = [i for i, n in enumerate(lengths) if n > 0]
    units: list[Unit] = []
    group: list[int] = []
    size = 0
    for e, pos in enumerate(positions):
        full = (
            len(group) >= episodes_per_file
            if episodes_per_file
            else size + source_bytes[pos] > FILE_BYTES
        )
        if group and (version == "2.1" or full):
            units.append(Unit(len(units) if version == "3.0" else group[0], tuple(group)))
            group, size = [], 0
        group.append(e)
        size += source_bytes[pos]
    if group:
        units.append(Unit(len(units) if version == "3.0" else group[0], tuple(group)))
    return Plan(tuple(positions), tuple(lengths[p] for p in positions), tuple(units))
