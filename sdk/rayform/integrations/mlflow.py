"""MLflow: a Rayform dataset as an ``mlflow.data`` dataset whose source rebuilds it.

::

    import mlflow
    from rayform.integrations.mlflow import from_episode_dataset

    with mlflow.start_run():
        mlflow.log_input(from_episode_dataset(dataset), context="training")

    # later, in any process with rayform installed:
    run = mlflow.get_run(run_id)
    source = mlflow.data.get_source(run.inputs.dataset_inputs[0])
    dataset = source.load()          # the same EpisodeDataset: same slice version, same samples

The logged input holds the name, a digest (manifest hash and arguments), the dataset URI as
its source, the tensor schema of a sample and the slice's profile (episodes, hours, sites).
MLflow finds :class:`RayformDatasetSource` through the ``mlflow.dataset_source`` entry point
that ``pip install "rayform[mlflow]"`` registers. Needs ``mlflow>=2.16``.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

# mlflow.data first: it loads the entry points, among them our _mlflow_source.
import mlflow.data  # noqa: F401
from mlflow.data.dataset import Dataset

from rayform.integrations._common import (
    check_dataset,
    dataset_profile,
    is_mixture,
    mixture_profile,
    sample_spec,
)
from rayform.integrations._mlflow_source import RayformDatasetSource
from rayform.uri import DatasetURI, MixtureURI

if TYPE_CHECKING:
    from rayform.torch import EpisodeDataset, EpisodeSampler, MixtureDataset

__all__ = ["RayformDataset", "RayformDatasetSource", "from_episode_dataset"]


class RayformDataset(Dataset):
    """An ``mlflow.data`` dataset describing a Rayform ``EpisodeDataset``; see the module docs.

    Build it with :func:`from_episode_dataset`.
    """

    def __init__(
        self,
        ds: EpisodeDataset | MixtureDataset,
        name: str | None = None,
        sampler: EpisodeSampler | None = None,
    ) -> None:
        self._ds = ds
        self._uri: DatasetURI | MixtureURI
        if is_mixture(ds):
            self._uri = MixtureURI.parse(ds.uri)
            self._profile = mixture_profile(ds)
            self._spec = sample_spec(
                ds
            )  # the mixture's (its layout's, or its sources' shared keys)
            default = "+".join(dict.fromkeys(src.slice_id for _, src in self._uri.sources))
        else:
            self._uri = DatasetURI.parse(ds.uri)
            self._profile = dataset_profile(ds)
            self._spec = sample_spec(ds)
            default = ds.slice.id
        if sampler is not None:  # how the samples were ordered: shuffle, window and why
            self._profile = {**self._profile, "order": sampler.describe()}
        super().__init__(source=RayformDatasetSource(str(self._uri)), name=name or default)

    def _compute_digest(self) -> str:
        # A mixture's digest covers every source's manifest hash and weight (MixtureURI.digest).
        return self._uri.digest

    @property
    def dataset(self) -> Any:
        """The ``EpisodeDataset`` (or ``MixtureDataset``) this describes."""
        return self._ds

    @property
    def profile(self) -> dict[str, Any]:
        """Episodes, hours, sites, samples, slice and manifest hash (a mixture: per source,
        with its weight and draws per epoch)."""
        return dict(self._profile)

    @property
    def schema(self) -> Any:
        """A ``TensorDatasetSchema``: observations as features, the action chunk as targets."""
        import numpy as np
        from mlflow.data.schema import TensorDatasetSchema
        from mlflow.types import Schema, TensorSpec

        def dtype(name: str) -> Any:
            # A text key (a string, a list of event records) has no numpy dtype: object.
            return np.dtype(object) if name in ("str", "events") else np.dtype(name)

        def specs(keys: list[str]) -> Schema | None:
            cols = [TensorSpec(dtype(self._spec[k][0]), self._spec[k][1], name=k) for k in keys]
            return Schema(cols) if cols else None  # type: ignore[arg-type]

        targets = [k for k in self._spec if k.startswith("action")]
        features = specs([k for k in self._spec if k not in targets])
        assert features is not None  # t_ns is always there
        # targets=None is allowed at run time (MLflow annotates it as required)
        return TensorDatasetSchema(features=features, targets=specs(targets))  # type: ignore[arg-type]

    def to_dict(self) -> dict[str, str]:
        """Name, digest, source, source type, schema and profile, as MLflow stores them."""
        config = super().to_dict()
        config["schema"] = json.dumps(self.schema.to_dict())
        config["profile"] = json.dumps(self._profile)
        return config


def from_episode_dataset(
    ds: EpisodeDataset | MixtureDataset,
    name: str | None = None,
    sampler: EpisodeSampler | None = None,
) -> RayformDataset:
    """Describe ``ds`` for ``mlflow.log_input(..., context="training")``.

    Reads only the manifest (no fetch, no decode).

    Args:
        ds: a :class:`rayform.torch.EpisodeDataset` or :class:`rayform.torch.MixtureDataset`.
        name: the dataset's name in MLflow; default the slice ID (a mixture: its sources'
            slice IDs joined by ``+``).
        sampler: the run's :class:`~rayform.torch.EpisodeSampler`, if any: its
            ``describe()`` (shuffle, the window ``"auto"`` chose and why) goes into the
            profile as ``"order"``.

    Raises:
        InvalidArgumentError: ``ds`` is neither.
    """
    check_dataset(ds, "from_episode_dataset")
    return RayformDataset(ds, name=name, sampler=sampler)
