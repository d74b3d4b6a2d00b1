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


def sample_spec(ds: EpisodeDataset | MixtureDataset) -> dict[str, tuple[str, tuple[int, ...]]]:
    """``{key: (dtype, shape)}`` of one sample's tensors, as ``ds[i]`` returns them.

    Cameras ``(3, H, W) uint8``, vectors ``(D,) float32``, each with a leading ``obs_steps``
    axis and a ``<key>_is_pad`` mask when ``obs_steps > 1``; ``action (horizon, D) float32``,
    ``action_is_pad (horizon,) bool`` and ``t_ns () int64``, under the dataset's sample keys
    (mapped from stream names, docs/mixtures.md). ``meta`` is not a tensor and is left out. A
    mixture's is its layout's (with its masks), or its sources' shared one.
    """
    return dict(ds.sample_spec())


def dataset_profile(ds: EpisodeDataset) -> dict[str, Any]:
    """The slice as the dataset uses it: episodes, hours, sites, samples, manifest hash.

    For a mapped manifest the counts come from its columns (vectorised: no
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
        # Only when used: what deployment needs to undo the normalisation (docs/mixtures.md).
        **(
            {"normalize": ds.normalize, "normalization": ds.normalization()} if ds.normalize else {}
        ),
    }


def mixture_profile(mix: MixtureDataset) -> dict[str, Any]:
    """Every source's profile with its weight (as given and normalised), and the mixture's
    draws per epoch, replacement and seed."""
    return {
        "num_samples": mix.num_samples,
        "replacement": mix.replacement,
        "seed": mix.seed,
        **({"layout": mix.describe()["layout"]} if mix.layout is not None else {}),
        "sources": [
            {
                "weight": float(given),
                "share": float(w),
                "draws_per_epoch": int(q),
                **dataset_profile(ds),
                "name": name,
            }
            for ds, given, w, q, name in zip(
                mix.sources,
                mix.given_weights,
                mix.weights,
                mix.quotas,
                mix.source_names,
                strict=True,
            )
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
