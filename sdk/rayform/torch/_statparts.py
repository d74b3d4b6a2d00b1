"""Per-episode statistics partials: content-addressed keys, and packs of them in the cache.

A *partial* is one episode's grid samples of the dataset's table streams: the rows the model
sees (observations at the latest record at or before each grid time, the action per
``action_mode``, after the ``frame=`` conversion), one ``(n, D)`` array per stream, with its
moments (mean and M2 per component, which merge exactly). Statistics of any selection are
computed from its episodes' partials, so they are the numbers a full pass gives, quantiles
included (a quantile does not combine from per-episode summaries; the samples do).

An episode's key is everything its partial depends on, and nothing else: the *context* every
episode of the computation shares (``fps``, ``frame``, ``action_mode``, the table streams'
names and roles, each stream's ``frame``/``quantity``, which the conversion reads, and this
module's format version), hashed with BLAKE3, and the episode's own record (its grid's first
sample time and sample count, ns, and its streams' blob digests), kept whole as a fixed-width
key. Two episodes with the same key hold the same samples, whatever their IDs, slices or
selections.

Partials live in packs, ``CACHE_DIR/stats/packs/<context>/<BLAKE3 of the file>.pack``, each
written once (temporary file, then rename) by the computation that made its entries::

    b"RFSTATS1", W, K, J                       (u64 each: key width, entries, streams)
    J x (D, itemsize)                          (u64 each: width, 4 for float32 or 8 float64)
    keys      K x W bytes, sorted (padded to 8)
    digests   K x 32 bytes: BLAKE3 of (key, entry)
    rows      K x i64: the entry's samples n
    offsets   (K + 1) x i64: entry k is bytes offsets[k] .. offsets[k + 1] - 1 of the entries
    entries   each: (n, D_j) samples of every stream (each padded to 8 bytes), then the
              (2, D_j) float64 moments of every stream; little-endian

A reader looks its keys up in every pack of its context (a binary search per pack), checks
each distinct entry it uses against its digest (one BLAKE3 call per entry, the only Python
step per episode), then gathers the found episodes' samples and moments with one numpy fancy
index per stream. A pack whose layout is wrong, or with an entry whose digest or length
differs, is not used at all: it is removed, and its episodes are computed again (the same
computation writes the same pack again).
"""

from __future__ import annotations

import contextlib
import mmap
import os
import struct
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import NamedTuple

import blake3
import numpy as np

from rayform.cache import Cache
from rayform.errors import RayformError
from rayform.manifest import canonical_json
from rayform.torch._index import GridIndex

__all__ = ["Found", "Partial", "episode_keys", "read_partials", "write_partials"]

_PART_VERSION = 1
_MAGIC = b"RFSTATS1"
_KEY = 32
_HEAD = struct.Struct("<8sQQQ")
_DIR = "stats/packs"
#: Entries go into one pack until it holds this many bytes of samples (bounds what is held
#: in memory while a pack is built, and what one mapping spans).
PACK_BYTES = 64 << 20


class Partial(NamedTuple):
    """One episode's samples of each stream (sorted stream names), with their summaries.

    Attributes:
        samples: ``(n, D)`` per stream, as the dataset's alignment and conversion give them.
        moments: ``(2, D) float64`` per stream: the samples' mean and sum of squared
            deviations from it (``M2``), which merge exactly across episodes.
    """

    samples: list[np.ndarray]
    moments: list[np.ndarray]

    @classmethod
    def of(cls, samples: list[np.ndarray]) -> Partial:
        """The partial of ``samples`` (its moments computed in float64)."""
        moments = []
        for x in samples:
            mean = x.mean(axis=0, dtype=np.float64)
            moments.append(np.stack([mean, ((x - mean) ** 2).sum(axis=0, dtype=np.float64)]))
        return cls(samples, moments)


def _field_codes(index: GridIndex, name: str, field: str) -> tuple[list[str], np.ndarray]:
    """The distinct values of a stream's string ``field`` and each segment's code ``(S,)``."""
    seen = sorted(index.segments.stream_values(name, field))
    if len(seen) <= 1:
        return seen, np.zeros(len(index.segments), dtype=np.int32)
    # Mixed within one selection (rare): read each segment's own value.
    values = [str(getattr(seg.streams[name], field)) for seg in index.segments]
    return seen, np.asarray([seen.index(v) for v in values], dtype=np.int32)


def episode_keys(
    index: GridIndex, streams: Mapping[str, str], frame: str | None, action_mode: str
) -> tuple[str, np.ndarray]:
    """``(context, keys)``: the BLAKE3 hex of what every episode's partial shares (fps,
    ``frame``, ``action_mode``, the streams' names, roles, frames and quantities, this
    format's version) and each segment's key ``(S,)`` (a fixed-width ``void`` record of its
    grid start and count and its streams' blob digests: the key is the content itself, no
    hash per episode).

    Built from the manifest's columns (no blob read, no :class:`Segment` object unless a
    stream's ``frame``/``quantity`` differs between segments).

    Args:
        index: the dataset's grid.
        streams: table stream name -> ``"obs"`` or ``"action"``.
        frame: the ``frame=`` convention.
        action_mode: how the action is aligned.
    """
    names = sorted(streams)
    described = []
    rec = np.zeros(
        len(index.segments),
        dtype=[
            ("start", "<i8"),
            ("count", "<i8"),
            ("blob", "u1", (len(names), _KEY)),
            ("code", "<i4", (len(names), 2)),
        ],
    )
    rec["start"], rec["count"] = index.start_ns, index.count
    for j, name in enumerate(names):
        rec["blob"][:, j] = index.segments.stream_hashes(name)[1]
        frames, rec["code"][:, j, 0] = _field_codes(index, name, "frame")
        quantities, rec["code"][:, j, 1] = _field_codes(index, name, "quantity")
        described.append([name, streams[name], frames, quantities])
    context = {
        "v": _PART_VERSION,
        "fps": index.fps,
        "frame": frame,
        "action_mode": action_mode,
        "streams": described,
    }
    return blake3.blake3(canonical_json(context)).hexdigest(), rec.view(f"V{rec.dtype.itemsize}")


def _padded(n: int) -> int:
    return (n + 7) // 8 * 8


def _block_bytes(rows: np.ndarray, shapes: list[tuple[int, int]]) -> list[np.ndarray]:
    """Bytes of each stream's samples in entries of ``rows`` samples, each padded to 8."""
    return [(rows * d * itemsize + 7) // 8 * 8 for d, itemsize in shapes]


def _entry_bytes(rows: np.ndarray, shapes: list[tuple[int, int]]) -> np.ndarray:
    """Bytes of entries of ``rows`` samples each (vectorised)."""
    return sum(_block_bytes(rows, shapes), np.zeros_like(rows)) + sum(16 * d for d, _ in shapes)


class Found(NamedTuple):
    """The partials read from packs, gathered (no Python object per episode).

    Attributes:
        positions: ``int64 (F,)`` the segment positions found.
        samples: per stream, ``(D, n)`` blocks of the found episodes' samples (each
            component a contiguous row, ready to sort), in no particular order.
        moments: per stream, ``(F, 2, D) float64`` each found episode's mean and M2, in
            ``positions`` order.
    """

    positions: np.ndarray
    samples: list[list[np.ndarray]]
    moments: list[np.ndarray]


class _Pack:
    """One pack file, mapped; its layout checked on open (``ValueError`` if wrong)."""

    def __init__(self, path: Path, width: int) -> None:
        with path.open("rb") as f:
            self.map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        size = len(self.map)
        if size < _HEAD.size:
            raise ValueError("short")
        magic, w, k, j = _HEAD.unpack_from(self.map, 0)
        if magic != _MAGIC or w != width or j > 1024 or k * w > size:
            raise ValueError("header")
        at = _HEAD.size
        shapes = np.frombuffer(self.map, dtype="<u8", count=2 * j, offset=at).reshape(j, 2)
        at += 16 * j
        if not np.isin(shapes[:, 1], (4, 8)).all() or (shapes[:, 0] > size).any():
            raise ValueError("shapes")
        self.shapes = [(int(d), int(itemsize)) for d, itemsize in shapes.tolist()]
        self.keys = np.frombuffer(self.map, dtype=f"V{w}", count=k, offset=at)
        at += _padded(k * w)
        self.digests = np.frombuffer(self.map, dtype=f"V{_KEY}", count=k, offset=at)
        at += k * _KEY
        self.rows = np.frombuffer(self.map, dtype="<i8", count=k, offset=at).astype(np.int64)
        at += 8 * k
        self.offsets = np.frombuffer(self.map, dtype="<i8", count=k + 1, offset=at)
        self.base = at + 8 * (k + 1)  # a multiple of 8, as every entry's size
        if (
            (self.rows < 0).any()
            or self.offsets[0] != 0
            or (np.diff(self.offsets) != _entry_bytes(self.rows, self.shapes)).any()
            or self.base + int(self.offsets[-1]) != size
        ):
            raise ValueError("entries")
        self.width = w

    def find(self, queries: np.ndarray) -> np.ndarray:
        """Entry of each query key, ``-1`` where absent."""
        if not len(self.keys):
            return np.full(len(queries), -1, dtype=np.int64)
        pos = np.minimum(np.searchsorted(self.keys, queries), len(self.keys) - 1)
        return np.where(self.keys[pos] == queries, pos, -1)

    def checked(self, entries: np.ndarray) -> bool:
        """Whether every one of ``entries`` (distinct) matches its digest."""
        keys, digests = self.keys.tobytes(), self.digests.tobytes()
        view, w = memoryview(self.map), self.width
        starts = (self.base + self.offsets[entries]).tolist()
        ends = (self.base + self.offsets[entries + 1]).tolist()
        for k, start, end in zip(entries.tolist(), starts, ends, strict=True):
            h = blake3.blake3(keys[k * w : (k + 1) * w])
            h.update(view[start:end])
            if h.digest() != digests[k * _KEY : (k + 1) * _KEY]:
                return False
        return True

    def gather(self, entries: np.ndarray) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """Samples ``(D, n)`` and moments ``(len(entries), 2, D)`` per stream of ``entries``
        (repeats included), gathered with one fancy index per stream."""
        n = self.rows[entries]
        start = self.base + self.offsets[entries]  # bytes, multiples of 8
        total = int(n.sum())
        first = np.repeat(np.cumsum(n) - n, n)  # each sample's entry's first sample
        step = np.arange(total, dtype=np.int64) - first  # each sample's row in its entry
        samples = []
        for (d, itemsize), size in zip(self.shapes, _block_bytes(n, self.shapes), strict=True):
            values = np.frombuffer(self.map, f"<f{itemsize}", len(self.map) // itemsize)
            row0 = np.repeat(start // itemsize, n) + step * d
            samples.append(values[row0[None, :] + np.arange(d, dtype=np.int64)[:, None]])
            start = start + size
        width = sum(2 * d for d, _ in self.shapes)
        flat = np.frombuffer(self.map, "<f8", len(self.map) // 8)
        block = flat[(start // 8)[:, None] + np.arange(width, dtype=np.int64)[None, :]]
        moments, at = [], 0
        for d, _ in self.shapes:
            moments.append(block[:, at : at + 2 * d].reshape(len(entries), 2, d))
            at += 2 * d
        return samples, moments


def read_partials(
    cache_dir: Path, context: str, keys: np.ndarray, need: np.ndarray, counts: np.ndarray
) -> Found:
    """The partials found in the cache's packs.

    Args:
        cache_dir: the Rayform cache directory.
        context: the shared part of the keys, from :func:`episode_keys`.
        keys: ``(S,)`` keys from :func:`episode_keys`.
        need: ``bool (S,)``: the positions to look up.
        counts: ``int64 (S,)``: each segment's grid samples (an entry of another length is
            a damaged pack).
    """
    folder = Path(cache_dir) / _DIR / context
    want = np.flatnonzero(need)
    positions: list[np.ndarray] = []
    samples: list[list[np.ndarray]] = []
    moments: list[list[np.ndarray]] = []
    try:
        names = sorted(p for p in os.listdir(folder) if p.endswith(".pack"))
    except OSError:
        names = []
    for name in names:
        if not len(want):
            break
        try:
            pack = _Pack(folder / name, keys.dtype.itemsize)
        except (OSError, ValueError):
            _discard(folder / name)
            continue
        hits = pack.find(keys[want])
        got, entries = want[hits >= 0], hits[hits >= 0]
        if not len(got):
            continue
        # A pack with one wrong entry is not used at all (its episodes are made again).
        if (pack.rows[entries] != counts[got]).any() or not pack.checked(np.unique(entries)):
            _discard(folder / name)
            continue
        s, m = pack.gather(entries)
        positions.append(got)
        samples.append(s)
        moments.append(m)
        want = want[hits < 0]
    streams = len(samples[0]) if samples else 0
    return Found(
        np.concatenate(positions) if positions else np.zeros(0, dtype=np.int64),
        [[s[j] for s in samples] for j in range(streams)],
        [np.concatenate([m[j] for m in moments]) for j in range(streams)],
    )


def _discard(path: Path) -> None:
    """Remove a pack that failed its checks (its episodes are computed again)."""
    with contextlib.suppress(OSError):
        path.unlink()


def write_partials(
    cache_dir: Path, shared: bool | None, context: str, entries: Mapping[bytes, Partial]
) -> None:
    """Store ``{key: partial}`` as packs of up to :data:`PACK_BYTES` of samples (nothing on a
    read-only cache, nor when the samples are not ``(n, D)`` tables of one width per
    stream)."""
    items = sorted(entries.items())
    if not items:
        return
    widths = [a.shape[1] if a.ndim == 2 else -1 for a in items[0][1].samples]
    for _, part in items:
        if [a.shape[1] if a.ndim == 2 else -1 for a in part.samples] != widths or min(widths) < 0:
            return
    # float32 samples stay float32 (exact); anything else is kept as the float64 it is
    # counted in.
    itemsizes = [
        4 if all(part.samples[j].dtype == np.float32 for _, part in items) else 8
        for j in range(len(widths))
    ]
    start, held = 0, 0
    for i, (_, part) in enumerate(items):
        held += sum(len(a) * d * s for a, d, s in zip(part.samples, widths, itemsizes, strict=True))
        if held >= PACK_BYTES or i == len(items) - 1:
            data = _pack_bytes(items[start : i + 1], widths, itemsizes)
            name = f"{_DIR}/{context}/{blake3.blake3(data).hexdigest()}.pack"
            try:
                Cache(cache_dir, shared=shared).put_file(name, data)
            except RayformError:  # a read-only or full cache: the rest would fail alike
                return
            start, held = i + 1, 0


def _pack_bytes(
    items: Sequence[tuple[bytes, Partial]], widths: list[int], itemsizes: list[int]
) -> bytes:
    shapes = list(zip(widths, itemsizes, strict=True))
    entries = []
    for _, part in items:
        raw = b""
        for x, (_, itemsize) in zip(part.samples, shapes, strict=True):
            block = np.ascontiguousarray(x, dtype=f"<f{itemsize}").tobytes()
            raw += block + b"\0" * (_padded(len(block)) - len(block))
        raw += b"".join(np.ascontiguousarray(m, dtype="<f8").tobytes() for m in part.moments)
        entries.append(raw)
    rows = np.asarray([len(part.samples[0]) for _, part in items], dtype="<i8")
    offsets = np.zeros(len(items) + 1, dtype="<i8")
    np.cumsum([len(e) for e in entries], out=offsets[1:])
    digests = b"".join(
        blake3.blake3(key + entry).digest() for (key, _), entry in zip(items, entries, strict=True)
    )
    keys = b"".join(key for key, _ in items)
    head = _HEAD.pack(_MAGIC, len(items[0][0]), len(items), len(widths))
    body = [head, np.asarray(shapes, dtype="<u8").tobytes()]
    body += [keys + b"\0" * (_padded(len(keys)) - len(keys)), digests]
    body += [rows.tobytes(), offsets.tobytes(), *entries]
    return b"".join(body)
