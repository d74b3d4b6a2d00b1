"""``Slice``: an immutable, resolved selection of segments, bound to the client that resolved it."""

from __future__ import annotations

import html
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from rayform._boundary import argument_errors
from rayform._ids import HASH_RE, check_stream_names
from rayform._resolution import (
    camera_streams,
    check_image_size,
    check_size_value,
    resolution_blobs,
)
from rayform._seams import BlobFetcher
from rayform.curation import (
    LabelHost,
    Labels,
    check_changes,
    check_spans_within,
    lineage_of,
    table_changes,
    view_rows,
)
from rayform.errors import InvalidArgumentError
from rayform.manifest import (
    BlobRef,
    ColumnarManifest,
    Manifest,
    Segment,
    Segments,
    segment_not_found,
    segments_of,
)
from rayform.units import human_bytes

if TYPE_CHECKING:
    from rayform.view import ViewLink

__all__ = ["Slice"]


class Slice:
    """A slice resolved to its manifest, or a selection of it (:meth:`select`).

    Attributes:
        id: the slice ID, e.g. ``"slc_7c1e04aa"`` (a selection keeps its parent's ID).
        manifest_hash: BLAKE3 of the manifest this slice points at (pins the exact content).
        manifest: the parsed manifest (a memory-mapped :class:`~rayform.manifest.ColumnarManifest`, or an
            in-memory :class:`~rayform.manifest.Manifest`).
        client: the :class:`~rayform.Client` used to fetch its blobs (any
            :class:`~rayform._seams.BlobFetcher`).
        parent: the slice this one was selected from (``None`` for a whole slice).
        selection: the arguments of :meth:`select` that made this view (``None`` for a whole
            slice), JSON-able, so a tracker can reproduce it.
    """

    def __init__(
        self,
        slice_id: str,
        manifest_hash: str,
        manifest: Manifest | ColumnarManifest,
        client: BlobFetcher,
        *,
        rows: np.ndarray | None = None,
        parent: Slice | None = None,
        selection: dict[str, Any] | None = None,
    ) -> None:
        self.id = slice_id
        self.manifest_hash = manifest_hash
        self.manifest = manifest
        self.client = client
        self.parent = parent
        self.selection = selection
        self._rows = rows
        self._segments: Segments | None = None
        #: The labels this slice last read or wrote: what its next write names as its base.
        self._seen: Labels | None = None

    def __getstate__(self) -> dict[str, Any]:
        # The labels last read stay in this process: a DataLoader worker never labels, and a
        # fleet slice's label set is megabytes that every worker would receive.
        return {**self.__dict__, "_seen": None}

    # -- contents --------------------------------------------------------------------------
    @property
    def segments(self) -> Segments:
        """Every segment (episode) in manifest order: a :class:`~rayform.Segments` table.

        A ``Sequence[Segment]`` with column methods (``ids()``, ``sites()``, ``column()``,
        ``summary()``...), ``to_arrow()``, ``to_pandas()`` and a paged table as its notebook
        repr, the same whatever the manifest's version: indexing gives a
        :class:`~rayform.Segment` (built from its page row only when one is indexed).
        """
        if self._segments is None:
            if self._rows is None:
                self._segments = segments_of(self.manifest)
            else:
                base = (
                    self.parent.segments if self.parent is not None else segments_of(self.manifest)
                )
                self._segments = base.take(self._rows)
        return self._segments

    @property
    def streams(self) -> list[str]:
        """Sorted names of every stream present in at least one segment."""
        return list(self.segments.summary()["streams"])

    @property
    def nbytes(self) -> int:
        """Total stored size of every blob, in bytes."""
        return int(self.segments.summary()["nbytes"])

    @property
    def duration_s(self) -> float:
        """Sum of segment durations in seconds."""
        return self.segments.duration_ns() / 1e9

    def segment(self, segment_id: str) -> Segment:
        """The segment with this ID; :class:`NotFoundError` if the slice has none."""
        segs = self.segments
        pos = int(segs.find([segment_id])[0])
        if pos < 0:
            raise segment_not_found(self.id, segment_id)
        return segs[pos]

    def blobs(
        self,
        streams: Sequence[str] | None = None,
        *,
        image_size: tuple[int, int] | dict[str, tuple[int, int]] | None = None,
        resize: str = "pad",
    ) -> dict[str, BlobRef]:
        """The distinct blobs of this slice's segments (a view's only), by hash, for the named
        streams (all if ``None``).

        With ``image_size`` (and ``resize``), the blobs ``EpisodeDataset(image_size=...,
        resize=...)`` reads: for each camera the stored rendition it chooses (the original
        where none covers the size) and never the other videos, as ``pull(image_size=...)``
        fetches them. Without, every original (renditions are not listed).
        """
        names = check_stream_names(streams) if streams is not None else None
        names = names or None  # an empty list: every stream, as before
        segs = self.segments
        if image_size is not None and segs.has_renditions:
            return resolution_blobs(segs, names, image_size, resize)
        if image_size is not None:  # no rendition to choose: the originals, the sizes checked
            check_image_size(image_size, resize, camera_streams(segs, names))
        check_size_value(image_size, resize)
        return segs.blobs(names)

    def stream_nbytes(
        self,
        streams: Sequence[str] | None = None,
        *,
        image_size: tuple[int, int] | dict[str, tuple[int, int]] | None = None,
        resize: str = "pad",
    ) -> int:
        """Bytes needed to hold the named streams (all if ``None``); with ``image_size``, to
        train on them at that resolution (the renditions a dataset reads, see :meth:`blobs`)."""
        return sum(
            b.size for b in self.blobs(streams, image_size=image_size, resize=resize).values()
        )

    def tasks(self, stream: str = "task") -> list[tuple[str, int]]:
        """The distinct strings of a text stream (its tasks, by default) and how many segments
        hold each, most first (ties in alphabetical order).

        Reads one blob per distinct blob of the stream (fetched into the cache if missing):
        a task's blob is the same bytes in every episode it holds for, so a slice of a million
        episodes and a hundred tasks reads a hundred small blobs. A segment holding a string
        in several records counts once for it. Empty when no segment has the stream.

        Raises:
            InvalidArgumentError: ``stream`` is in the slice but is not a text stream.
        """
        from rayform._textfmt import decode_text  # beside its only reader in this module

        check_stream_names([stream])
        kinds = self.segments.stream_values(stream, "kind")
        if kinds and kinds != {"text"}:
            raise InvalidArgumentError(
                f"stream {stream!r} of slice {self.id} is a {'/'.join(sorted(kinds))} stream, not "
                f"text; its text streams: {self.text_streams() or 'none'}"
            )
        counts: dict[str, int] = {}
        for ref, n in self.segments.blob_counts(stream):
            _, records = decode_text(
                self.blob_path(ref).read_bytes(), what=f"text blob {ref.hash[:12]}"
            )
            for content in dict.fromkeys(r["content"] for r in records if r["content"] is not None):
                counts[content] = counts.get(content, 0) + n
        return sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))

    def text_streams(self) -> list[str]:
        """Sorted names of the slice's text streams (``kind == "text"``)."""
        info = self.segments.summary()["streams"]
        return sorted(name for name, d in info.items() if d["kind"] == "text")

    @argument_errors
    def select(
        self,
        *,
        segments: Sequence[str] | None = None,
        sites: Sequence[str] | None = None,
        start_ns: int | None = None,
        end_ns: int | None = None,
        where: str | Callable[[dict[str, np.ndarray]], np.ndarray] | None = None,
        labels: Labels | str | None = None,
    ) -> Slice:
        """A view of some of this slice's segments, without copying the manifest.

        Every argument narrows the selection (they combine with *and*); manifest order is kept.

        Args:
            segments: segment IDs to keep.
            sites: sites to keep, e.g. ``["lab-zurich"]``.
            start_ns: keep segments that end at or after this time (ns, Unix epoch).
            end_ns: keep segments that start before this time (ns): with ``start_ns``, the
                segments that overlap ``[start_ns, end_ns)``.
            where: a filter on episode fields and labels, as text (data: recorded in the view
                and pinned in a dataset URI with the labels' version), e.g.
                ``"success and quality >= 0.7 and site in ['lab-zurich']"``
                (docs/curation.md); or a Python predicate on segment columns: called with a
                dict of ``(S,)`` numpy arrays (``version``, ``start_ns``, ``end_ns``,
                ``duration_ns``; ``id`` and ``site`` as object arrays only if the predicate
                asks for them) and returning a ``(S,)`` bool mask, e.g.
                ``lambda c: c["version"] >= 2`` (code: a URI then lists the episodes).
            labels: the labels a text filter reads: a :class:`~rayform.curation.Labels`
                version, a label-set hash, or ``None`` for the latest (:attr:`labels`).

        Returns:
            A :class:`Slice` with the same ``id`` and ``manifest_hash``, whose ``parent`` is
            this slice and whose ``selection`` records these arguments.

        Raises:
            NotFoundError: a listed segment ID is not in this slice.
            InvalidArgumentError: a bad argument, or a selection that keeps no segment.
        """
        if labels is not None and not isinstance(labels, (Labels, str)):
            raise InvalidArgumentError(
                f"labels={labels!r}: pass slice_.labels, a label-set hash, or None for the latest"
            )
        pinned = labels

        def read_labels() -> Labels:
            if isinstance(pinned, Labels):
                return pinned
            return self.labels if pinned is None else self._read_labels(pinned)

        rows, selection = view_rows(
            self.segments,
            self.id,
            segments=segments,
            sites=sites,
            start_ns=start_ns,
            end_ns=end_ns,
            where=where,
            labels=read_labels,
            read_blob=lambda ref: self.blob_path(ref).read_bytes(),
        )
        if self.selection is not None:
            selection = {"within": self.selection, **selection}
        root = self.parent if self.parent is not None else self
        return Slice(
            self.id,
            self.manifest_hash,
            self.manifest,
            self.client,
            rows=rows,
            parent=root,
            selection=selection,
        )

    # -- labels ----------------------------------------------------------------------------
    def _root(self) -> Slice:
        return self.parent if self.parent is not None else self

    def _label_host(self) -> LabelHost:
        if not isinstance(self.client, LabelHost):
            raise InvalidArgumentError(
                f"{self.client!r} keeps no labels: resolve the slice with rayform.Client()"
            )
        return self.client

    def _read_labels(self, digest: str | None) -> Labels:
        root = self._root()
        remote = self._label_host().label_remote()
        labels = remote.read(root.id, root.manifest_hash, root.segments, digest)
        root._seen = labels
        return labels

    @property
    def labels(self) -> Labels:
        """The latest labels on this slice's episodes (one small request online; the version
        last pulled, offline): a :class:`~rayform.curation.Labels` (``labels[episode]``,
        ``.version``, ``.history()``, ``.to_arrow()``, ``.to_pandas()``).

        Raises:
            OfflineError: offline and the labels were never pulled into this cache.
        """
        return self._read_labels(None)

    def labels_at(self, digest: str) -> Labels:
        """The label set ``digest`` (a version's :attr:`~rayform.curation.Labels.hash`) on this
        slice's manifest: from the cache when it holds it (offline too), else from the server.

        Raises:
            InvalidArgumentError: ``digest`` is not a label-set hash (64 hex digits).
            NotFoundError: the server has no such label set for this slice.
            OfflineError: offline and that version is not cached (``rayform pull`` caches the
                latest).
        """
        if not isinstance(digest, str) or not HASH_RE.fullmatch(digest):
            raise InvalidArgumentError(
                f"labels_at({digest!r}): pass a label set's hash (64 hex digits), e.g. "
                "slice_.labels.hash"
            )
        return self._read_labels(digest)

    @argument_errors
    def label(
        self, episode: str, /, *, kinds: dict[str, str] | None = None, **values: object
    ) -> Labels:
        """Label one episode, e.g. ``slice_.label(ep, success=True, quality=0.8,
        tags=["regrasp"])``; a value ``None`` removes that label. Needs a write token.

        The write names the labels version this slice last read (:attr:`labels`, or its last
        write; the latest if it never read any) and the server merges it per episode and key:
        it is refused with a :class:`~rayform.errors.ConflictError` only if someone changed
        one of these keys of this episode to another value since (docs/curation.md).

        Args:
            episode: the segment ID.
            kinds: kinds of new keys, e.g. ``{"note": "text"}`` (default: from the value;
                strings are ``category``).
            **values: key -> bool, number, string or list of strings (tags), or ``None``.

        Returns:
            The new :class:`~rayform.curation.Labels` version.
        """
        return self.label_all({episode: values}, kinds=kinds)

    @argument_errors
    def label_all(self, values: object, *, kinds: dict[str, str] | None = None) -> Labels:
        """Label many episodes in one write (one new version): ``values`` is a dict
        ``{episode: {key: value}}``, or a ``pyarrow.Table`` / ``pandas.DataFrame`` with an
        ``episode`` column and one column per key (nulls are skipped). Merged as
        :meth:`label` is; at most 200,000 values per write.

        Returns:
            The new :class:`~rayform.curation.Labels` version.
        """
        changes = table_changes(values)
        check_changes(changes, {}, kinds)  # malformed values fail before any request
        root = self._root()
        # The version this write builds on: the one last read or written here, else the
        # latest (a slice that never looked sets what it sets; one that read is told if
        # someone changed those labels since).
        seen = root._seen if root._seen is not None else self._read_labels(None)
        # A kind that does not match, or a time range outside its episode, before sending.
        checked, after = check_changes(changes, seen.kinds, kinds)
        check_spans_within(checked, after, root.segments)
        remote = self._label_host().label_remote()
        base = seen.hash
        labels = remote.write(root.id, root.manifest_hash, root.segments, base, changes, kinds)
        root._seen = labels
        return labels

    @property
    def lineage(self) -> dict[str, Any] | None:
        """For a slice published from a selection (``client.slices.create``): ``{"parent",
        "parent_manifest", "select", "labels"}`` (the parent slice and manifest, the
        selection as a ``select=`` expression, the label set its filter read); else ``None``."""
        doc = getattr(self.manifest, "doc", None)
        return lineage_of(doc)

    # -- data ------------------------------------------------------------------------------
    @property
    def cache_dir(self) -> Path | None:
        """The cache directory its blobs are fetched into (files derived from them, such as
        dataset statistics, are kept there too), or ``None`` if there is none."""
        return self.client.cache_dir

    def blob_path(self, ref: BlobRef) -> Path:
        """Local path of a verified blob of this slice, fetching it into the cache if needed.

        Raises:
            OfflineError: offline mode and the blob is not cached.
        """
        return self.client.ensure_blob(self.id, ref)

    @property
    def cache_limit(self) -> int | None:
        """Bytes its client's cache may hold (``Client(cache_limit=...)``), or ``None``."""
        return self.client.cache_limit

    def would_fetch(self, ref: BlobRef) -> bool:
        """True if :meth:`blob_path` would download ``ref`` now (online and not cached)."""
        return self.client.would_fetch(ref)

    def expect_blobs(self, refs: Sequence[BlobRef]) -> None:
        """Say that :meth:`blob_path` will be asked for these blobs soon, so that the client
        can ask the server for their download URLs together. A hint only: nothing is fetched,
        and a client without the hint is fine."""
        expect = getattr(self.client, "expect_blobs", None)
        if expect is not None:
            expect(self.id, refs)

    def pull(
        self, streams: Sequence[str] | None = None, *, jobs: int = 8, progress: bool = False
    ) -> Any:
        """Prefetch every blob of the named streams (all if ``None``) into the cache; a
        :meth:`select` view pulls only its own segments' blobs.

        Returns:
            The :class:`~rayform.PullReport` (blobs and bytes fetched, already cached).
        """
        return self.client.pull(self, streams=streams, jobs=jobs, progress=progress)

    # -- display ---------------------------------------------------------------------------
    def show(self, *, host: str = "127.0.0.1", port: int = 0) -> ViewLink:
        """Look at this slice (or this ``select()`` view) in a web browser: starts the
        ``rayform view`` server from a thread (docs/view.md).

        Args:
            host: address to listen on (default: this machine only).
            port: TCP port; 0 takes a free one.

        Returns:
            A :class:`rayform.view.ViewLink`: Jupyter displays it as the link; ``.url`` is the
            page (with its key), ``.stop()`` ends the server.
        """
        # Imported here: the viewer (and its pyarrow.compute) loads only when asked for. The
        # viewer knows slices only as a ViewSource (rayform._seams): the import is one way.
        from rayform.view import show

        return show(self, host=host, port=port)

    def __len__(self) -> int:
        return len(self.segments)

    def __repr__(self) -> str:
        sel = f" selection={self.selection}" if self.selection is not None else ""
        lineage = self.lineage
        if lineage is not None:
            sel += f" from={lineage['parent']} select={lineage['select']!r}"
        return (
            f"<Slice {self.id} manifest={self.manifest_hash[:12]} segments={len(self.segments)} "
            f"streams={self.streams} size={human_bytes(self.nbytes)} "
            f"duration={self.duration_s:.1f}s{sel}>"
        )

    def stream_rows(self) -> list[tuple[Any, ...]]:
        """One row per stream, for tables (``rayform slices show``, the notebook repr):
        ``(name, kind, rate_hz, shape, dtype, units, frame)``."""
        keys = ("kind", "rate_hz", "shape", "dtype", "units", "frame")
        info = self.segments.summary()["streams"]
        return [
            (name, *(tuple(v) if isinstance(v := info[name].get(k, ""), list) else v for k in keys))
            for name in info
        ]

    def _repr_html_(self) -> str:
        rows = [
            "<tr>" + "".join(f"<td>{html.escape(str(v))}</td>" for v in row) + "</tr>"
            for row in self.stream_rows()
        ]
        return (
            f"<div><b>Slice {html.escape(self.id)}</b> &middot; {len(self.segments)} segments "
            f"&middot; {self.duration_s:.1f} s &middot; {human_bytes(self.nbytes)} &middot; "
            f"sites: {html.escape(', '.join(self.segments.summary()['sites']))}"
            f"<br><code>manifest {self.manifest_hash}</code>"
            + _lineage_html(self.lineage)
            + "<table><tr><th>stream</th><th>kind</th><th>rate (Hz)</th><th>shape</th>"
            "<th>dtype</th><th>units</th><th>frame</th></tr>"
            + "".join(rows)
            + "</table>"
            + _thumbnails(self)
            + "</div>"
        )


def _lineage_html(lineage: dict[str, Any] | None) -> str:
    """A published slice's parent and selection, for the notebook display."""
    if lineage is None:
        return ""
    return (
        f"<br>published from <b>{html.escape(lineage['parent'])}</b> "
        f"(manifest <code>{html.escape(lineage['parent_manifest'][:12])}</code>) by "
        f"<code>{html.escape(lineage['select'][:300])}</code>"
    )


def _thumbnails(slice_: Slice) -> str:
    """First-frame thumbnails of the cached cameras (docs/view.md), if the view extra is here."""
    try:
        # Imported here: PyAV (the view extra) is optional, and a repr must not need it.
        from rayform.view import thumbnails_html
    except ImportError:
        return ""
    return thumbnails_html(slice_)
