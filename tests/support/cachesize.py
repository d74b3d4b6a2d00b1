"""Samples the bytes of a cache's blobs while jobs run, against the limit's stated bound.

The bound (docs/cache.md, "How far over"): ``blobs <= max(limit, pinned) + threads * largest``,
where ``pinned`` is what live readers pin (the cache's ledger and pin markers) and the last
term is the blobs whose download has just finished and which their fetching thread has not
counted yet (one per thread at most). A sample reads the blobs' directory of the real files
(on a local disk: no cached listing) and the pins before and after it.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field
from pathlib import Path

from rayform.cache import pinned


def blob_bytes(cache: Path) -> int:
    """Bytes of the blobs under ``cache`` now, by name (files that vanish meanwhile count
    nothing)."""
    total = 0
    try:
        shards = list(os.scandir(cache / "blobs"))
    except FileNotFoundError:
        return 0
    for shard in shards:
        try:
            for entry in os.scandir(shard.path):
                if len(entry.name) != 64:
                    # A FUSE mount's .fuse_hidden*: a blob evicted while a reader of that node
                    # had it open, holding its space until closed, as an unlinked open file on
                    # a local disk does (which no listing shows either).
                    continue
                try:
                    total += entry.stat().st_size
                except FileNotFoundError:
                    pass
        except (FileNotFoundError, NotADirectoryError):
            pass
    return total


def _size(cache: Path, digest: str) -> int:
    try:
        return (cache / "blobs" / digest[:2] / digest).stat().st_size
    except FileNotFoundError:
        return 0


#: Threads of one reading process that fetch blobs: its read-ahead threads and its reader.
FETCH_THREADS = 5


@dataclass
class Sampler:
    """A thread that samples ``cache`` every ``every_s`` until :meth:`stop`."""

    cache: Path
    limit: int
    slack: int  # threads * largest blob: the bound's last term
    every_s: float = 0.05
    samples: list[tuple[int, int]] = field(default_factory=list)  # (blob bytes, pinned bytes)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __enter__(self) -> Sampler:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            before = pinned(self.cache).hashes
            size = blob_bytes(self.cache)
            held = before | pinned(self.cache).hashes
            self.samples.append((size, sum(_size(self.cache, h) for h in held)))

    def bound(self, pinned_bytes: int) -> int:
        """The stated bound with ``pinned_bytes`` pinned."""
        return max(self.limit, pinned_bytes) + self.slack

    def over(self) -> list[tuple[int, int]]:
        """The samples above the bound."""
        return [(s, p) for s, p in self.samples if s > self.bound(p)]

    def peak(self) -> int:
        """The largest sample, bytes."""
        return max((s for s, _ in self.samples), default=0)

    def summary(self) -> str:
        """Peak and final bytes as multiples of the limit."""
        final = blob_bytes(self.cache)
        top_pin = max((p for _, p in self.samples), default=0)
        return (
            f"{len(self.samples)} samples: peak {self.peak() / self.limit:.2f}x the limit, "
            f"final {final / self.limit:.2f}x, most pinned {top_pin / self.limit:.2f}x, "
            f"bound's slack {self.slack / self.limit:.2f}x"
        )
