"""What an ``EpisodeDataset`` says about itself: ``describe()``, its repr and notebook repr.

Each is a function of the dataset's spec and grid (and, for ``describe()``, its epoch and
statistics), so a reader of a spec (Ray's) describes it the same way.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rayform import _html
from rayform._resolution import describe_resolution
from rayform.torch._index import GridIndex, selection_of
from rayform.torch._lineage import dataset_uri
from rayform.torch._sampling import episode_streams
from rayform.torch._spec import DatasetSpec
from rayform.uri import DatasetURI

__all__ = ["describe_dataset", "html_repr", "text_repr"]


def describe_dataset(
    spec: DatasetSpec,
    index: GridIndex,
    epoch: int,
    normalization: dict[str, dict[str, list[float]]] | None,
) -> dict[str, Any]:
    """``EpisodeDataset.describe()``: a JSON-able summary for experiment trackers."""
    names = spec.names
    return {
        "uri": str(dataset_uri(spec)),
        "slice": spec.slice.id,
        "manifest_hash": spec.slice.manifest_hash,
        "obs": spec.obs,
        "action": spec.action,
        "fps": spec.fps,
        "horizon": spec.horizon,
        "obs_steps": spec.obs_steps,
        "action_mode": spec.action_mode,
        "frame": spec.frame,
        "seed": spec.seed,
        "epoch": epoch,
        "episodes": len(index.segments),
        "samples": len(index),
        "samples_this_rank": episode_streams(
            index.offsets, spec.world, spec.ddp_even, spec.seed, 0, False
        )[spec.rank].length,
        "rank": spec.rank,
        "world_size": spec.world,
        "ddp_even": spec.ddp_even,
        **describe_resolution(spec.targets, spec.stream, names.key_of),
        **selection_of(spec.slice),
        # Only when used, so a dataset without them describes itself as before.
        **(
            {
                "obs_keys": dict(zip(names.obs_keys, names.obs_streams, strict=True)),
                "action_key": names.action_key,
            }
            if names.mapped
            else {}
        ),
        **({"normalize": spec.normalize, "normalization": normalization} if spec.normalize else {}),
    }


def _arguments(spec: DatasetSpec) -> tuple[list[tuple[str, Any]], str | None]:
    """``([(name, value)], uri)``: every argument in the dataset's URI (all that change the
    samples), or the basic ones and ``None`` if this slice has no URI."""
    try:
        uri = DatasetURI.parse(str(dataset_uri(spec)))
    except Exception:  # a BlobSource that is no Slice has no URI; a repr must not fail
        return [("obs", spec.obs), ("action", spec.action), ("fps", spec.fps)], None
    args = list(uri.dataset_kwargs().items())
    if uri.select is not None:
        args.append(("select", uri.select))
    return args, str(uri)


def text_repr(spec: DatasetSpec, index: GridIndex) -> str:
    """``repr(EpisodeDataset)``: the slice, its size and every argument in the URI."""
    args, uri = _arguments(spec)
    shown = " ".join(f"{k}={_short(v)}" for k, v in args if k != "segments" or v is not None)
    return (
        f"<EpisodeDataset slice={spec.slice.id} episodes={len(index.segments)} "
        f"samples={len(index)} {shown} uri={uri}>"
    )


def html_repr(spec: DatasetSpec, index: GridIndex) -> str:
    """The notebook repr: a header, the arguments as a table, and the URI."""
    args, uri = _arguments(spec)
    rows = [(k, _short(v)) for k, v in args]
    return _html.wrap(
        _html.header(
            f"EpisodeDataset on {spec.slice.id}",
            f"{len(index.segments):,} episodes",
            f"{len(index):,} samples",
        ),
        _html.kv_table(rows),
        f"<div><code>{_html.esc(uri)}</code></div>" if uri else "",
    )


def _short(value: str | float | Sequence[str] | None) -> str:
    """An argument for a repr: a long list of segment IDs as its count."""
    if isinstance(value, (list, tuple)) and len(value) > 8:
        return f"<{len(value)} items: {value[0]!r}, ..., {value[-1]!r}>"
    if isinstance(value, float):
        return f"{value:g}"
    return repr(list(value)) if isinstance(value, tuple) else repr(value)
