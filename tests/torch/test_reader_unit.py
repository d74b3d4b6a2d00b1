"""Unit tests of the sample reader's helpers (no data needed)."""

from __future__ import annotations

import numpy as np
import pytest

from rayform.torch._reader import _unique_inverse


@pytest.mark.parametrize("size", [0, 1, 2, 7, 64, 65, 300])
def test_unique_inverse_is_numpys(size: int) -> None:
    # Both branches (plain Python up to 64 values, numpy above), with and without repeats,
    # sorted or not: the frames of a batch are fetched by these indices.
    rng = np.random.default_rng(size)
    for high in (5, 10_000):
        for values in (rng.integers(0, high, size), np.sort(rng.integers(0, high, size))):
            unique, inverse = _unique_inverse(values)
            want_unique, want_inverse = np.unique(values, return_inverse=True)
            np.testing.assert_array_equal(unique, want_unique)
            np.testing.assert_array_equal(inverse, want_inverse)
            assert inverse.dtype == np.int64 and unique.dtype == values.dtype
            np.testing.assert_array_equal(unique[inverse], values)
