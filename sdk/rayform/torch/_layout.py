"""One sample layout for sources that differ: padded vectors with masks, missing cameras flagged.

``MixtureDataset(sources, layout=...)`` gives every sample of every source the same keys and
shapes, so that ``default_collate`` (which takes the first sample's keys) and
``rayform.torch.collate`` batch a mixture of robots without a custom collate function:

* a vector (an observation or the action chunk, ``float32 (..., D)``) narrower than the
  layout is zero-padded on its last axis to the layout's ``D``; ``<key>_dim_is_pad (D,) bool``
  is True for the padded components (the polarity of ``action_is_pad``: True = not data). A
  vector a source lacks is all zeros with every component flagged;
* a camera (``uint8 (3, H, W)``) a source lacks is a zero image with ``<key>_is_missing () bool``
  True (Octo's convention); cameras are never resized here: different sizes are an error that
  names ``image_size=`` (the dataset resizes in the decoding process, where it is cheap);
* history and chunk masks (``<key>_is_pad``) are kept; a key a source lacks has them all True;
* a text stream (a state's ``str``, a step's events list) a source lacks is ``""`` (a state)
  or ``[]`` (events), per history step, with ``<key>_is_missing () bool`` True, as a camera.

Every vector key gets ``<key>_dim_is_pad`` and every camera ``<key>_is_missing`` in every
sample, even where a source fills it completely, so the keys never depend on the source.
Padding happens after each source normalised its own vectors, so padded entries stay 0.

A layout is ``"union"`` (every key any source has, each vector at its largest width) or
``{key: shape}`` (the form of a tracker's sample spec: a shape, ``(dtype, shape)`` or
``{"dtype": ..., "shape": [...]}``; masks and ``t_ns`` in it are ignored, they follow from the
keys).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from rayform.errors import InvalidArgumentError
from rayform.torch._text import TextEvents

__all__ = [
    "Field",
    "Layout",
    "SourcePlan",
    "check_same_keys",
    "dataset_spec",
    "format_layout",
    "parse_layout",
]

#: ``{sample key: (dtype, shape)}``: the tracker's sample spec (``meta`` left out).
Spec = dict[str, tuple[str, tuple[int, ...]]]
_MASKS = ("_is_pad", "_dim_is_pad", "_is_missing")


def dataset_spec(
    obs: Sequence[tuple[str, str, tuple[int, ...]]],
    action: tuple[str, int] | None,
    obs_steps: int,
    horizon: int,
) -> Spec:
    """The sample spec of an ``EpisodeDataset``.

    Args:
        obs: ``(sample key, stream kind "video"|"table", shape)`` per observation; a camera's
            shape is ``(3, H, W)`` after ``image_size``, a vector's ``(D,)``; a text stream's
            kind is ``"str"`` (a state: one string) or ``"events"`` (a list of records), its
            shape ``()``.
        action: ``(sample key, D)`` of the action, or ``None``.
        obs_steps: observation history length (a leading axis and a mask when > 1).
        horizon: action chunk length in grid steps.
    """
    history = (obs_steps,) if obs_steps > 1 else ()
    spec: Spec = {}
    for key, kind, shape in obs:
        dtype = {"video": "uint8", "str": "str", "events": "events"}.get(kind, "float32")
        spec[key] = (dtype, (*history, *shape))
        if history:
            spec[f"{key}_is_pad"] = ("bool", history)
    if action is not None:
        spec[action[0]] = ("float32", (horizon, action[1]))
        spec[f"{action[0]}_is_pad"] = ("bool", (horizon,))
    spec["t_ns"] = ("int64", ())
    return spec


#: Sample spec dtypes of text keys (``dataset_spec``): a state's string, a step's events.
_TEXT_DTYPES = ("str", "events")
#: The kind of layout field each data dtype gives.
_KINDS = {"uint8": "camera", "float32": "vector", "str": "text", "events": "events"}
_FIELD_DTYPES = {kind: dtype for dtype, kind in _KINDS.items()}


def _is_data(key: str, dtype: str) -> bool:
    return dtype in _KINDS and key != "t_ns"


def _mask_of(key: str, kind: str) -> str:
    """A field's presence mask: a vector's padded components, another's absence."""
    return f"{key}_dim_is_pad" if kind == "vector" else f"{key}_is_missing"


@dataclass(frozen=True)
class Field:
    """One data key of a layout.

    Attributes:
        kind: ``"camera"`` (``uint8 (..., 3, H, W)``), ``"vector"`` (``float32 (..., D)``),
            ``"text"`` (a state's ``str``) or ``"events"`` (a step's list of records).
        shape: its shape in every sample.
        pad_shape: shape of its ``<key>_is_pad`` history or chunk mask, or ``None``.
    """

    kind: str
    shape: tuple[int, ...]
    pad_shape: tuple[int, ...] | None


class Layout:
    """The mixture's sample layout: data keys in order, their shapes and the masks they get.

    Args:
        layout: ``"union"`` or ``{key: shape}`` (see the module docstring).
        specs: each source's :func:`dataset_spec` (``EpisodeDataset.sample_spec()``).
        action_keys: each source's action key (``EpisodeDataset.action_key``), or ``None``.

    Raises:
        InvalidArgumentError: sources disagree on a key's kind, a camera's size, a history or
            horizon length, or the action key; or an explicit layout lacks a source's key,
            is narrower than a source, names a key no source has or is malformed.
    """

    def __init__(
        self,
        layout: str | Mapping[str, Any],
        specs: Sequence[Spec],
        action_keys: Sequence[str | None],
    ) -> None:
        self.arg: str | dict[str, tuple[int, ...]] = _check_arg(layout)
        actions = set(action_keys)
        if len(actions) != 1:
            raise InvalidArgumentError(
                f"the sources' actions differ ({', '.join(sorted(map(str, actions)))}): every source of a layout "
                "has the same action key (map it with action={'action': STREAM}) or none"
            )
        self.action_key: str | None = actions.pop()
        merged: dict[str, tuple[str, tuple[int, ...]]] = {}
        pads: dict[str, tuple[int, ...]] = {}
        for k, spec in enumerate(specs):
            for key, (dtype, shape) in spec.items():
                if key.endswith("_is_pad") and dtype == "bool":
                    if pads.setdefault(key, shape) != shape:
                        raise InvalidArgumentError(
                            f"{key} is {pads[key]} in one source and {shape} in source {k}: mixed sources need the "
                            "same obs_steps and horizon (in grid steps; see docs/mixtures.md, rates)"
                        )
                    continue
                if not _is_data(key, dtype):
                    continue
                if key not in merged:
                    merged[key] = (dtype, shape)
                    continue
                dtype0, shape0 = merged[key]
                if dtype0 != dtype:
                    raise InvalidArgumentError(
                        f"{key!r} is a {_kind(dtype0)} in one source and a {_kind(dtype)} in source {k}"
                    )
                if dtype in _TEXT_DTYPES and shape0 != shape:  # a leading obs_steps axis
                    raise InvalidArgumentError(
                        f"text {key!r} is {shape0} in one source and {shape} in source {k}: "
                        "mixed sources need the same obs_steps"
                    )
                if dtype == "uint8" and shape0[:-3] != shape[:-3]:  # a leading obs_steps axis
                    raise InvalidArgumentError(
                        f"camera {key!r} is {shape0} in one source and {shape} in source {k}: "
                        "mixed sources need the same obs_steps"
                    )
                if dtype == "uint8" and shape0 != shape:
                    raise InvalidArgumentError(
                        f"camera {key!r} is {shape0} in one source and {shape} in source {k}: give the sources' "
                        f"cameras one size with image_size= (e.g. image_size={{{key!r}: (224, 224)}})"
                    )
                if dtype == "float32" and shape0[:-1] != shape[:-1]:
                    raise InvalidArgumentError(
                        f"{key!r} is {shape0} in one source and {shape} in source {k}: only the last axis "
                        "(the vector width) may differ; use the same obs_steps and horizon"
                    )
                merged[key] = (dtype, shape if shape[-1:] > shape0[-1:] else shape0)
        if isinstance(self.arg, dict):
            merged = self._explicit(self.arg, merged)
        self.fields: dict[str, Field] = {
            key: Field(_KINDS[dtype], shape, pads.get(f"{key}_is_pad"))
            for key, (dtype, shape) in merged.items()
        }

    @staticmethod
    def _explicit(
        arg: dict[str, tuple[int, ...]], union: dict[str, tuple[str, tuple[int, ...]]]
    ) -> dict[str, tuple[str, tuple[int, ...]]]:
        lacking = [k for k in union if k not in arg]
        if lacking:
            raise InvalidArgumentError(
                f"layout= lacks {', '.join(map(repr, lacking))}, which a source has: add it"
            )
        out: dict[str, tuple[str, tuple[int, ...]]] = {}
        for key, shape in arg.items():
            if key not in union:
                raise InvalidArgumentError(
                    f"layout= names {key!r}, which no source has: remove it or map a stream to it"
                )
            dtype, widest = union[key]
            if dtype == "uint8" and shape != widest:
                raise InvalidArgumentError(
                    f"layout= gives camera {key!r} {shape}; the sources' frames are {widest} "
                    "(set image_size= on the sources)"
                )
            if dtype == "float32" and (shape[:-1] != widest[:-1] or shape[-1:] < widest[-1:]):
                raise InvalidArgumentError(
                    f"layout= gives {key!r} {shape}; a source has {widest}: a layout may "
                    "only widen a vector's last axis"
                )
            out[key] = (dtype, shape)
        return out

    def spec(self) -> Spec:
        """The layout's sample spec: every source's samples have exactly these keys."""
        spec: Spec = {}
        for key, f in self.fields.items():
            spec[key] = (_FIELD_DTYPES[f.kind], f.shape)
            spec[_mask_of(key, f.kind)] = (
                "bool",
                f.shape[-1:] if f.kind == "vector" else (),
            )
            if f.pad_shape is not None:
                spec[f"{key}_is_pad"] = ("bool", f.pad_shape)
        spec["t_ns"] = ("int64", ())
        return spec

    def plan(self, spec: Spec) -> SourcePlan:
        """How one source's samples become the layout's."""
        return SourcePlan(self, spec)


class SourcePlan:
    """One source's samples in the layout: which keys it has and how wide its vectors are.

    The constant tensors (masks, zero images) are made once per plan and shared by every
    sample: collate copies them into the batch, nothing writes to them.
    """

    def __init__(self, layout: Layout, spec: Spec) -> None:
        self.layout = layout
        self.width = {
            k: spec[k][1][-1] for k, f in layout.fields.items() if f.kind == "vector" and k in spec
        }
        self.present = {k for k in layout.fields if k in spec}
        self.own = set(spec)  # the source's own keys (its streams'), without "meta"
        self._consts: dict[str, torch.Tensor] | None = (
            None  # made on first use, in the process using it
        )

    def _constants(self) -> dict[str, torch.Tensor]:
        if self._consts is None:
            consts: dict[str, torch.Tensor] = {}
            for key, f in self.layout.fields.items():
                if f.kind != "vector":
                    consts[f"{key}_is_missing"] = torch.tensor(key not in self.present)
                    if f.kind == "camera" and key not in self.present:
                        consts[key] = torch.zeros(f.shape, dtype=torch.uint8)
                else:
                    width = f.shape[-1]
                    consts[f"{key}_dim_is_pad"] = torch.arange(width) >= self.width.get(key, 0)
                    if key not in self.present:
                        consts[key] = torch.zeros(f.shape, dtype=torch.float32)
                if f.pad_shape is not None and key not in self.present:
                    consts[f"{key}_is_pad"] = torch.ones(f.pad_shape, dtype=torch.bool)
            self._consts = consts
        return self._consts

    def apply(self, sample: dict[str, Any]) -> dict[str, Any]:
        """The sample in the layout (keys in the layout's order, then any keys the source's
        ``transform`` added, then ``t_ns`` and ``meta``)."""
        consts = self._constants()
        out: dict[str, Any] = {}
        for key, f in self.layout.fields.items():
            if f.kind in ("text", "events"):
                out[key] = sample[key] if key in self.present else _no_text(f)
            elif key in self.present:
                value = sample[key]
                own = f.shape if f.kind == "camera" else (*f.shape[:-1], self.width[key])
                got = tuple(getattr(value, "shape", ()))
                if got != own:
                    raise InvalidArgumentError(
                        f"sample key {key!r} is {got} after the source's "
                        f"transform, but the mixture's layout places it as {own}: a transform "
                        "in a mixture with a layout must keep its keys' shapes (give cameras "
                        "their size with image_size=, and crop or resize after the layout, e.g. "
                        "on the batch)"
                    )
                if f.kind == "vector" and self.width[key] < f.shape[-1]:
                    value = torch.nn.functional.pad(value, (0, f.shape[-1] - self.width[key]))
                out[key] = value
            else:
                out[key] = consts[key]
            mask = _mask_of(key, f.kind)
            out[mask] = consts[mask]
            if f.pad_shape is not None:
                out[f"{key}_is_pad"] = (
                    sample[f"{key}_is_pad"] if key in self.present else consts[f"{key}_is_pad"]
                )
        # Keys the source's transform added (not its streams') pass through: the layout
        # arranges the streams' keys, and dropping the user's own would lose them silently.
        for key, value in sample.items():
            if key not in self.own and key not in out and key != "meta":
                out[key] = value
        out["t_ns"] = sample["t_ns"]
        out["meta"] = sample["meta"]
        return out


def _kind(dtype: str) -> str:
    return _KINDS.get(dtype, "vector")


def _no_text(f: Field) -> Any:
    """What a source without a text field gives: no state ``""`` or no events ``[]``, one per
    history step (new objects: a sample's lists are its own)."""

    def empty() -> Any:
        return "" if f.kind == "text" else TextEvents()

    return [empty() for _ in range(f.shape[0])] if f.shape else empty()


def _shape(key: str, value: object) -> tuple[int, ...]:
    if isinstance(value, Mapping):
        value = value.get("shape")
    elif isinstance(value, tuple) and len(value) == 2 and isinstance(value[0], str):
        value = value[1]
    dims = list(value) if isinstance(value, Sequence) and not isinstance(value, str) else []
    if not dims or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in dims):
        raise InvalidArgumentError(
            f"layout= {key!r}: {value!r} is not a shape; give e.g. (14,) for a vector, (16, 14) for an action "
            "chunk, (3, 224, 224) for a camera"
        )
    return tuple(int(v) for v in dims)


def _check_arg(layout: str | Mapping[str, Sequence[int]]) -> str | dict[str, tuple[int, ...]]:
    if layout == "union":
        return "union"
    if not isinstance(layout, Mapping) or not layout:
        raise InvalidArgumentError(
            f"layout={layout!r}: use 'union' (every key any source has, at its largest shape) or "
            "{key: shape}, e.g. {'state': (14,), 'action': (16, 14), 'image_wrist': (3, 224, 224)}"
        )
    out: dict[str, tuple[int, ...]] = {}
    for key, value in layout.items():
        if not isinstance(key, str):
            raise InvalidArgumentError(f"layout= key {key!r}: use sample keys (strings)")
        if key == "t_ns" or key == "meta" or key.endswith(_MASKS):
            continue  # a tracker's spec lists them; they follow from the data keys
        out[key] = _shape(key, value)
    return out


def format_layout(arg: str | Mapping[str, tuple[int, ...]]) -> str:
    """The URI text of a layout: ``union``, or compact JSON ``{key: [shape]}`` in key order."""
    if arg == "union":
        return "union"
    assert isinstance(arg, Mapping)
    return json.dumps({k: list(v) for k, v in arg.items()}, sort_keys=True, separators=(",", ":"))


def parse_layout(text: str) -> str | dict[str, tuple[int, ...]]:
    """Inverse of :func:`format_layout`."""
    if text == "union":
        return "union"
    try:
        doc = json.loads(text)
    except ValueError:
        doc = None
    if not isinstance(doc, dict):
        raise InvalidArgumentError(
            f"mixture URI: layout={text[:40]!r}; expected 'union' or JSON {{key: shape}}"
        )
    return _check_arg(doc)


def _sample_keys(ds: Any) -> dict[str, str]:
    """Sample key -> what fixes its shape, for comparing sources."""
    keys = {"t_ns": "()", "meta": "dict"}
    key_of = {v: k for k, v in ds.obs_keys.items()}  # mapped sample keys
    for name in ds.obs:
        shown = key_of.get(name, name)
        if ds.spec.kind(name) in ("text", "spans"):  # strings or lists: no shape to compare
            keys[shown] = f"{ds.sample_spec()[shown][0]} x{ds.obs_steps}"
            if ds.obs_steps > 1:
                keys[f"{shown}_is_pad"] = f"({ds.obs_steps},)"
            continue
        s = ds.stream(name)
        # A camera's shape in the sample: after image_size, whatever the stored resolution.
        shape = list(s.shape[-1:] if s.kind == "table" else ds.frame_shape(shown))
        keys[shown] = f"{s.kind} {shape} x{ds.obs_steps}"
        if ds.obs_steps > 1:
            keys[f"{shown}_is_pad"] = f"({ds.obs_steps},)"
    if ds.action is not None:
        act = ds.action_key or "action"
        keys[act] = f"({ds.horizon}, {list(ds.stream(ds.action).shape)[-1]})"
        keys[f"{act}_is_pad"] = f"({ds.horizon},)"
    return keys


def check_same_keys(datasets: Sequence[Any]) -> None:
    """Raise unless every ``EpisodeDataset`` of a mixture without a layout gives its samples
    the same keys and shapes (what ``default_collate`` needs)."""
    first = _sample_keys(datasets[0])
    for k, ds in enumerate(datasets[1:], start=1):
        other = _sample_keys(ds)
        for key in sorted(set(first) | set(other)):
            if key not in other or key not in first:
                where = 0 if key in first else k
                raise InvalidArgumentError(
                    f"sample key {key!r} is in source {where} but not in source {k if where == 0 else 0}: "
                    "mixed sources need the same obs names, action and obs_steps, or a layout (layout='union')"
                )
            if first[key] != other[key]:
                raise InvalidArgumentError(
                    f"sample key {key!r} differs between source 0 ({first[key]}) and source {k} "
                    f"({other[key]}): mixed sources need the same shapes (horizon, obs_steps, stream shapes; "
                    "give cameras of different resolutions the same image_size=; vectors of other widths: "
                    "layout='union')"
                )
