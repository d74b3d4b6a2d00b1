"""The display and export side of the segment model: what any table of segments derives from
its columns.

:class:`SegmentColumns` is a ``Sequence[Segment]`` with column methods (``ids()``, ``sites()``,
``column()``, ``stream_name_lists()``, ``segment_nbytes()``), and from them a short repr, a
paged HTML table for notebooks, :meth:`~SegmentColumns.to_arrow` and
:meth:`~SegmentColumns.to_pandas`. :class:`~rayform.manifest._segments.Segments` (the one model,
for both manifest versions) supplies the columns.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from rayform import _html
from rayform.manifest._arrow import load as pyarrow
from rayform.manifest._model import Segment
from rayform.units import human_bytes

__all__ = ["PAGE_ROWS", "SegmentColumns"]

#: Rows of one page of the HTML table (the next page is a slice: ``segments[20:40]``).
PAGE_ROWS = 20
_SHOWN_IDS = 3


class SegmentColumns(Sequence[Segment]):
    """The segments of a slice (or of a ``select()`` view), in manifest order.

    Index it for one :class:`~rayform.manifest._model.Segment` (a slice ``[a:b]`` gives segments
    again); the column methods read every segment at once without building them.
    """

    __slots__ = ()

    # -- columns (each kind of manifest supplies these) -----------------------------------
    def ids(self) -> Any:
        """The segment IDs, an Arrow ``string`` array."""
        raise NotImplementedError

    def sites(self) -> Any:
        """The sites, an Arrow ``string`` array."""
        raise NotImplementedError

    def column(self, name: str) -> np.ndarray:
        """A segment column (``version``, ``start_ns``, ``end_ns``) as ``(S,)`` numpy."""
        raise NotImplementedError

    def stream_name_lists(self) -> Any:
        """The stream names of each segment, sorted: an Arrow ``list<string>`` array."""
        raise NotImplementedError

    def segment_nbytes(self) -> np.ndarray:
        """``int64 (S,)``: the stored bytes of each segment (every blob of every stream)."""
        raise NotImplementedError

    # -- shared ----------------------------------------------------------------------------
    def to_arrow(self) -> Any:
        """A ``pyarrow.Table``, one row per segment: ``id``, ``version``, ``site``, ``start``
        and ``end`` (``timestamp[ns, UTC]``), ``duration_s``, ``nbytes`` and ``streams``
        (``list<string>``)."""
        pa = pyarrow()
        start, end = self.column("start_ns"), self.column("end_ns")
        stamp = pa.timestamp("ns", tz="UTC")
        return pa.table(
            {
                "id": self.ids(),
                "version": pa.array(self.column("version").astype(np.int64)),
                "site": self.sites(),
                "start": pa.array(start.astype(np.int64)).cast(stamp),
                "end": pa.array(end.astype(np.int64)).cast(stamp),
                "duration_s": pa.array((end - start) / 1e9),
                "nbytes": pa.array(self.segment_nbytes().astype(np.int64)),
                "streams": self.stream_name_lists(),
            }
        )

    def to_pandas(self) -> Any:
        """:meth:`to_arrow` as a ``pandas.DataFrame``.

        Raises:
            ImportError: pandas is not installed (it is not a Rayform dependency).
        """
        try:
            import pandas  # noqa: F401  (optional: only this method needs it)
        except ImportError:
            raise ImportError(
                "segments.to_pandas() needs pandas, which rayform does not install: "
                "pip install pandas (or use segments.to_arrow())"
            ) from None
        return self.to_arrow().to_pandas()

    def __repr__(self) -> str:
        n = len(self)
        ids = [str(self[i].id) for i in range(min(n, _SHOWN_IDS))]
        if n > _SHOWN_IDS + 1:
            ids += ["...", str(self[n - 1].id)]
        elif n == _SHOWN_IDS + 1:
            ids.append(str(self[n - 1].id))
        return f"<{type(self).__name__} {n:,} segments [{', '.join(ids)}]>"

    def _repr_html_(self) -> str:
        n = len(self)
        shown = min(n, PAGE_ROWS)
        rows = []
        for i in range(shown):
            seg = self[i]
            rows.append(
                (
                    seg.id,
                    seg.version,
                    seg.site,
                    _html.utc(seg.start_ns),
                    f"{seg.duration_s:.2f}",
                    human_bytes(seg.nbytes),
                    ", ".join(sorted(seg.streams)),
                )
            )
        total_s = float((self.column("end_ns") - self.column("start_ns")).sum()) / 1e9 if n else 0.0
        title = _html.header(f"{n:,} segments", f"{total_s:.1f} s in all")
        body = _html.table(
            ("ID", "version", "site", "start", "duration (s)", "size", "streams"), rows
        )
        if n > shown:
            note = (
                f"rows 1-{shown} of {n:,}; next page: <code>segments[{shown}:{shown + PAGE_ROWS}]"
                "</code>; every row: <code>segments.to_pandas()</code>"
            )
        else:
            note = f"{n:,} rows"
        return _html.wrap(title, body, f'<div style="font-size:85%">{note}</div>')
