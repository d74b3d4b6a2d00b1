"""Train/validation split by episode, deterministic and stable as a slice grows.

Each segment ID is hashed with the seed (BLAKE3) to a number ``u`` in ``[0, 1)``; the segment
is in validation when ``u < val_fraction``. The decision for one segment depends only on its
ID, the seed and the fraction, never on the other segments, so adding segments to a slice
never moves an existing one from train to validation or back.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from rayform._hashing import hash_bytes
from rayform.errors import InvalidArgumentError
from rayform.manifest import Segments
from rayform.slice import Slice

if TYPE_CHECKING:
    from rayform.manifest import Segment

__all__ = ["split_episodes"]


def split_episodes(
    slice_or_segments: Slice | Segments | Iterable[str | Segment],
    val_fraction: float = 0.1,
    *,
    seed: int = 0,
) -> tuple[list[str], list[str]]:
    """Split episodes into train and validation segment IDs.

    Args:
        slice_or_segments: a :class:`~rayform.Slice`, or an iterable of segment IDs or
            :class:`~rayform.manifest.Segment` objects.
        val_fraction: expected fraction of episodes in validation, in ``[0, 1]``.
        seed: changes the split; the same seed always gives the same split.

    Returns:
        ``(train_ids, val_ids)``, each in the input order. Pass them as ``segments=`` to
        :class:`~rayform.torch.EpisodeDataset`.
    """
    if (
        isinstance(val_fraction, bool)
        or not isinstance(val_fraction, (int, float))
        or not 0 <= val_fraction <= 1
    ):
        raise InvalidArgumentError(
            f"val_fraction={val_fraction!r}: use a number between 0 and 1, e.g. 0.1"
        )
    items: Iterable[str | Segment]
    if isinstance(slice_or_segments, Slice):
        slice_or_segments = slice_or_segments.segments
    if isinstance(slice_or_segments, Segments):  # the ID column: no Segment object per episode
        items = [str(x) for x in slice_or_segments.ids().to_pylist()]
    else:
        items = slice_or_segments
    train: list[str] = []
    val: list[str] = []
    for item in items:
        seg_id = item if isinstance(item, str) else item.id
        digest = hash_bytes(f"rayform-split\0{int(seed)}\0{seg_id}".encode())
        u = int(digest[:16], 16) / float(1 << 64)
        (val if u < val_fraction else train).append(seg_id)
    return train, val
