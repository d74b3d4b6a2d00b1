"""Rebuild the dataset a run logged, through MLflow's own source registry, in a fresh process:
prints the source's type, the dataset's URI and its sample digests as JSON.

Usage: ``python mlflow_rebuild.py RUN_ID`` (tracking URI from the environment, ``tests/`` on
``PYTHONPATH``).
"""

import json
import sys

import mlflow

from support.lineage import sample_digests


def main(run_id: str) -> None:
    inputs = mlflow.get_run(run_id).inputs
    assert inputs is not None, f"run {run_id} logged no input"
    source = mlflow.data.get_source(inputs.dataset_inputs[0])
    ds = source.load()
    print(json.dumps({"type": type(source).__name__, "uri": ds.uri, "samples": sample_digests(ds)}))


if __name__ == "__main__":
    main(sys.argv[1])
