"""Sample keys mapped from stream names: ``obs={"image_primary": "cam_top/rgb"}``.

A dataset's ``obs`` is either a list of stream names (each sample key is its stream's name, as
before mappings existed) or a dict ``{sample key: stream name}``; its ``action`` is a stream
name (the sample key ``"action"``) or a dict with one entry ``{sample key: stream name}``.
Mapping lets two robots whose streams are named differently (``cam_top/rgb`` beside
``cam0/rgb``) give their samples the same keys, which is what a mixture of robots lines up.

The reader always works on stream names; the dataset renames the keys of each sample at the
end (:meth:`Names.rename`), so nothing below the dataset knows about mappings.

Some keys are the dataset's own and are refused as sample keys, because a sample would then
hold two different things under one key: ``meta``, ``t_ns``, ``action`` (for an observation),
and the mask suffixes ``_is_pad`` (history and chunk padding), ``_dim_is_pad`` (a mixture's
padded vector entries) and ``_is_missing`` (a mixture's missing camera).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rayform.errors import InvalidArgumentError

__all__ = ["KEY_RE", "MASK_SUFFIXES", "RESERVED_KEYS", "Names", "check_key", "resolve_names"]

#: Keys every sample has, or may have, besides the observations and the action chunk.
RESERVED_KEYS = ("meta", "t_ns", "action_is_pad")
#: Suffixes of the masks a dataset or mixture adds next to a key.
MASK_SUFFIXES = ("_is_pad", "_dim_is_pad", "_is_missing")
#: A sample key: letters, digits and ``_ . / -`` (no ``,`` or ``:``, which separate a URI's
#: ``keys=`` list), 1 to 128 characters.
KEY_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_./-]{0,127}")


def check_key(key: str, *, role: str = "obs") -> str:
    """Return ``key`` if it may be a sample key for ``role`` (``"obs"`` or ``"action"``).

    Raises:
        InvalidArgumentError: not a string of the allowed characters, or a reserved name.
    """
    if not isinstance(key, str) or not KEY_RE.fullmatch(key):
        raise InvalidArgumentError(
            f"sample key {key!r}: use 1-128 letters, digits and _ . / - (starting with a letter, "
            "digit or _), e.g. 'image_primary'"
        )
    if key in RESERVED_KEYS or (role == "obs" and key == "action"):
        raise InvalidArgumentError(
            f"sample key {key!r} is reserved (every sample may hold {', '.join(RESERVED_KEYS)} and 'action'): "
            "pick another name"
        )
    for suffix in MASK_SUFFIXES:
        if key.endswith(suffix):
            raise InvalidArgumentError(
                f"sample key {key!r} ends in {suffix!r}, which names a mask the dataset or a mixture adds "
                "next to a key: pick another name"
            )
    return key


@dataclass(frozen=True)
class Names:
    """The sample keys of a dataset and the streams they read.

    Attributes:
        obs_streams: observation stream names, in the dataset's order.
        obs_keys: the sample key of each, in the same order.
        action_stream: the action stream name, or ``None``.
        action_key: its sample key (``"action"`` unless mapped), or ``None``.
    """

    obs_streams: tuple[str, ...]
    obs_keys: tuple[str, ...]
    action_stream: str | None
    action_key: str | None

    @property
    def mapped(self) -> bool:
        """Whether any key differs from its default (the stream name; ``"action"``)."""
        return self.obs_keys != self.obs_streams or self.action_key not in (None, "action")

    @property
    def keys(self) -> tuple[str, ...]:
        """Every mapped key, observations then the action (the URI's ``keys=`` list)."""
        return (*self.obs_keys, *([self.action_key] if self.action_key else []))

    def stream_of(self, key: str) -> str:
        """The stream a sample key reads (a stream name is accepted as itself)."""
        for k, s in zip(self.obs_keys, self.obs_streams, strict=True):
            if k == key:
                return s
        if key == self.action_key and self.action_stream is not None:
            return self.action_stream
        return key

    def key_of(self, stream: str) -> str:
        """The sample key of a stream (``"action"``-like for the action stream)."""
        for k, s in zip(self.obs_keys, self.obs_streams, strict=True):
            if s == stream:
                return k
        if stream == self.action_stream and self.action_key is not None:
            return self.action_key
        return stream

    def rename(self, sample: dict[str, Any]) -> dict[str, Any]:
        """The sample with stream-name keys replaced by sample keys (masks follow their key).

        Cheap: it moves references; no tensor is copied. Called only when :attr:`mapped`.
        """
        out: dict[str, Any] = {}
        for key, stream in zip(self.obs_keys, self.obs_streams, strict=True):
            out[key] = sample[stream]
            if f"{stream}_is_pad" in sample:
                out[f"{key}_is_pad"] = sample[f"{stream}_is_pad"]
        if self.action_key is not None:
            out[self.action_key] = sample["action"]
            out[f"{self.action_key}_is_pad"] = sample["action_is_pad"]
        for key in ("t_ns", "meta"):
            out[key] = sample[key]
        return out


def resolve_names(
    obs: Sequence[str] | Mapping[str, str], action: str | Mapping[str, str] | None
) -> Names:
    """The :class:`Names` of ``EpisodeDataset(obs=..., action=...)``.

    Only the form is checked here (keys, duplicates, reserved names); whether the streams exist
    is the dataset's check, with the stream names this returns.

    Raises:
        InvalidArgumentError: a malformed or reserved key, a key or stream named twice, or an
            action dict without exactly one entry.
    """
    if isinstance(obs, Mapping):
        if not obs:
            raise InvalidArgumentError(
                "obs={}: map at least one sample key to a stream, e.g. {'state': 'joints/position'}"
            )
        keys = tuple(check_key(k) for k in obs)
        streams = tuple(obs.values())
        if not all(isinstance(s, str) for s in streams):
            raise InvalidArgumentError(f"obs={dict(obs)!r}: each value is a stream name (a string)")
        if len(set(streams)) != len(streams):
            raise InvalidArgumentError(
                f"obs={dict(obs)!r} maps two keys to one stream: read each stream once"
            )
    else:
        if (
            isinstance(obs, str)
            or not isinstance(obs, Sequence)
            or not obs
            or not all(isinstance(o, str) for o in obs)
        ):
            raise InvalidArgumentError(
                f"obs={obs!r}: pass a non-empty list of stream names, e.g. ['cam0/rgb'], or a dict "
                "{sample key: stream name}"
            )
        streams = tuple(obs)
        keys = streams  # checked as stream names by the dataset; a list keeps today's keys
    action_stream: str | None
    action_key: str | None
    if isinstance(action, Mapping):
        if len(action) != 1:
            raise InvalidArgumentError(
                f"action={dict(action)!r}: map exactly one sample key to the action stream, e.g. "
                "{'action': 'joints/position_delta'}"
            )
        ((action_key, action_stream),) = action.items()
        check_key(action_key, role="action")
        if not isinstance(action_stream, str):
            raise InvalidArgumentError(
                f"action={dict(action)!r}: the value is a stream name (a string)"
            )
        if action_key in keys:
            raise InvalidArgumentError(
                f"sample key {action_key!r} is both an observation and the action: use it once"
            )
        if action_key != "action" and f"{action_key}_is_pad" in keys:
            raise InvalidArgumentError(
                f"sample key {action_key}_is_pad would be both an observation and a mask"
            )
    else:
        action_stream = action
        action_key = "action" if action is not None else None
    return Names(streams, keys, action_stream, action_key)
