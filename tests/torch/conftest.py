"""Fixtures shared by the dataset tests."""

from __future__ import annotations

from pathlib import Path

import pytest
from support import DEMO_SLICE
from support.fakes import store_slice

from rayform.slice import Slice
from rayform_server.store import Store


@pytest.fixture(scope="module")
def demo(demo_root: Path) -> Slice:
    """The small demo slice (96x128 all-intra cameras), read straight from its data root."""
    store = Store(demo_root)
    return store_slice(
        DEMO_SLICE, store.load_manifest(store.get_slice(DEMO_SLICE)["manifest"]), store
    )
