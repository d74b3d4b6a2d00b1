"""``EpisodeDataset.uri`` and ``EpisodeDataset.from_uri``: a dataset's spec to a URI and back.

The URI pins the manifest hash, so ``from_uri`` rebuilds the same samples or refuses:

* online, the slice's current manifest if it is the pinned one, else the pinned manifest by
  hash (the server serves every manifest a slice once named, with its blobs), else
  :class:`~rayform.errors.SliceChangedError`;
* offline (``RAYFORM_OFFLINE=1``), the pinned manifest is read from the cache by its hash,
  whatever slice version the cache resolved last, so a run can be reproduced from a cache
  that holds its bytes even after the slice was rebuilt.

The format itself is :class:`rayform.DatasetURI` (``docs/tracking.md``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from rayform._resolution import format_image_size, image_size_of
from rayform.client import Client
from rayform.errors import InvalidArgumentError, NotFoundError, OfflineError, SliceChangedError
from rayform.manifest import Segments
from rayform.slice import Slice
from rayform.torch._layout import format_layout, parse_layout
from rayform.torch._normalize import format_normalize
from rayform.torch._spec import DatasetSpec
from rayform.uri import DatasetURI, MixtureURI, clean_endpoint, selection_expression

if TYPE_CHECKING:
    from rayform._seams import BlobSource

__all__ = [
    "OPTIONS",
    "dataset_arguments",
    "dataset_uri",
    "mixture_arguments",
    "mixture_uri",
    "resolve_pinned",
]

#: ``EpisodeDataset`` arguments that change how samples are read or distributed, never which
#: samples a dataset holds, so they are not in the URI and ``from_uri`` accepts them again.
OPTIONS = (
    "transform",
    "tokenizer",
    "shard",
    "ddp_even",
    "decoder_cache_size",
    "decoder_backend",
    "decode_threads",
    "readahead_bytes",
)


def dataset_uri(spec: DatasetSpec) -> DatasetURI:
    """The :class:`DatasetURI` of a dataset's spec (its slice's server, manifest and arguments)."""
    slice_ = spec.slice
    select, chosen = _chosen(slice_, spec.segments)
    size = image_size_of(dict(spec.targets) if spec.targets else None)  # keyed by stream
    # A slice from a Client names its server; one read another way (a test's store) has none.
    client = slice_.client if isinstance(slice_, Slice) else None
    return DatasetURI(
        endpoint=client.endpoint if isinstance(client, Client) else None,
        slice_id=slice_.id,
        manifest_hash=slice_.manifest_hash,
        obs=tuple(spec.obs),
        action=spec.action,
        fps=spec.fps,
        horizon=spec.horizon,
        frame=spec.frame,
        obs_steps=spec.obs_steps,
        action_mode=spec.action_mode,
        seed=spec.seed,
        segments=chosen,
        select=select,
        image_size=None if size is None else format_image_size(size, spec.obs),
        resize=None if size is None else spec.resize,
        # keys= only when some key is mapped (a dataset built from lists keeps its v1-3 URI).
        keys=spec.names.keys if spec.names.mapped else None,
        # A mode's numbers follow from the pinned manifest: the mode alone rebuilds them.
        normalize=None
        if spec.normalize is None
        else format_normalize(spec.normalize, spec.normalize_given),
        labels=spec.labels,
        within=spec.within_text,
    )


def _chosen(slice_: BlobSource, used: Segments) -> tuple[str | None, tuple[str, ...] | None]:
    """``(select expression, segment IDs)`` that rebuild the episodes ``used`` of ``slice_``.

    A dataset on every segment of a selection view names the view (``select=``) when it is
    expressible; otherwise (a ``where=`` predicate, or ``segments=`` chosen by hand) the
    episodes are listed, which rebuilds them exactly from the whole slice.
    """
    selection = slice_.selection
    if selection is not None and _same(used, slice_.segments):
        expr = selection_expression(selection)
        if expr is not None:
            return expr, None
    root = slice_.parent if slice_.parent is not None else slice_
    if _same(used, root.segments):
        return None, None
    return None, tuple(_ids(used))


def _same(a: Segments, b: Segments) -> bool:
    """Same segments in the same order; compares columns, not objects, for a v2 manifest."""
    if a is b:
        return True
    if len(a) != len(b):
        return False
    if a.same_columns(b):
        return bool(np.array_equal(a.positions(), b.positions()))
    return _ids(a) == _ids(b)


def _ids(segs: Segments) -> list[str]:
    return [str(x) for x in segs.ids().to_pylist()]


def dataset_arguments(
    uri: str | DatasetURI, client: Client | None = None, **options: Any
) -> tuple[Slice, dict[str, Any]]:
    """What :meth:`EpisodeDataset.from_uri` builds from: ``(slice, keyword arguments)``, the
    slice pinned at the URI's manifest (and its selection), the arguments the URI fixes plus
    ``options`` (the ones it leaves free)."""
    parsed = uri if isinstance(uri, DatasetURI) else DatasetURI.parse(uri)
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise InvalidArgumentError(
            f"from_uri() got {', '.join(unknown)}: the URI fixes every argument that changes the "
            f"samples; only {', '.join(OPTIONS)} may be passed again"
        )
    if client is None:
        client = _client_for(parsed)
    slice_ = resolve_pinned(client, parsed.slice_id, parsed.manifest_hash)
    selection = parsed.selection()
    if selection is not None:
        slice_ = slice_.select(**selection)
    return slice_, {**parsed.dataset_kwargs(), **options}


def mixture_uri(
    sources: Sequence[tuple[float, DatasetSpec]],
    *,
    num_samples: int,
    replacement: bool,
    seed: int,
    layout: str | Mapping[str, tuple[int, ...]] | None,
    names: tuple[str, ...] | None,
) -> MixtureURI:
    """The :class:`~rayform.uri._mixture.MixtureURI` of a mixture: its sources' ``(weight as
    given, spec)``, ``num_samples``, ``replacement``, ``seed``, the layout's argument and the
    source names as given (``None`` when none was)."""
    return MixtureURI(
        tuple((w, dataset_uri(spec)) for w, spec in sources),
        num_samples=num_samples,
        replacement=replacement,
        seed=seed,
        layout=None if layout is None else format_layout(layout),
        names=names,
    )


def mixture_arguments(
    uri: str | MixtureURI,
    client: Client | None = None,
) -> tuple[list[tuple[DatasetURI, Client, float, str | None]], dict[str, Any]]:
    """What :meth:`MixtureDataset.from_uri` builds from: each source's ``(URI, client,
    weight, name)`` (one client per server; a URI without a host shares the configured one;
    the name as given, or ``None``) and the mixture's keyword arguments (with its layout)."""
    parsed = uri if isinstance(uri, MixtureURI) else MixtureURI.parse(uri)
    clients: dict[str | None, Client] = {}
    sources = []
    names = parsed.names or (None,) * len(parsed.sources)
    for (weight, source), name in zip(parsed.sources, names, strict=True):
        own = client if client is not None else clients.get(source.endpoint)
        if own is None:
            own = clients[source.endpoint] = _client_for(source)
        sources.append((source, own, weight, name))
    return sources, {
        "num_samples": parsed.num_samples,
        "replacement": parsed.replacement,
        "seed": parsed.seed,
        "layout": None if parsed.layout is None else parse_layout(parsed.layout),
    }


def resolve_pinned(client: Client, slice_id: str, manifest_hash: str) -> Slice:
    """``slice_id`` at exactly ``manifest_hash``, from the server (online) or the cache (offline).

    Online, the current manifest if the slice still names it; else the pinned one by hash
    (``client.slices.get(slice_id, manifest_hash=...)``), which the server hands out for any
    manifest the slice once named.

    Raises:
        SliceChangedError: online, the slice names another manifest and the server does not
            serve the pinned one (it never named it, or predates manifests by hash).
        OfflineError: offline, and the pinned manifest is not in the cache.
    """
    if client.offline:
        try:
            return client.slices.get(slice_id, manifest_hash=manifest_hash)
        except OfflineError:
            raise OfflineError(
                f"manifest {manifest_hash[:12]}... of slice {slice_id} (the version the dataset "
                f"URI pins) is not in the cache {client.cache_dir} and offline mode is on "
                f"(RAYFORM_OFFLINE=1); with network access run `rayform pull {slice_id} --manifest "
                f"{manifest_hash}` while the server still serves that version"
            ) from None
    slice_ = client.slices.get(slice_id)
    if slice_.manifest_hash == manifest_hash:
        return slice_
    try:
        return client.slices.get(slice_id, manifest_hash=manifest_hash)
    except NotFoundError:
        pass
    server = clean_endpoint(client.endpoint) if client.endpoint else "the server"
    raise SliceChangedError(
        f"slice {slice_id} on {server} now resolves to manifest "
        f"{slice_.manifest_hash[:12]}..., not {manifest_hash[:12]}... that the dataset URI "
        "pins, and the server does not serve the pinned version by hash (the slice never named it "
        "there, or the server predates manifests by hash). To reproduce the run, use a cache that "
        "still holds the pinned manifest and blobs with RAYFORM_OFFLINE=1; to train on the current "
        f"version, build a new dataset from client.slices.get({slice_id!r})"
    )


def _client_for(parsed: DatasetURI) -> Client:
    """A client for the URI's server, configured from the environment like ``Client()``.

    The environment's token is sent only to the server the environment names: a URI read from
    a tracker that names another host is refused rather than handed ``RAYFORM_TOKEN``.
    """
    configured = os.environ.get("RAYFORM_ENDPOINT") or None
    if parsed.endpoint is None:
        return Client()
    if configured is not None and clean_endpoint(configured) != parsed.endpoint:
        raise InvalidArgumentError(
            f"the dataset URI names the server {parsed.endpoint} but RAYFORM_ENDPOINT is "
            f"{clean_endpoint(configured)}; RAYFORM_TOKEN is only sent to the latter. If both are "
            "the same data, pass client=rayform.Client() to use your configured server"
        )
    return Client(endpoint=parsed.endpoint)
