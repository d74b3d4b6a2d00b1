"""Mixture URIs: one string that names a ``MixtureDataset`` exactly as it was trained on.

::

    rayform:///mix?v=2&mix=0.7:<source URI, percent-encoded>&mix=0.3:<source URI>
        &num_samples=1000&replacement=0&seed=0

Each ``mix=`` item is a source: its weight as given to ``MixtureDataset`` (not normalised, so
a rebuild computes exactly the same per-source draws) and its full dataset URI, which names
its own server, slice, manifest hash and arguments. The items keep the mixture's order; the
other parameters follow in alphabetical order. The authority is empty: the sources name their
servers. ``docs/tracking.md`` defines the format.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from urllib.parse import quote, unquote, urlsplit

from rayform._hashing import hash_bytes
from rayform.errors import InvalidArgumentError
from rayform.uri._dataset import DatasetURI, _format_float, _shown

__all__ = ["MIX_VERSION", "MixtureURI", "is_mixture_uri"]

#: Query version of mixture URIs (version 1 predates mixtures).
MIX_VERSION = 2
_PREFIX = "rayform:///mix"
_PARAMS = ("num_samples", "replacement", "seed")


def is_mixture_uri(uri: str) -> bool:
    """Whether ``uri`` names a mixture (``rayform:///mix?...``) rather than one dataset."""
    return isinstance(uri, str) and uri.split("?", 1)[0] == _PREFIX


@dataclass(frozen=True)
class MixtureURI:
    """A parsed mixture URI; ``str(uri)`` is canonical and ``MixtureURI.parse(str(u)) == u``.

    Attributes:
        sources: ``((weight, DatasetURI), ...)`` in the mixture's order; weights as given
            (``MixtureDataset`` normalises them).
        num_samples: draws per epoch.
        replacement: whether draws are independent.
        seed: the mixture's seed.
    """

    sources: tuple[tuple[float, DatasetURI], ...]
    num_samples: int
    replacement: bool = False
    seed: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "sources", tuple((float(w), u) for w, u in self.sources))
        if not self.sources:
            raise InvalidArgumentError("mixture URI names no source: a mixture has at least one mix= item")
        for w, u in self.sources:
            if not (math.isfinite(w) and w > 0):
                raise InvalidArgumentError(f"mixture URI: weight {w!r}; use a finite number > 0")
            if not isinstance(u, DatasetURI):
                raise InvalidArgumentError(f"mixture URI: source {u!r} is not a DatasetURI")
        if self.num_samples < 1:
            raise InvalidArgumentError(f"mixture URI: num_samples={self.num_samples}; use an integer >= 1")

    @property
    def query(self) -> str:
        """``v=2``, the ``mix=`` items in order, then ``num_samples``, ``replacement``, ``seed``."""
        items = [f"mix={_format_float(w)}:{quote(str(u), safe='')}" for w, u in self.sources]
        rest = [f"num_samples={self.num_samples}", f"replacement={int(self.replacement)}", f"seed={self.seed}"]
        return "&".join([f"v={MIX_VERSION}", *items, *rest])

    def __str__(self) -> str:
        return f"{_PREFIX}?{self.query}"

    @property
    def digest(self) -> str:
        """``mix-`` and 20 hex digits of BLAKE3 over every source's weight, full manifest hash
        and digest, in order, and the mixture's own arguments; independent of server addresses."""
        lines = [f"{_format_float(w)}:{u.manifest_hash}:{u.digest}" for w, u in self.sources]
        lines.append(f"{self.num_samples}:{int(self.replacement)}:{self.seed}")
        return "mix-" + hash_bytes("\n".join(lines).encode())[:20]

    @classmethod
    def parse(cls, uri: str) -> MixtureURI:
        """Parse a mixture URI (parameters after the ``mix=`` items in any order).

        Raises:
            InvalidArgumentError: not a mixture URI, an unknown version or parameter, or a
                malformed source (the message says which).
        """
        if not is_mixture_uri(uri):
            raise InvalidArgumentError(
                f"{_shown(str(uri))} is not a mixture URI: it starts with {_PREFIX}?v=2; get one from mixture.uri"
            )
        query = urlsplit(uri).query
        sources: list[tuple[float, DatasetURI]] = []
        values: dict[str, str] = {}
        for item in query.split("&") if query else []:
            key, eq, value = item.partition("=")
            if not eq:
                raise InvalidArgumentError(f"mixture URI query item {item!r} has no '=': write key=value")
            if key == "mix":
                weight, colon, source = value.partition(":")
                if not colon:
                    raise InvalidArgumentError(f"mixture URI: mix={value[:60]!r}: write mix=WEIGHT:SOURCE_URI")
                try:
                    w = float(weight)
                except ValueError:
                    raise InvalidArgumentError(f"mixture URI: weight {weight!r} is not a number") from None
                sources.append((w, DatasetURI.parse(unquote(source))))
                continue
            if key in values:
                raise InvalidArgumentError(f"mixture URI names {key!r} twice: give each parameter once")
            values[key] = unquote(value)
        version = values.pop("v", None)
        if version != str(MIX_VERSION):
            raise InvalidArgumentError(
                f"{_shown(uri)} has query version v={version}; this rayform reads mixture URIs of "
                f"v={MIX_VERSION}. Upgrade rayform (`pip install -U rayform`) to read a newer one."
            )
        unknown = sorted(set(values) - set(_PARAMS))
        if unknown:
            raise InvalidArgumentError(
                f"mixture URI has unknown parameter(s) {', '.join(unknown)}: v={MIX_VERSION} knows "
                f"mix, {', '.join(_PARAMS)}"
            )
        missing = [k for k in _PARAMS if k not in values]
        if missing:
            raise InvalidArgumentError(f"mixture URI lacks {', '.join(missing)}; copy the whole URI from mixture.uri")
        for key in ("num_samples", "seed"):
            if not re.fullmatch(r"-?[0-9]+", values[key]):
                raise InvalidArgumentError(f"mixture URI: {key}={values[key]!r} is not an integer")
        if values["replacement"] not in ("0", "1"):
            raise InvalidArgumentError(f"mixture URI: replacement={values['replacement']!r}; use 0 or 1")
        return cls(tuple(sources), num_samples=int(values["num_samples"]),
                   replacement=values["replacement"] == "1", seed=int(values["seed"]))
