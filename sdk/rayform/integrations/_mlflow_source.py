"""The MLflow dataset source of Rayform datasets, on its own for MLflow's plugin loader.

MLflow imports every ``mlflow.dataset_source`` entry point while ``mlflow.data`` itself is
being imported. The entry point names this module, which needs only
``mlflow.data.dataset_source`` (already loaded by then) and no other part of the integration,
so it always executes completely, whichever of ``mlflow`` and ``rayform.integrations.mlflow``
a program imports first.
"""

from __future__ import annotations

from typing import Any

from mlflow.data.dataset_source import DatasetSource

from rayform.uri import SCHEMES, DatasetURI, MixtureURI, is_mixture_uri

__all__ = ["RayformDatasetSource"]


class RayformDatasetSource(DatasetSource):
    """Where a Rayform dataset comes from: its dataset URI (``ds.uri``).

    Args:
        uri: a dataset URI, ``rayform://HOST/slc_...@MANIFEST?v=1&...``, or a mixture's
            (``rayform:///mix?v=2&...``).
    """

    def __init__(self, uri: str) -> None:
        # validated and canonical
        self.uri = str(MixtureURI.parse(uri) if is_mixture_uri(uri) else DatasetURI.parse(uri))

    @staticmethod
    def _get_source_type() -> str:
        return "rayform"

    def load(self, client: Any = None, **options: Any) -> Any:
        """Rebuild the dataset: ``EpisodeDataset.from_uri(self.uri, client, **options)``, or
        ``MixtureDataset.from_uri`` for a mixture.

        Raises:
            SliceChangedError: the server's slice no longer resolves to the pinned manifest.
            OfflineError: offline and the pinned manifest is not cached.
        """
        from rayform.torch import EpisodeDataset, MixtureDataset

        if is_mixture_uri(self.uri):
            return MixtureDataset.from_uri(self.uri, client, **options)
        return EpisodeDataset.from_uri(self.uri, client, **options)

    @staticmethod
    def _can_resolve(raw_source: object) -> bool:
        return isinstance(raw_source, str) and raw_source.split("://", 1)[0] in SCHEMES

    @classmethod
    def _resolve(cls, raw_source: Any) -> RayformDatasetSource:
        return cls(raw_source)

    def to_dict(self) -> dict[str, Any]:
        return {"uri": self.uri}

    @classmethod
    def from_dict(cls, source_dict: dict[Any, Any]) -> RayformDatasetSource:
        return cls(source_dict["uri"])

    def __repr__(self) -> str:
        return f"RayformDatasetSource({self.uri!r})"
