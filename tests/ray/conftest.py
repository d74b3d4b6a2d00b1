"""Fixtures only: one real local Ray cluster per test module (``support.raycluster``)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("ray", reason="the ray extra: pip install 'rayform[ray]'")

from support.raycluster import local_ray_cluster  # noqa: E402


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[Any]:
    """Two Ray nodes on loopback, 1 CPU each, connected for the module's tests."""
    with local_ray_cluster(nodes=2, cpus=1) as cluster:
        yield cluster
