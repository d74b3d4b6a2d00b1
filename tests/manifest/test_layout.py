"""A stream's column read as a strided view (every segment lists the same streams) equals the
column read through the stream rows' mask (any manifest)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from support import DEMO_SLICE

from rayform.manifest import Segment, Segments
from rayform_server.store import Store


def _expected(segs: list[Segment], name: str, rows: list[int]) -> tuple[np.ndarray, np.ndarray]:
    present = np.array([name in segs[i].streams for i in rows])
    t0 = np.array([segs[i].streams[name].t0_ns if name in segs[i].streams else 0 for i in rows])
    return present, t0


@pytest.mark.parametrize("shape", ["regular", "one-missing", "reordered-selection"])
def test_stream_field_and_names_from_either_path(demo_root: Path, shape: str) -> None:
    store = Store(demo_root)
    segs = list(store.load_manifest(store.get_slice(DEMO_SLICE)["manifest"]).segments)
    names = sorted(segs[0].streams)
    if shape == "one-missing":
        gone = names[1]
        segs[2] = replace(segs[2], streams={k: v for k, v in segs[2].streams.items() if k != gone})
    table = Segments(segs)
    rows = list(range(len(segs)))
    if shape == "reordered-selection":
        rows = [3, 0, 2]
        table = table.take(rows)
    assert table.stream_names() == sorted({n for i in rows for n in segs[i].streams})
    for name in names:
        present, t0 = table.stream_field(name, "t0_ns")
        want_present, want_t0 = _expected(segs, name, rows)
        assert np.array_equal(present, want_present), name
        assert np.array_equal(t0[present], want_t0[want_present]), name
