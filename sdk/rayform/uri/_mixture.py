"""Mixture URIs: one string that names a ``MixtureDataset`` exactly as it was trained on.

::

    rayform:///mix?v=2&mix=0.7:<source URI, percent-encoded>&mix=0.3:<source URI>
        &num_samples=1000&replacement=0&seed=0

Each ``mix=`` item is a source: its weight as given to ``MixtureDataset`` (not normalised, so
a rebuild computes exactly the same per-source draws) and its full dataset URI, which names
its own server, slice, manifest hash and arguments. The items keep the mixture's order; the
other parameters follow in alphabetical order. The authority is empty: the sources name their
servers. A mixture with a sample layout or source names (``MixtureDataset(sources,
layout=...)``, ``(dataset, weight, name)``) is version 3: ``layout=`` (``union`` or
percent-encoded JSON ``{key: shape}``) and ``names=`` (comma-separated, in source order)
join the other parameters; a mixture without them keeps its version 2 URI byte for byte.
``docs/tracking.md`` defines the format.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from urllib.parse import quote, unquote, urlsplit

from rayform._hashing import hash_bytes
from rayform.errors import InvalidArgumentError
from rayform.uri._dataset import DatasetURI, _format_float, _shown

__all__ = ["LAYOUT_VERSION", "MIX_VERSION", "MixtureURI", "is_mixture_uri"]

#: Query version of mixture URIs (version 1 predates mixtures).
MIX_VERSION = 2
#: Query version of a mixture URI with ``layout=`` or ``names=``.
LAYOUT_VERSION = 3
_PREFIX = "rayform:///mix"
_PARAMS = ("num_samples", "replacement", "seed")
_V3_PARAMS = ("layout", "names")


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
        layout: the sample layout as text (``"union"`` or compact JSON), or ``None``.
        names: the sources' names as given, or ``None``.
    """

    sources: tuple[tuple[float, DatasetURI], ...]
    num_samples: int
    replacement: bool = False
    seed: int = 0
    layout: str | None = None
    names: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        if self.names is not None:
            object.__setattr__(self, "names", tuple(self.names))
            if len(self.names) != len(self.sources):
                raise InvalidArgumentError(
                    f"mixture URI: {len(self.names)} names for {len(self.sources)} sources"
                )
        object.__setattr__(self, "sources", tuple((float(w), u) for w, u in self.sources))
        if not self.sources:
            raise InvalidArgumentError(
                "mixture URI names no source: a mixture has at least one mix= item"
            )
        for w, u in self.sources:
            if not (math.isfinite(w) and w > 0):
                raise InvalidArgumentError(f"mixture URI: weight {w!r}; use a finite number > 0")
            if not isinstance(u, DatasetURI):
                raise InvalidArgumentError(f"mixture URI: source {u!r} is not a DatasetURI")
        if self.num_samples < 1:
            raise InvalidArgumentError(
                f"mixture URI: num_samples={self.num_samples}; use an integer >= 1"
            )

    @property
    def query(self) -> str:
        """``v=2`` (or 3), the ``mix=`` items in order, then the other parameters alphabetically."""
        items = [f"mix={_format_float(w)}:{quote(str(u), safe='')}" for w, u in self.sources]
        params = {
            "num_samples": str(self.num_samples),
            "replacement": str(int(self.replacement)),
            "seed": str(self.seed),
        }
        if self.layout is not None:
            params["layout"] = quote(self.layout, safe="")
        if self.names is not None:
            params["names"] = ",".join(self.names)
        rest = [f"{k}={params[k]}" for k in sorted(params)]  # alphabetical, as in version 2
        return "&".join([f"v={self.version}", *items, *rest])

    @property
    def version(self) -> int:
        """3 with a layout or source names, else 2."""
        return LAYOUT_VERSION if self.layout is not None or self.names is not None else MIX_VERSION

    def __str__(self) -> str:
        return f"{_PREFIX}?{self.query}"

    @property
    def digest(self) -> str:
        """``mix-`` and 20 hex digits of BLAKE3 over every source's weight, full manifest hash
        and digest, in order, and the mixture's own arguments; independent of server addresses."""
        lines = [f"{_format_float(w)}:{u.manifest_hash}:{u.digest}" for w, u in self.sources]
        lines.append(f"{self.num_samples}:{int(self.replacement)}:{self.seed}")
        if self.version == LAYOUT_VERSION:  # only then: a version 2 mixture keeps its digest
            lines.append(f"layout={self.layout or ''}:names={','.join(self.names or ())}")
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
                f"{_shown(str(uri))} is not a mixture URI: it starts with {_PREFIX}?v= (2, or 3 "
                "with a layout or names); get one from mixture.uri"
            )
        query = urlsplit(uri).query
        sources: list[tuple[float, DatasetURI]] = []
        values: dict[str, str] = {}
        for item in query.split("&") if query else []:
            key, eq, value = item.partition("=")
            if not eq:
                raise InvalidArgumentError(
                    f"mixture URI query item {item!r} has no '=': write key=value"
                )
            if key == "mix":
                weight, colon, source = value.partition(":")
                if not colon:
                    raise InvalidArgumentError(
                        f"mixture URI: mix={value[:60]!r}: write mix=WEIGHT:SOURCE_URI"
                    )
                try:
                    w = float(weight)
                except ValueError:
                    raise InvalidArgumentError(
                        f"mixture URI: weight {weight!r} is not a number"
                    ) from None
                sources.append((w, DatasetURI.parse(unquote(source))))
                continue
            if key in values:
                raise InvalidArgumentError(
                    f"mixture URI names {key!r} twice: give each parameter once"
                )
            values[key] = unquote(value)
        version = values.pop("v", None)
        if version not in (str(MIX_VERSION), str(LAYOUT_VERSION)):
            raise InvalidArgumentError(
                f"{_shown(uri)} has query version v={version}; this rayform reads mixture URIs of "
                f"v={MIX_VERSION} and v={LAYOUT_VERSION}. Upgrade rayform (`pip install -U rayform`) to read a "
                "newer one."
            )
        known = _PARAMS + (_V3_PARAMS if version == str(LAYOUT_VERSION) else ())
        unknown = sorted(set(values) - set(known))
        if unknown:
            raise InvalidArgumentError(
                f"mixture URI has unknown parameter(s) {', '.join(unknown)}: v={version} knows "
                f"mix, {', '.join(known)}"
            )
        missing = [k for k in _PARAMS if k not in values]
        if missing:
            raise InvalidArgumentError(
                f"mixture URI lacks {', '.join(missing)}; copy the whole URI from mixture.uri"
            )
        for key in ("num_samples", "seed"):
            if not re.fullmatch(r"-?[0-9]+", values[key]):
                raise InvalidArgumentError(f"mixture URI: {key}={values[key]!r} is not an integer")
        if values["replacement"] not in ("0", "1"):
            raise InvalidArgumentError(
                f"mixture URI: replacement={values['replacement']!r}; use 0 or 1"
            )
        names = tuple(values["names"].split(",")) if "names" in values else None
        return cls(
            tuple(sources),
            num_samples=int(values["num_samples"]),
            replacement=values["replacement"] == "1",
            seed=int(values["seed"]),
            layout=values.get("layout"),
            names=names,
        )
