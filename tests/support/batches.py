"""Batches compared exactly: the same structure, types, dtypes, shapes and values."""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._pytree import tree_flatten


def assert_same(a: Any, b: Any) -> None:
    """``a`` and ``b`` (nested dicts, lists, tensors, numbers, strings) are the same batch."""
    fa, sa = tree_flatten(a)
    fb, sb = tree_flatten(b)
    assert sa == sb
    for x, y in zip(fa, fb, strict=True):
        assert type(x) is type(y)
        if isinstance(x, torch.Tensor):
            assert x.dtype == y.dtype and x.shape == y.shape and torch.equal(x, y)
        else:
            assert x == y
