"""Rebuild the mixture a run logged, through MLflow's own source registry, in a fresh process:
prints its type, URI and the digests of its draws as JSON.

Usage: ``python mlflow_rebuild_mixture.py RUN_ID`` (tracking URI from the environment,
``tests/`` on ``PYTHONPATH``).
"""

import json
import sys
from typing import Any

import mlflow

from support.lineage import mixture_digests


def main(run_id: str) -> None:
    inputs = mlflow.get_run(run_id).inputs
    assert inputs is not None, f"run {run_id} logged no input"
    # Rayform's source (found through mlflow's registry, not imported here) takes readahead_bytes.
    source: Any = mlflow.data.get_source(inputs.dataset_inputs[0])
    mix = source.load(readahead_bytes=0)
    print(json.dumps({"type": type(mix).__name__, "uri": mix.uri, "samples": mixture_digests(mix)}))


if __name__ == "__main__":
    main(sys.argv[1])
