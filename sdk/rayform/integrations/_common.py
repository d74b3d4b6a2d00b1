"""What every tracker records about a dataset: its sample layout and the slice's profile.

Both are read from the manifest alone, without fetching or decoding anything, so logging a
dataset costs no I/O.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rayform.errors import InvalidArgumentError

if TYPE_CHECKING:
    from typing_extensions import TypeIs

    from rayform.torch import EpisodeDataset, MixtureDataset

__all__ = ["check_dataset", "dataset_profile", "is_mixture", "mixture_profile", "sample_spec"]


def sample_spec(ds: EpisodeDataset) -> dict[str, tuple[str, tuple[int, ...]]]:
    """``{key: (dtype, shape)}`` of one sample's tensors, as ``ds[i]`` returns them.

    Cameras ``(3, H, W) uint8``, vectors ``(D,) float32``, each with a leading ``obs_steps``
    axis and a ``<key>_is_pad`` mask when ``obs_steps > 1``; ``action (horizon, D) float32``,
    ``action_is_pad (horizon,) bool`` and ``t_ns () int64``. ``meta`` is not a tensor and is
    left out.
    """
    first = ds.segments[0].streams
    history = (ds.obs_steps,) if ds.obs_steps > 1 else ()
    spec: dict[str, tuple[str, tuple[int, ...]]] = {}
    for name in ds.obs:
        stream = first[name]
        if stream.kind == "video":  # (3, H, W) after the dataset's image_size
            spec[name] = ("uint8", (*history, *ds.frame_shape(name)))
        else:
            spec[name] = ("float32", (*history, *stream.shape))
        if history:
            spec[f"{name}_is_pad"] = ("bool", history)
    if ds.action is not None:
        spec["action"] = ("float32", (ds.horizon, *first[ds.action].shape))
        spec["action_is_pad"] = ("bool", (ds.horizon,))
    spec["t_ns"] = ("int64", ())
    return spec


def dataset_profile(ds: EpisodeDataset) -> dict[str, Any]:
    """The slice as the dataset uses it: episodes, hours, sites, samples, manifest hash.

    For a version 2 manifest the counts come from its columns (vectorised: no
    :class:`~rayform.manifest.Segment` per episode), so a million-episode slice profiles in
    a fraction of a second.
    """
    segs = ds.segments
    seconds = segs.duration_ns() / 1e9
    sites = segs.site_counts()
    return {
        "slice": ds.slice.id,
        "manifest_hash": ds.slice.manifest_hash,
        "segments": len(segs),
        "hours": round(seconds / 3600, 6),
        "sites": sites,
        "samples": len(ds),
        "fps": ds.fps,
    }


def mixture_profile(mix: MixtureDataset) -> dict[str, Any]:
    """Every source's profile with its weight (as given and normalised), and the mixture's
    draws per epoch, replacement and seed."""
    return {
        "num_samples": mix.num_samples,
        "replacement": mix.replacement,
        "seed": mix.seed,
        "sources": [
            {"weight": float(given), "share": float(w), "draws_per_epoch": int(q), **dataset_profile(ds)}
            for ds, given, w, q in zip(mix.sources, mix.given_weights, mix.weights, mix.quotas, strict=True)
        ],
    }


def is_mixture(ds: EpisodeDataset | MixtureDataset) -> TypeIs[MixtureDataset]:
    """Whether ``ds`` is a :class:`~rayform.torch.MixtureDataset`."""
    # Imported here: a dataset in hand means rayform.torch is loaded already, and a tracker's
    # module must import without torch.
    from rayform.torch import MixtureDataset

    return isinstance(ds, MixtureDataset)


def check_dataset(ds: object, caller: str) -> None:
    """Raise :class:`InvalidArgumentError` unless ``ds`` is an ``EpisodeDataset`` or
    ``MixtureDataset``; ``caller`` names the function in the message."""
    from rayform.torch import EpisodeDataset, MixtureDataset

    if not isinstance(ds, (EpisodeDataset, MixtureDataset)):
        raise InvalidArgumentError(
            f"{caller}() takes a rayform.torch.EpisodeDataset or MixtureDataset, got {type(ds).__name__}"
        )
