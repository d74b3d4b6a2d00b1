"""Importing ``rayform.integrations.mlflow`` before mlflow still registers the dataset source:
MLflow resolves the dataset URI to it. Run with ``-W error``: no warning either.

Usage: ``python -W error mlflow_entry_point.py URI``.
"""

import sys


def main(uri: str) -> None:
    # The order is the point: the integration first, then mlflow's registry.
    from rayform.integrations.mlflow import RayformDatasetSource
    from mlflow.data.dataset_source_registry import resolve_dataset_source  # isort: skip

    import rayform.integrations as pkg

    assert pkg.mlflow is sys.modules["rayform.integrations.mlflow"]
    assert type(resolve_dataset_source(uri)) is RayformDatasetSource


if __name__ == "__main__":
    main(sys.argv[1])
