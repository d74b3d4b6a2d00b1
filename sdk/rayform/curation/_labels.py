"""``slice_.labels``: one version of a slice's episode labels, read-only, as rows and columns."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Mapping
from typing import Any, cast

import numpy as np

from rayform.curation._filter import Columns
from rayform.curation._textcols import ReadBlob
from rayform.manifest import Segments

__all__ = ["Labels", "table_changes"]


class Labels:
    """The labels of a slice's episodes, at one version (immutable; a write makes a new one).

    ``labels["seg_..."]`` is that episode's ``{key: value}`` (``{}`` if it has none);
    ``len(labels)`` counts labelled episodes; ``labels.kinds`` maps each key to its kind.

    Attributes:
        slice_id: the slice whose episodes it labels.
        manifest_hash: the manifest it annotates (labels never change the manifest's hash).
        version: 1, 2, ... (0: nobody has labelled this manifest yet).
        hash: BLAKE3 of the label set's canonical bytes (``None`` for version 0); a filtered
            view and a dataset URI pin it.
        kinds: key -> ``"bool"``, ``"number"``, ``"category"``, ``"text"`` or ``"tags"``.
    """

    def __init__(self, doc: Mapping[str, Any], digest: str | None, segments: Segments) -> None:
        self._doc = doc
        self.slice_id = str(doc["slice"])
        self.manifest_hash = str(doc["manifest"])
        self.version = int(doc["version"])
        self.hash = digest
        self.kinds: dict[str, str] = dict(doc["kinds"])
        self._episodes: Mapping[str, Mapping[str, Any]] = doc["episodes"]
        self._root = segments
        self._full: dict[str, Any] = {}

    # -- rows ------------------------------------------------------------------------------
    def __getitem__(self, episode: str) -> dict[str, Any]:
        return dict(self._episodes.get(episode, {}))

    def get(self, episode: str, key: str, default: object = None) -> Any:
        """The value of ``key`` on ``episode``, or ``default``."""
        return self._episodes.get(episode, {}).get(key, default)

    def __contains__(self, episode: object) -> bool:
        return episode in self._episodes

    def __len__(self) -> int:
        return len(self._episodes)

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._episodes))

    def items(self) -> Iterator[tuple[str, dict[str, Any]]]:
        """``(episode ID, {key: value})`` of every labelled episode, by ID."""
        for episode in sorted(self._episodes):
            yield episode, dict(self._episodes[episode])

    def spans(self, episode: str, key: str) -> list[tuple[int, int, str]]:
        """The time ranges of a spans label on ``episode``: ``(t0_ns, t1_ns, name)``, half-open,
        ns since the Unix epoch, sorted (``[]`` if it has none)."""
        return [
            (int(a), int(b), str(n)) for a, b, n in self._episodes.get(episode, {}).get(key, [])
        ]

    def history(self) -> list[dict[str, Any]]:
        """Every version up to this one: ``{"version", "by", "at", "episodes", "keys"}`` (who
        wrote, when in UTC, how many episodes that write changed and which keys), oldest first."""
        return [dict(e) for e in self._doc["history"]]

    @property
    def parent(self) -> str | None:
        """The hash of the version this one was written over (``None`` for version 1)."""
        parent = self._doc["parent"]
        return None if parent is None else str(parent)

    def to_json(self) -> dict[str, Any]:
        """The whole label set as a JSON-able dict (the document its hash names)."""
        return {k: v for k, v in self._doc.items()}

    # -- columns ---------------------------------------------------------------------------
    def to_arrow(self) -> Any:
        """A ``pyarrow.Table``: ``episode`` (string) and one column per key (``bool``,
        ``double``, ``string``, ``list<string>`` or, for spans,
        ``list<struct<t0_ns, t1_ns, name>>``; null where an episode has no value), one row per
        labelled episode, by episode ID."""
        import pyarrow as pa  # noqa: PLC0415  (lazily: `import rayform` stays light)

        episodes = sorted(self._episodes)
        span = pa.struct([("t0_ns", pa.int64()), ("t1_ns", pa.int64()), ("name", pa.string())])
        types = {
            "bool": pa.bool_(),
            "number": pa.float64(),
            "tags": pa.list_(pa.string()),
            "spans": pa.list_(span),
        }
        cols: dict[str, Any] = {"episode": pa.array(episodes, pa.string())}
        for key in sorted(self.kinds):
            kind = self.kinds[key]
            values = [self._episodes[e].get(key) for e in episodes]
            if kind == "spans":
                values = [
                    None
                    if v is None
                    else [dict(zip(("t0_ns", "t1_ns", "name"), s, strict=True)) for s in v]
                    for v in values
                ]
            cols[key] = pa.array(values, types.get(kind, pa.string()))
        return pa.table(cols)

    def to_pandas(self) -> Any:
        """:meth:`to_arrow` as a ``pandas.DataFrame`` indexed by episode.

        Raises:
            ImportError: pandas is not installed (it is not a Rayform dependency).
        """
        try:
            import pandas  # noqa: F401, PLC0415  (optional: only this method needs it)
        except ImportError:
            raise ImportError(
                "labels.to_pandas() needs pandas, which rayform does not install: "
                "pip install pandas (or use labels.to_arrow())"
            ) from None
        return self.to_arrow().to_pandas().set_index("episode")

    def columns(self, segments: Segments, read_blob: ReadBlob | None = None) -> Columns:
        """What a filter reads over ``segments`` (the slice's or a selection's): their episode
        fields and, per key, a column of these labels in their order (built once per key for
        the whole slice, then taken at the segments' positions); ``read_blob`` reads the
        ``task`` field's text blobs."""
        positions = segments.positions()
        makers: dict[str, tuple[str, Callable[[], Any]]] = {}
        for key, kind in self.kinds.items():
            makers[key] = (kind, functools.partial(self._take, key, kind, positions))
        return Columns(segments, makers, read_blob)

    def _take(self, key: str, kind: str, positions: np.ndarray) -> Any:
        full = self._full.get(key)
        if full is None:
            full = self._full[key] = self._column(key, kind)
        if isinstance(full, np.ndarray):
            return full[positions]
        import pyarrow as pa  # noqa: PLC0415

        return full.take(pa.array(positions, pa.int64()))

    def _column(self, key: str, kind: str) -> Any:
        """The whole slice's column of ``key``, in manifest order."""
        ids = [e for e, row in self._episodes.items() if key in row]
        values = [self._episodes[e][key] for e in ids]
        pos = self._root.find(ids) if ids else np.zeros(0, dtype=np.int64)
        keep = pos >= 0  # a label on an episode the manifest lacks is never kept (and never sent)
        pos = pos[keep]
        values = [v for v, k in zip(values, keep, strict=True) if k]
        n = len(self._root)
        if kind == "number":
            num = np.full(n, np.nan)
            num[pos] = np.asarray(values, dtype=np.float64)
            return num
        if kind == "bool":
            flag = np.full(n, -1, dtype=np.int8)
            flag[pos] = np.asarray(values, dtype=np.int8)
            return flag
        import pyarrow as pa  # noqa: PLC0415

        full: list[Any] = [None] * n
        for p, v in zip(pos.tolist(), values, strict=True):
            full[p] = v
        if kind == "spans":  # a filter reads their names: 'grasp_failed' in events
            full = [None if v is None else sorted({s[2] for s in v}) for v in full]
        return pa.array(full, pa.list_(pa.string()) if kind in ("tags", "spans") else pa.string())

    def _repr_html_(self) -> str:
        """The notebook display: the version, who wrote it, and the first 20 labelled episodes."""
        import html  # noqa: PLC0415  (only notebooks ask)

        head = html.escape(repr(self))
        keys = sorted(self.kinds)
        rows = [
            "<tr><td><code>"
            + html.escape(e)
            + "</code></td>"
            + "".join(f"<td>{html.escape(str(row.get(k, '')))[:200]}</td>" for k in keys)
            + "</tr>"
            for e, row in list(self.items())[:20]
        ]
        more = f"<p>... {len(self) - 20} more episodes</p>" if len(self) > 20 else ""
        header = "".join(f"<th>{html.escape(k)} ({self.kinds[k]})</th>" for k in keys)
        return (
            f"<div><p>{head}</p><table><tr><th>episode</th>{header}</tr>"
            + "".join(rows)
            + f"</table>{more}</div>"
        )

    def __repr__(self) -> str:
        if self.version == 0:
            return f"<Labels of {self.slice_id}: none yet (manifest {self.manifest_hash[:12]})>"
        keys = ", ".join(f"{k}:{v}" for k, v in sorted(self.kinds.items()))
        last = self._doc["history"][-1]
        return (
            f"<Labels of {self.slice_id} v{self.version} {self.hash and self.hash[:12]}: "
            f"{len(self)} episodes, keys {keys or '-'}; last written by {last['by']} at {last['at']}>"
        )


def table_changes(given: object) -> dict[str, dict[str, Any]]:
    """``{episode: {key: value}}`` from what :meth:`rayform.Slice.label_all` accepts: such a
    dict, a ``pyarrow.Table`` or a ``pandas.DataFrame`` with an ``episode`` column (or index)
    and one column per key; nulls (``None``, ``NaN`` in pandas) are skipped, not removals."""
    from rayform.errors import InvalidArgumentError  # noqa: PLC0415

    values = cast(Any, given)  # a dict, a pyarrow.Table or a pandas.DataFrame (untyped)
    if isinstance(values, Mapping):
        return {str(k): dict(v) if isinstance(v, Mapping) else v for k, v in values.items()}
    if type(values).__module__.startswith("pandas"):
        frame = values
        if "episode" not in frame.columns and frame.index.name == "episode":
            frame = frame.reset_index()
        import pyarrow as pa  # noqa: PLC0415

        values = pa.Table.from_pandas(frame, preserve_index=False)
    if hasattr(values, "column_names") and hasattr(values, "to_pylist"):
        if "episode" not in values.column_names:
            raise InvalidArgumentError(
                f"a label table needs an 'episode' column of segment IDs; it has "
                f"{', '.join(values.column_names)}"
            )
        out: dict[str, dict[str, Any]] = {}
        for row in values.to_pylist():
            episode = row.pop("episode")
            kept = {k: v for k, v in row.items() if v is not None and v == v}  # NaN != NaN
            if kept:
                out.setdefault(str(episode), {}).update(kept)
        return out
    raise InvalidArgumentError(
        f"labels given as {type(values).__name__}: pass a dict {{episode: {{key: value}}}}, "
        "a pyarrow.Table or a pandas.DataFrame with an 'episode' column"
    )
