"""Weights & Biases: the dataset in ``run.config`` and the slice version as a reference artifact.

::

    import wandb
    from rayform.integrations.wandb import log_dataset

    run = wandb.init(project="policy")
    log_dataset(run, dataset)            # run.config["dataset"] = dataset.describe() (with "uri")

    # later:
    dataset = EpisodeDataset.from_uri(api.run(path).config["dataset"]["uri"])

The artifact (type ``dataset``, named after the slice) holds one reference entry, ``manifest``,
pointing at ``rayform://HOST/slc_...@MANIFEST_HASH`` with the manifest hash as its digest, so
the artifact's digest depends on the manifest hash alone: every run that trains on the same
slice version uses the same artifact version, and W&B's lineage graph links them. Nothing is
uploaded. A ``MixtureDataset`` is logged the same way: its ``describe()`` (with ``"uri"``) in
the config and one reference entry per source (``0-slc_...``, ``1-slc_...``, in the mixture's
order), so the artifact's version follows the sources' manifests. Offline runs
(``WANDB_MODE=offline``) record the same input, and ``wandb sync`` sends it. Needs ``wandb>=0.19``.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

import wandb
from wandb.sdk.artifacts.artifact_manifest_entry import ArtifactManifestEntry
from wandb.sdk.lib.paths import LogicalPath

from rayform.errors import InvalidArgumentError
from rayform.integrations._common import (
    check_dataset,
    dataset_profile,
    is_mixture,
    mixture_profile,
    sample_spec,
)
from rayform.uri import DatasetURI, MixtureURI

if TYPE_CHECKING:
    from wandb.sdk.wandb_run import Run

    from rayform.torch import EpisodeDataset, EpisodeSampler, MixtureDataset

__all__ = ["log_dataset"]

_KEY_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]*")


def log_dataset(
    run: Run,
    ds: EpisodeDataset | MixtureDataset,
    *,
    key: str = "dataset",
    name: str | None = None,
    sampler: EpisodeSampler | None = None,
) -> wandb.Artifact:
    """Record ``ds`` in ``run``: its description in ``run.config[key]``, its slice as an input.

    Reads only the manifest (no fetch, no decode).

    Args:
        run: the ``wandb.Run`` from ``wandb.init()``.
        ds: a :class:`rayform.torch.EpisodeDataset` or :class:`rayform.torch.MixtureDataset`.
        key: the ``run.config`` key (e.g. ``"val_dataset"`` for a second dataset).
        name: the artifact's name; default the slice ID (a mixture: ``mix-`` and its sources'
            slice IDs).
        sampler: the run's :class:`~rayform.torch.EpisodeSampler`, if any: its ``describe()``
            (shuffle, the window ``"auto"`` chose and why) goes into ``run.config[key]["order"]``.

    Returns:
        The ``wandb.Artifact`` the run now uses.

    Raises:
        InvalidArgumentError: ``ds`` is not an ``EpisodeDataset`` or ``key`` is not a name.
    """
    check_dataset(ds, "log_dataset")
    if not isinstance(key, str) or not _KEY_RE.fullmatch(key):
        raise InvalidArgumentError(
            f"key={key!r}: use a config key such as 'dataset' or 'val_dataset'"
        )
    order = {"order": sampler.describe()} if sampler is not None else {}
    if is_mixture(ds):
        return _log_mixture(run, ds, key, name, order)
    uri = DatasetURI.parse(ds.uri)
    info = ds.describe()
    info["digest"] = uri.digest
    info.update(order)
    run.config.update({key: info}, allow_val_change=True)

    artifact = wandb.Artifact(
        name or uri.slice_id,
        type="dataset",
        description=f"Rayform slice {uri.slice_id} at manifest {uri.manifest_hash}",
        metadata={
            "slice_uri": uri.slice_uri,
            "manifest_hash": uri.manifest_hash,
            "profile": dataset_profile(ds),
            "sample": {k: {"dtype": d, "shape": list(s)} for k, (d, s) in sample_spec(ds).items()},
        },
    )
    # add_reference() cannot set a digest for a scheme W&B does not know (it uses the URI
    # itself), so the entry is made here: its digest is the manifest hash, which pins every
    # byte, and the host is left out of the digest so any server name gives the same version.
    artifact.manifest.add_entry(
        ArtifactManifestEntry(
            path=LogicalPath("manifest"),
            ref=uri.slice_uri,
            digest=uri.manifest_hash,
            size=int(ds.slice.segments.summary()["nbytes"]),
        )
    )
    _use(run, artifact)
    return artifact


def _log_mixture(
    run: Run, mix: MixtureDataset, key: str, name: str | None, order: dict[str, Any]
) -> wandb.Artifact:
    uri = MixtureURI.parse(mix.uri)
    info = {**mix.describe(), **order}
    info["digest"] = uri.digest
    run.config.update({key: info}, allow_val_change=True)
    slices = list(dict.fromkeys(src.slice_id for _, src in uri.sources))
    artifact = wandb.Artifact(
        name or ("mix-" + "-".join(slices))[:128],
        type="dataset",
        description=f"Rayform mixture of {len(uri.sources)} datasets on {', '.join(slices)}",
        metadata={
            "mixture_uri": str(uri),
            "profile": mixture_profile(mix),
            "sample": {k: {"dtype": d, "shape": list(s)} for k, (d, s) in sample_spec(mix).items()},
        },
    )
    # One entry per source, digest its manifest hash: the artifact's version follows the data
    # (weights and arguments are in the config and metadata), like a single dataset's.
    for k, ((_, src), ds) in enumerate(zip(uri.sources, mix.sources, strict=True)):
        artifact.manifest.add_entry(
            ArtifactManifestEntry(
                path=LogicalPath(f"{k}-{src.slice_id}"),
                ref=src.slice_uri,
                digest=src.manifest_hash,
                size=int(ds.slice.segments.summary()["nbytes"]),
            )
        )
    _use(run, artifact)
    return artifact


def _use(run: Run, artifact: wandb.Artifact) -> None:
    """Mark ``artifact`` as an input of ``run``, online or offline."""
    if not getattr(run, "offline", False):
        run.use_artifact(artifact)
        return
    # W&B refuses use_artifact() offline, yet for a new artifact use_artifact() only records
    # the artifact with "use after commit" set, which `wandb sync` later replays as an input.
    # Record exactly that, so a cluster run trained offline links like an online one.
    log = getattr(run, "_log_artifact", None)
    if log is not None:
        log(artifact, is_user_created=True, use_after_commit=True)
    else:  # a W&B without the private hook: the run at least records the artifact
        run.log_artifact(artifact)
