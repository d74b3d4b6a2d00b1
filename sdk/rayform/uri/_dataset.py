"""Dataset URIs: one string that names a dataset exactly as it was trained on.

::

    rayform://127.0.0.1:8765/slc_7c1e04aa@<manifest hash>?v=1&action=joints/position_delta
        &action_mode=hold&fps=15&frame=ros&horizon=16&obs=cam0/rgb,joints/position
        &obs_steps=1&seed=0

The path pins the slice *and* the manifest (its BLAKE3 hash, so every byte); the query holds
every argument that changes which samples the dataset yields; a dataset on a
``Slice.select`` view names the selection in ``select=`` (query version 2, see
``rayform.uri._selexpr``) instead of listing its episodes; a dataset with a training resolution
holds ``image_size=`` and ``resize=`` (query version 3); a dataset whose sample keys are
mapped from stream names or that normalises its vectors holds ``keys=`` and ``normalize=``
(query version 4); a dataset that reads spans labels (``obs=[..., "label:events"]``,
``within=``) pins the label set it read in ``labels=`` and holds ``within=`` (query version
5). Mixtures have their own form
(``rayform.uri._mixture``). The encoding is canonical
(``docs/tracking.md`` defines it): one dataset has one URI, so the URI can be compared,
hashed and used as a key. The access token is never part of it.

This module needs neither torch nor a network; ``rayform.torch.EpisodeDataset.uri`` and
``EpisodeDataset.from_uri`` build on it.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, unquote, urlsplit

from rayform._hashing import hash_bytes
from rayform._ids import HASH_RE, SEGMENT_ID_RE, SLICE_ID_RE, STREAM_NAME_RE
from rayform._resolution import check_resize, format_image_size, parse_image_size
from rayform.errors import InvalidArgumentError
from rayform.uri._selexpr import parse_selection, select_arguments, selection_expression

__all__ = ["QUERY_VERSION", "SCHEMES", "DatasetURI", "clean_endpoint"]

#: Version of the query encoding; a parser refuses versions and parameters it does not know,
#: so an old SDK never silently builds a different dataset from a newer URI.
QUERY_VERSION = 1
#: The query version of a URI with ``select=`` (a selection view); a URI without one stays
#: version 1, so every URI written before views existed reads and prints the same.
SELECT_VERSION = 2
#: The query version of a URI with ``image_size=`` and ``resize=`` (a training resolution,
#: with or without ``select=``); a URI without them keeps version 1 or 2, byte for byte.
IMAGE_VERSION = 3
#: The query version of a URI with ``keys=`` (sample keys mapped from stream names) or
#: ``normalize=``; a URI without them keeps version 1, 2 or 3, byte for byte.
MAP_VERSION = 4
#: The query version of a URI with ``labels=`` (the label set that ``label:KEY`` observations
#: and ``within=`` read) and ``within=``; a URI without them keeps its version, byte for byte.
LABEL_VERSION = 5
#: An observation that reads a spans label: ``label:KEY`` (a stream name never holds ``:``).
_LABEL_OBS_RE = re.compile(r"\Alabel:[a-z][a-z0-9_]{0,31}\Z")
#: URI scheme -> the server's URL scheme. ``rayform://`` is HTTPS; plain HTTP (a server on
#: loopback or a trusted network) is spelled out, so a URI never downgrades TLS by accident.
SCHEMES = {"rayform": "https", "rayform+http": "http"}
# Parameters, in canonical (alphabetical) order after ``v``; "select" only from version 2,
# "image_size" and "resize" only in version 3. "mix" belongs to mixture URIs
# (rayform.uri._mixture); see docs/tracking.md.
_PARAMS = (
    "action",
    "action_mode",
    "fps",
    "frame",
    "horizon",
    "image_size",
    "keys",
    "labels",
    "normalize",
    "obs",
    "obs_steps",
    "resize",
    "seed",
    "segments",
    "select",
    "within",
)
_OPTIONAL = (
    "segments",
    "select",
    "image_size",
    "resize",
    "keys",
    "normalize",
    "labels",
    "within",
)
_SINCE = {
    "select": SELECT_VERSION,
    "image_size": IMAGE_VERSION,
    "resize": IMAGE_VERSION,
    "keys": MAP_VERSION,
    "normalize": MAP_VERSION,
    "labels": LABEL_VERSION,
    "within": LABEL_VERSION,
}
_RESERVED = ("mix",)
_SAFE = "/,"  # stream names and IDs never contain "," so lists need no escaping
_SAFE_SIZE = "/,:"  # image_size's KEY:HxW items stay readable too


@dataclass(frozen=True)
class DatasetURI:
    """A parsed dataset URI: which slice, which manifest, which arguments.

    ``str(uri)`` is the canonical form; ``DatasetURI.parse(str(uri)) == uri``.

    Attributes:
        endpoint: the server's base URL (``"https://rayform.example.com"``), or ``None`` for
            ``rayform:///slc_...`` (whatever server ``RAYFORM_ENDPOINT`` names, or the cache).
        slice_id: e.g. ``"slc_7c1e04aa"``.
        manifest_hash: BLAKE3 hex digest of the manifest the dataset was built on.
        obs: observation stream names, in the dataset's order.
        action: the action stream, or ``None``.
        fps: grid rate in Hz.
        horizon: action chunk length in grid steps.
        frame: ``"ros"``, ``"opencv"`` or ``None``.
        obs_steps: observation history in grid steps.
        action_mode: ``"hold"``, ``"nearest"`` or ``"linear"``.
        seed: the dataset's seed.
        segments: the selected segment IDs in order, or ``None`` for every segment.
        select: a selection view of the slice as a canonical expression
            (``"sites:lab-a;start_ns:..."``, see ``rayform.uri._selexpr``), or ``None``.
        image_size: the cameras' training resolution as canonical text (``"224x224"``, or
            ``"cam0/rgb:224x224,wrist/rgb:128x128"`` in ``obs`` order), or ``None`` for frames
            as stored; a ``(H, W)`` tuple or a per-camera dict is accepted and made canonical.
        resize: ``"pad"``, ``"squash"`` or ``"crop"`` with ``image_size``, else ``None``.
        keys: the sample keys of ``obs`` (in order) and then of the action, when they are
            mapped (``obs={"state": "joints/position"}``), else ``None``.
        normalize: ``"mean_std"``, ``"quantile"``, given statistics as compact JSON, or ``None``.
        labels: the hash of the label set the ``label:KEY`` observations and ``within`` read,
            or ``None`` when the dataset reads no label.
        within: ``"KEY"`` or ``"KEY:NAME"``: samples only inside those ranges, or ``None``.
    """

    endpoint: str | None
    slice_id: str
    manifest_hash: str
    obs: tuple[str, ...]
    action: str | None
    fps: float
    horizon: int = 1
    frame: str | None = None
    obs_steps: int = 1
    action_mode: str = "hold"
    seed: int = 0
    segments: tuple[str, ...] | None = None
    select: str | None = None
    image_size: str | None = None
    resize: str | None = None
    keys: tuple[str, ...] | None = None
    normalize: str | None = None
    labels: str | None = None
    within: str | None = None

    def __post_init__(self) -> None:
        if self.endpoint is not None:
            object.__setattr__(self, "endpoint", clean_endpoint(self.endpoint))
        # Lists become tuples so that equal URIs compare equal and hash alike.
        if isinstance(self.obs, str):
            raise InvalidArgumentError(
                f"dataset URI: obs={self.obs!r}; pass a sequence of stream names"
            )
        object.__setattr__(self, "obs", tuple(self.obs))
        if self.segments is not None:
            object.__setattr__(self, "segments", tuple(self.segments))
        object.__setattr__(self, "fps", float(self.fps))
        if self.select is not None:
            object.__setattr__(self, "select", selection_expression(parse_selection(self.select)))
        if not SLICE_ID_RE.fullmatch(self.slice_id):
            raise InvalidArgumentError(
                f"dataset URI: malformed slice ID {self.slice_id!r}; expected e.g. slc_7c1e04aa"
            )
        if not HASH_RE.fullmatch(self.manifest_hash):
            raise InvalidArgumentError(
                f"dataset URI: malformed manifest hash {self.manifest_hash!r}; expected 64 lowercase hex digits"
            )
        for name in (*self.obs, *([self.action] if self.action else [])):
            if not STREAM_NAME_RE.fullmatch(name) and not (
                name in self.obs and _LABEL_OBS_RE.fullmatch(name)
            ):
                raise InvalidArgumentError(
                    f"dataset URI: malformed stream name {name!r}, e.g. cam0/rgb"
                )
        for seg in self.segments or ():
            if not SEGMENT_ID_RE.fullmatch(seg):
                raise InvalidArgumentError(
                    f"dataset URI: malformed segment ID {seg!r}, e.g. seg_0a1b2c3d"
                )
        if not self.obs:
            raise InvalidArgumentError(
                "dataset URI: obs= names no stream; a dataset has at least one"
            )
        if not (math.isfinite(self.fps) and self.fps > 0):
            raise InvalidArgumentError(
                f"dataset URI: fps={self.fps!r}; use a finite number > 0 (Hz)"
            )
        self._check_image_size()
        self._check_labels()
        if self.normalize is not None and self.normalize not in ("mean_std", "quantile"):
            doc = _normalize_arg(self.normalize)  # canonical JSON: one dataset, one URI
            object.__setattr__(
                self, "normalize", json.dumps(doc, sort_keys=True, separators=(",", ":"))
            )
        if self.keys is not None:
            keys = tuple(self.keys)
            object.__setattr__(self, "keys", keys)
            if len(keys) != len(self.obs) + (1 if self.action else 0):
                raise InvalidArgumentError(
                    f"dataset URI: keys= names {len(keys)} keys for "
                    f"{len(self.obs)} obs and "
                    f"{'an' if self.action else 'no'} action; copy the whole URI from dataset.uri"
                )

    def _check_labels(self) -> None:
        reads = self.within is not None or any(_LABEL_OBS_RE.fullmatch(o) for o in self.obs)
        if reads != (self.labels is not None):
            raise InvalidArgumentError(
                f"dataset URI: labels={self.labels!r} with within={self.within!r} and obs="
                f"{','.join(self.obs)}: the label set is pinned exactly when label:KEY "
                "observations or within= read it; copy the whole URI from dataset.uri"
            )
        if self.labels is not None and not HASH_RE.fullmatch(self.labels):
            raise InvalidArgumentError(
                f"dataset URI: labels={self.labels!r} is not a label-set hash (64 hex digits)"
            )
        if self.within is not None and (
            not isinstance(self.within, str)
            or not re.fullmatch(r"[a-z][a-z0-9_]{0,31}(:.+)?", self.within)
        ):
            raise InvalidArgumentError(
                f"dataset URI: within={self.within!r} is not KEY or KEY:NAME of a spans label"
            )

    def _check_image_size(self) -> None:
        if (self.image_size is None) != (self.resize is None):
            raise InvalidArgumentError(
                f"dataset URI: image_size={self.image_size!r} and resize={self.resize!r}: give both "
                "(a training resolution) or neither (frames as stored)"
            )
        if self.image_size is None:
            return
        check_resize(self.resize)
        sizes = (
            parse_image_size(self.image_size)
            if isinstance(self.image_size, str)
            else self.image_size
        )
        text = format_image_size(sizes, self.obs)
        unknown = [k for k in (sizes if isinstance(sizes, Mapping) else ()) if k not in self.obs]
        if unknown:
            raise InvalidArgumentError(
                f"dataset URI: image_size names {unknown[0]!r}, which is not in obs ({', '.join(self.obs)})"
            )
        object.__setattr__(self, "image_size", text)

    # -- formatting ------------------------------------------------------------------------
    @property
    def query(self) -> str:
        """The canonical query: ``v`` first, then every parameter in alphabetical order."""
        values: dict[str, str] = {
            "action": self.action or "",
            "action_mode": self.action_mode,
            "fps": _format_float(self.fps),
            "frame": self.frame or "",
            "horizon": str(self.horizon),
            "obs": ",".join(self.obs),
            "obs_steps": str(self.obs_steps),
            "seed": str(self.seed),
        }
        if self.segments is not None:
            values["segments"] = ",".join(self.segments)
        if self.image_size is not None:
            values["image_size"] = self.image_size
            values["resize"] = str(self.resize)
        if self.keys is not None:
            values["keys"] = ",".join(self.keys)
        if self.normalize is not None:
            values["normalize"] = self.normalize
        if self.labels is not None:
            values["labels"] = self.labels
        if self.within is not None:
            values["within"] = self.within
        safe = {"image_size": _SAFE_SIZE, "obs": _SAFE_SIZE, "normalize": "", "within": ":"}
        parts = [f"{k}={quote(values[k], safe=safe.get(k, _SAFE))}" for k in _PARAMS if k in values]
        if self.select is not None:
            # Already percent-encoded item by item; its separators stay readable.
            parts.append(f"select={self.select}")
        return "&".join([f"v={self.version}", *parts])

    @property
    def version(self) -> int:
        """The query version: 5 with ``labels=``, else 4 with ``keys=`` or ``normalize=``, else
        3 with ``image_size=``, else 2 with ``select=``, else 1."""
        if self.labels is not None:
            return LABEL_VERSION
        if self.keys is not None or self.normalize is not None:
            return MAP_VERSION
        if self.image_size is not None:
            return IMAGE_VERSION
        return SELECT_VERSION if self.select is not None else QUERY_VERSION

    def selection(self) -> dict[str, Any] | None:
        """``Slice.select`` keyword arguments of ``select=``, or ``None`` for the whole slice."""
        return select_arguments(self.select) if self.select is not None else None

    @property
    def slice_uri(self) -> str:
        """The pinned slice alone, without dataset arguments: ``rayform://HOST/slc_...@HASH``."""
        return f"{_authority(self.endpoint)}/{self.slice_id}@{self.manifest_hash}"

    def __str__(self) -> str:
        return f"{self.slice_uri}?{self.query}"

    @property
    def digest(self) -> str:
        """A short fingerprint of the data and arguments, independent of the server's address.

        ``<first 16 hex digits of the manifest hash>-<8 hex digits of the slice ID and
        query>``: datasets on the same manifest share the prefix; the same dataset reached
        through another host name has the same digest.
        """
        args = hash_bytes(f"{self.slice_id}?{self.query}".encode())
        return f"{self.manifest_hash[:16]}-{args[:8]}"

    def dataset_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``EpisodeDataset(slice_, **kwargs)`` that rebuild this dataset
        (``image_size`` and ``resize`` only when the URI has a training resolution)."""
        kwargs: dict[str, Any] = {
            "obs": list(self.obs),
            "action": self.action,
            "fps": self.fps,
            "horizon": self.horizon,
            "frame": self.frame,
            "obs_steps": self.obs_steps,
            "action_mode": self.action_mode,
            "seed": self.seed,
            "segments": list(self.segments) if self.segments is not None else None,
        }
        if self.image_size is not None:
            sizes = parse_image_size(self.image_size)
            if isinstance(sizes, dict) and self.keys is not None:
                # The URI keys sizes by stream; the dataset reads a dict's keys as sample keys
                # first, and a sample key may be another stream's name.
                key_of = dict(zip(self.obs, self.keys, strict=False))
                sizes = {key_of.get(name, name): hw for name, hw in sizes.items()}
            kwargs["image_size"] = sizes
            kwargs["resize"] = self.resize
        if self.keys is not None:
            kwargs["obs"] = dict(zip(self.keys, self.obs, strict=False))
            if self.action is not None:
                kwargs["action"] = {self.keys[-1]: self.action}
        if self.normalize is not None:
            kwargs["normalize"] = _normalize_arg(self.normalize)
        if self.labels is not None:
            kwargs["labels"] = self.labels
        if self.within is not None:
            kwargs["within"] = self.within
        return kwargs

    # -- parsing ---------------------------------------------------------------------------
    @classmethod
    def parse(cls, uri: str) -> DatasetURI:
        """Parse a dataset URI (canonical or not); ``str()`` of the result is canonical.

        Raises:
            InvalidArgumentError: not a dataset URI, an unknown query version or parameter, a
                missing parameter, or credentials in the URI (the message says which).
        """
        if not isinstance(uri, str):
            raise InvalidArgumentError(f"a dataset URI is a string, got {type(uri).__name__}")
        parts = urlsplit(uri)
        if parts.scheme not in SCHEMES:
            raise InvalidArgumentError(
                f"{_shown(uri)} is not a dataset URI: it starts with 'rayform://' (HTTPS server) "
                "or 'rayform+http://'; get one from dataset.uri"
            )
        if "@" in parts.netloc:
            raise InvalidArgumentError(
                "a dataset URI never holds credentials: remove the 'user:password@' part and pass "
                "the token as RAYFORM_TOKEN or Client(token=...)"
            )
        if parts.path.rstrip("/").endswith("/mix"):
            raise InvalidArgumentError(
                f"{_shown(uri)} names a mixture of datasets: rebuild it with "
                "rayform.torch.MixtureDataset.from_uri(uri)"
            )
        prefix, _, last = parts.path.rpartition("/")
        slice_id, at, manifest_hash = last.partition("@")
        if not at:
            raise InvalidArgumentError(
                f"{_shown(uri)}: the path must end in /slc_...@MANIFEST_HASH (a dataset URI pins "
                "the manifest); get one from dataset.uri"
            )
        if not SLICE_ID_RE.fullmatch(slice_id) or not HASH_RE.fullmatch(manifest_hash):
            raise InvalidArgumentError(
                f"{_shown(uri)}: the path must end in /slc_<8-64 hex>@<manifest hash: 64 hex>; "
                "copy the whole URI from dataset.uri"
            )
        endpoint = f"{SCHEMES[parts.scheme]}://{parts.netloc}{prefix}" if parts.netloc else None
        query = _parse_query(parts.query, uri)
        try:
            return cls(
                endpoint=endpoint,
                slice_id=slice_id,
                manifest_hash=manifest_hash,
                obs=tuple(_split_list(query["obs"])),
                action=query["action"] or None,
                fps=_parse_float("fps", query["fps"]),
                horizon=_parse_int("horizon", query["horizon"]),
                frame=query["frame"] or None,
                obs_steps=_parse_int("obs_steps", query["obs_steps"]),
                action_mode=query["action_mode"],
                seed=_parse_int("seed", query["seed"]),
                segments=tuple(_split_list(query["segments"])) if "segments" in query else None,
                select=query.get("select"),
                image_size=query.get("image_size"),
                resize=query.get("resize"),
                keys=tuple(_split_list(query["keys"])) if "keys" in query else None,
                normalize=query.get("normalize"),
                labels=query.get("labels"),
                within=query.get("within"),
            )
        except InvalidArgumentError as exc:
            raise InvalidArgumentError(f"{exc} (in {_shown(uri)})") from None

    @classmethod
    def from_args(
        cls, endpoint: str | None, slice_id: str, manifest_hash: str, args: Mapping[str, Any]
    ) -> DatasetURI:
        """Build from ``dataset_kwargs()``-style arguments (lists become tuples)."""
        segments = args.get("segments")
        return cls(
            select=args.get("select"),
            endpoint=endpoint,
            slice_id=slice_id,
            manifest_hash=manifest_hash,
            obs=tuple(args["obs"]),
            action=args.get("action"),
            fps=float(args["fps"]),
            horizon=int(args.get("horizon", 1)),
            frame=args.get("frame"),
            obs_steps=int(args.get("obs_steps", 1)),
            action_mode=str(args.get("action_mode", "hold")),
            seed=int(args.get("seed", 0)),
            segments=tuple(segments) if segments is not None else None,
            image_size=args.get("image_size"),
            resize=args.get("resize") if args.get("image_size") is not None else None,
        )


# -- helpers ---------------------------------------------------------------------------------
def clean_endpoint(endpoint: str) -> str:
    """``scheme://host[:port][/prefix]`` without credentials, query or trailing slash."""
    parts = urlsplit(endpoint.rstrip("/"))
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise InvalidArgumentError(f"endpoint {endpoint.split('@')[-1]!r}: use an http(s) URL")
    netloc = parts.netloc.rpartition("@")[2]  # never carry user:password into a URI
    return f"{parts.scheme}://{netloc}{parts.path.rstrip('/')}"


def _authority(endpoint: str | None) -> str:
    if endpoint is None:
        return "rayform://"
    scheme, _, rest = endpoint.partition("://")
    return f"{'rayform' if scheme == 'https' else 'rayform+http'}://{rest}"


def _parse_query(query: str, uri: str) -> dict[str, str]:
    values: dict[str, str] = {}
    known = tuple(
        str(v) for v in (QUERY_VERSION, SELECT_VERSION, IMAGE_VERSION, MAP_VERSION, LABEL_VERSION)
    )
    for item in query.split("&") if query else []:
        key, eq, value = item.partition("=")
        if not eq:
            raise InvalidArgumentError(
                f"dataset URI query item {item!r} has no '=': write key=value"
            )
        if key in values:
            raise InvalidArgumentError(f"dataset URI names {key!r} twice: give each parameter once")
        # select= is percent-encoded item by item (rayform.uri._selexpr decodes it)
        values[key] = value if key == "select" else unquote(value)
    version = values.pop("v", None)
    if version not in known:
        raise InvalidArgumentError(
            f"{_shown(uri)} has query version v={version}; this rayform reads v={QUERY_VERSION}, "
            f"v={SELECT_VERSION}, v={IMAGE_VERSION}, v={MAP_VERSION} and v={LABEL_VERSION}. "
            + (
                "Upgrade rayform (`pip install -U rayform`) to read it."
                if version
                else "A dataset URI comes from dataset.uri and starts its query with v=1."
            )
        )
    allowed = tuple(k for k in _PARAMS if _SINCE.get(k, QUERY_VERSION) <= int(version))
    unknown = sorted(set(values) - set(allowed))
    if unknown:
        reserved = [k for k in unknown if k in _RESERVED]
        later = [k for k in unknown if k in _SINCE]
        if later:
            what = {
                "select": "a selection view",
                "keys": "a key mapping",
                "normalize": "normalisation",
                "labels": "a pinned label set",
                "within": "a pinned label set",
            }.get(later[0], "a training resolution")
            raise InvalidArgumentError(
                f"dataset URI has {later[0]}= under v={version}: {what} is query version "
                f"v={_SINCE[later[0]]}; copy the whole URI from dataset.uri"
            )
        hint = (
            f"{', '.join(reserved)} belong(s) to a mixture URI "
            "(rayform:///mix?v=2&...): rebuild it with MixtureDataset.from_uri"
            if reserved
            else f"v={version} knows {', '.join(allowed)}"
        )
        raise InvalidArgumentError(
            f"dataset URI has unknown parameter(s) {', '.join(unknown)}: {hint}"
        )
    missing = [k for k in _PARAMS if k not in values and k not in _OPTIONAL]
    if version == str(IMAGE_VERSION):  # what makes a URI version 3
        missing += [k for k in ("image_size", "resize") if k not in values]
    if missing:
        raise InvalidArgumentError(
            f"dataset URI lacks {', '.join(missing)}: every argument is spelled out so that a URI "
            "never depends on defaults; copy the whole URI from dataset.uri"
        )
    return values


def _normalize_arg(text: str) -> Any:
    """``normalize=`` as ``EpisodeDataset`` takes it: a mode, or given statistics (JSON)."""
    if text in ("mean_std", "quantile"):
        return text
    try:
        return json.loads(text)
    except ValueError:
        raise InvalidArgumentError(
            f"dataset URI: normalize={text[:40]!r} is neither a mode nor JSON statistics"
        ) from None


def _split_list(value: str) -> list[str]:
    return value.split(",") if value else []


def _format_float(value: float) -> str:
    """Shortest text that reads back to the same float; integral values without ``.0``."""
    text = repr(float(value))
    return text[:-2] if text.endswith(".0") else text


def _parse_float(name: str, text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise InvalidArgumentError(f"dataset URI: {name}={text!r} is not a number") from None


def _parse_int(name: str, text: str) -> int:
    if not re.fullmatch(r"-?[0-9]+", text):
        raise InvalidArgumentError(f"dataset URI: {name}={text!r} is not an integer")
    return int(text)


def _shown(value: str) -> str:
    return repr(value) if len(value) <= 120 else repr(value[:117] + "...")
