"""A mixture's batch in one pass: every source's share read together, frames into the batch.

``MixtureDataset.__getitems__`` resolves its draws to ``(source, index, epoch, repeat)``;
:func:`read_draws` reads every source's share of the batch in one
:func:`~rayform.torch.dataset.read_together` call (their frames decoded and resized together),
then tags each sample with its source and puts it in the mixture's layout.

Where the batch is collated as read (``__getitems__``) and every source of the batch is an
``EpisodeDataset`` without a transform, with one observation step, each camera key whose
frames have one size in every source goes straight into one ``(B, 3, H, W)`` tensor
(:func:`~rayform.torch._collate.batch_tensor`: in a DataLoader worker, the batch's
shared-memory slot, which ``collate`` keeps in place), sample ``j`` holding row ``j``, as one
dataset's batch does; a source that lacks the camera (a layout's missing camera) gets zero
rows. The same values as the layout's own zero image: the batch is the same.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from rayform.torch._collate import batch_rows, batch_tensor
from rayform.torch._layout import Layout
from rayform.torch.dataset import EpisodeDataset, read_together

__all__ = ["read_draws"]

#: ``apply(k, sample)``: source ``k``'s sample in the mixture's layout.
Apply = Callable[[int, dict[str, Any]], dict[str, Any]]


def read_draws(
    sources: Sequence[Any],
    names: Sequence[str],
    src: np.ndarray,
    keys: list[tuple[int, int, int]],
    apply: Apply | None,
    layout: Layout | None,
    batched: bool,
) -> list[dict[str, Any]]:
    """Samples of draws ``keys`` (``(index in the source, epoch, repeat)``) of sources ``src``
    (``(N,)``), in order; ``apply`` puts a sample in the ``layout`` (``None``: no layout);
    ``batched``: collated in this order (``__getitems__``)."""
    shares = [(k, np.flatnonzero(src == k)) for k in np.unique(src).tolist()]
    parts = [(sources[k], [keys[j] for j in where.tolist()]) for k, where in shares]
    placed: dict[str, Sequence[torch.Tensor]] = {}
    if all(isinstance(ds, EpisodeDataset) for ds, _ in parts):
        if batched:
            placed = _camera_rows(
                [ds for ds, _ in parts], layout, len(src), [where for _, where in shares]
            )
        given = [
            _given(ds, where, placed) for (_, where), (ds, _) in zip(shares, parts, strict=True)
        ]
        read = read_together(parts, given=given)
    else:  # a nested mixture (or a user's dataset) reads its own share
        read = [ds.__getitems__(share) for ds, share in parts]
    out: list[dict[str, Any]] = [{}] * len(src)
    for (k, where), samples in zip(shares, read, strict=True):
        for j, sample in zip(where.tolist(), samples, strict=True):
            sample["meta"] = {**sample["meta"], "source": int(k), "source_name": names[k]}
            out[j] = sample if apply is None else apply(k, sample)
    for key, rows in placed.items():  # a camera a source lacks: its zero row, not the layout's
        for j, sample in enumerate(out):
            sample[key] = rows[j]
    return out


def _camera_rows(
    sources: Sequence[EpisodeDataset],
    layout: Layout | None,
    size: int,
    wheres: Sequence[np.ndarray],
) -> dict[str, Sequence[torch.Tensor]]:
    """Camera key -> the rows of its ``(size, 3, H, W)`` batch tensor, for each camera whose
    frames have one size in every source of the batch (and in the layout, where one lacks
    it); the rows of sources that lack it (``wheres[k]``: source ``k``'s rows) are zero."""
    if any(ds.spec.transform is not None or ds.obs_steps > 1 for ds in sources):
        return {}
    specs = [ds.sample_spec() for ds in sources]
    shapes: dict[str, set[tuple[int, ...]]] = {}
    for spec in specs:
        for key, (dtype, shape) in spec.items():
            if dtype == "uint8" and len(shape) == 3:
                shapes.setdefault(key, set()).add(tuple(shape))
    out: dict[str, Sequence[torch.Tensor]] = {}
    for key, sizes in shapes.items():
        field = layout.fields.get(key) if layout is not None else None
        everywhere = all(key in spec for spec in specs)
        if len(sizes) != 1 or not (everywhere or (field is not None and field.shape in sizes)):
            continue
        tensor = batch_tensor((size, *sizes.pop()))
        for spec, where in zip(specs, wheres, strict=True):
            if key not in spec:  # the other rows are overwritten by the frames
                tensor.numpy()[where] = 0  # (torch's index_put: 20x slower here)
        out[key] = batch_rows(tensor)
    return out


def _given(
    ds: EpisodeDataset, where: np.ndarray, placed: dict[str, Sequence[torch.Tensor]]
) -> dict[str, Sequence[torch.Tensor]]:
    """Camera stream of ``ds`` -> the batch rows of its share ``where``."""
    rows = where.tolist()
    return {
        stream: [placed[key][j] for j in rows]
        for key, stream in ds.obs_keys.items()
        if key in placed
    }
