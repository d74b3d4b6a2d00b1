"""A text stream as a filter column: the strings each episode's records hold (``task``).

A text stream's blob is the same bytes in every episode whose records are the same (times are
relative to the first record), so the manifest's blob hashes already say which episodes share
their tasks. :func:`text_column` reads one blob per distinct blob the episodes hold, and a
comparison is evaluated once per distinct blob, then spread to the episodes by their blob's
index: a million episodes over a hundred tasks cost a hundred small reads and one gather.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from rayform._textfmt import decode_text
from rayform.manifest import BlobRef, Segments

__all__ = ["TextColumn", "text_column"]

#: Reads a blob's verified bytes (the slice's cache, or the server's data root).
ReadBlob = Callable[[BlobRef], bytes]


@dataclass(frozen=True)
class TextColumn:
    """The strings of one text stream per episode.

    Attributes:
        codes: ``int32 (S,)``: index into ``contents`` of each episode's blob, ``-1`` where
            the episode lacks the stream.
        contents: per distinct blob, the distinct ``content`` of its records.
    """

    codes: np.ndarray
    contents: Sequence[frozenset[str]]

    def __len__(self) -> int:
        return len(self.codes)

    def any_of(self, values: Sequence[str], negate: bool) -> np.ndarray:
        """``(S,) bool``: episodes with a record whose content is one of ``values``; with
        ``negate``, episodes that have the stream and no such record."""
        want = set(values)
        hit = np.array([bool(want & c) for c in self.contents], dtype=bool)
        present = self.codes >= 0
        per_episode = hit[np.where(present, self.codes, 0)] if len(hit) else present & False
        return (present & ~per_episode) if negate else (present & per_episode)


def text_column(segments: Segments, stream: str, read_blob: ReadBlob) -> TextColumn:
    """The strings of ``stream`` in ``segments``, reading each distinct blob they hold once.

    Blobs of the manifest that none of ``segments`` holds (outside a selection) are not read.
    """
    blobs, codes = segments.blob_codes(stream)
    used = np.flatnonzero(np.bincount(codes[codes >= 0], minlength=len(blobs)))
    contents: list[frozenset[str]] = [frozenset()] * len(blobs)
    for i in used.tolist():
        ref = blobs[i]
        _, records = decode_text(read_blob(ref), what=f"text blob {ref.hash[:12]}")
        contents[i] = frozenset(r["content"] for r in records if r["content"] is not None)
    return TextColumn(codes, contents)
