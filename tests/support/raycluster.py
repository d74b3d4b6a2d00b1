"""A real local Ray cluster for tests/ray/: nodes on this machine, 1 CPU each, a small object store.

Ray Train's controller polls its workers every 0.5 s (2 s by default). Its workers import
the checkout's code (``tests``, ``sdk``, ``server_stub`` first on their ``PYTHONPATH``, so
``support.raytrain`` functions unpickle). Everything it starts is stopped
and its session directory removed on exit, whatever happened: no process or ``/tmp/ray``
session is left behind.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

__all__ = ["OBJECT_STORE_BYTES", "local_ray_cluster"]

#: Object store of each node (Ray's smallest workable size is about 75 MiB).
OBJECT_STORE_BYTES = 96 << 20
TESTS = Path(__file__).resolve().parents[1]


@contextmanager
def local_ray_cluster(nodes: int = 2, cpus: int = 1) -> Iterator[Any]:
    """A ``ray.cluster_utils.Cluster`` of ``nodes`` nodes with ``cpus`` CPUs each, connected
    (``ray.init``); yields the cluster (``cluster.address``, ``cluster.list_all_nodes()``)."""
    import ray
    from ray.cluster_utils import Cluster

    temp = tempfile.mkdtemp(prefix="rfray-", dir="/tmp")  # short: Unix socket paths live here
    path = [str(TESTS), str(TESTS.parent / "sdk"), str(TESTS.parent / "server_stub")]
    names = (
        "PYTHONPATH",
        "OMP_NUM_THREADS",
        "RAY_USAGE_STATS_ENABLED",
        "RAY_TMPDIR",
        "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S",
    )
    saved = {k: os.environ.get(k) for k in names}
    os.environ["PYTHONPATH"] = os.pathsep.join([*path, os.environ.get("PYTHONPATH", "")]).rstrip(
        os.pathsep
    )
    os.environ["OMP_NUM_THREADS"] = "1"
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    os.environ["RAY_TMPDIR"] = temp  # sessions and the address file: never /tmp/ray
    # Ray Train's controller polls its workers every 2 s by default, and a worker's report
    # waits until the poll took the one before: a loop reporting every batch would run one
    # batch per 2 s. TorchTrainer passes the driver's setting to the controller.
    os.environ["RAY_TRAIN_HEALTH_CHECK_INTERVAL_S"] = "0.5"
    node_args: dict[str, Any] = {
        "num_cpus": cpus,
        "object_store_memory": OBJECT_STORE_BYTES,
    }
    cluster = None
    try:
        cluster = Cluster(initialize_head=False)
        cluster.add_node(**node_args, include_dashboard=False)  # the head
        for _ in range(nodes - 1):
            cluster.add_node(**node_args)
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, log_to_driver=True)
        yield cluster
    finally:
        try:
            ray.shutdown()
        finally:
            if cluster is not None:
                cluster.shutdown()
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
            shutil.rmtree(temp, ignore_errors=True)
