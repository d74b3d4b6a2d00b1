"""Parallel pull of a slice's blobs into the cache, with a progress bar and a summary."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from rayform import _html
from rayform._net._progress import byte_bar
from rayform._seams import Fetch
from rayform.cache import Cache
from rayform.manifest import BlobRef
from rayform.units import human_bytes

__all__ = ["PullReport", "run_pull"]


@dataclass(frozen=True)
class PullReport:
    """What a pull did.

    Attributes:
        slice_id: the slice pulled.
        blobs: blobs the slice (or the named streams) needs.
        bytes: their total size in bytes.
        fetched_blobs: blobs downloaded by this pull (fully or the rest of a partial file).
        fetched_bytes: bytes downloaded by this pull.
        cached_blobs: blobs that were already in the cache.
        cached_bytes: their size in bytes.
        seconds: wall time of the pull in seconds.
    """

    slice_id: str
    blobs: int
    bytes: int
    fetched_blobs: int
    fetched_bytes: int
    cached_blobs: int
    cached_bytes: int
    seconds: float

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def summary(self) -> str:
        """One line for humans."""
        rate = self.fetched_bytes / self.seconds if self.seconds > 0 else 0.0
        return (
            f"{self.slice_id}: {self.blobs} blobs ({human_bytes(self.bytes)}) verified in cache; "
            f"fetched {self.fetched_blobs} ({human_bytes(self.fetched_bytes)}) in "
            f"{self.seconds:.1f} s ({human_bytes(rate)}/s), {self.cached_blobs} already cached"
        )

    def __str__(self) -> str:
        return self.summary()

    def __repr__(self) -> str:
        return f"<PullReport {self.summary()}>"

    def _repr_html_(self) -> str:
        rate = self.fetched_bytes / self.seconds if self.seconds > 0 else 0.0
        return _html.wrap(
            _html.header(
                f"Pull of {self.slice_id}",
                f"{self.blobs} blobs ({human_bytes(self.bytes)}) verified in cache",
            ),
            _html.kv_table(
                [
                    ("fetched", f"{self.fetched_blobs} blobs, {human_bytes(self.fetched_bytes)}"),
                    (
                        "already cached",
                        f"{self.cached_blobs} blobs, {human_bytes(self.cached_bytes)}",
                    ),
                    ("time", f"{self.seconds:.1f} s ({human_bytes(rate)}/s)"),
                ]
            ),
        )


def run_pull(
    slice_id: str,
    refs: Sequence[BlobRef],
    cache: Cache,
    fetch: Fetch,
    *,
    jobs: int = 8,
    progress: bool = False,
) -> PullReport:
    """Make every blob in ``refs`` present and verified in ``cache``.

    Args:
        slice_id: the slice the blobs are read through.
        refs: the blobs.
        cache: the cache.
        fetch: ``fetch(slice_id, ref, on_bytes) -> (path, bytes downloaded)``.
        jobs: number of parallel downloads.
        progress: tqdm bar (bytes, rate, ETA) on stderr.
    """
    t0 = time.monotonic()
    missing = [r for r in refs if not cache.has_blob(r.hash)]
    # Largest first: the long transfers start early and the tail is short.
    missing.sort(key=lambda r: -r.size)
    bar = None
    if progress and missing:
        bar = byte_bar(sum(r.size for r in missing), f"pull {slice_id}")
    lock = threading.Lock()

    def on_bytes(n: int) -> None:
        if bar is not None:
            with lock:
                bar.update(n)

    # Once one download has failed for good the pull fails: start no other, so that a stalled
    # store ends the pull within one stall bound instead of one bound per round of `jobs` blobs.
    failed = threading.Event()

    def fetch_one(ref: BlobRef) -> tuple[Path, int] | None:
        if failed.is_set():
            return None
        shown = 0

        def counted(n: int) -> None:
            nonlocal shown
            shown += n
            on_bytes(n)

        try:
            result = fetch(slice_id, ref, counted)
        except BaseException:
            failed.set()
            raise
        if ref.size > shown:  # resumed prefix, or fetched by another process meanwhile
            on_bytes(ref.size - shown)
        return result

    fetched_blobs = fetched_bytes = 0
    fetched: set[str] = set()
    try:
        if missing:
            with ThreadPoolExecutor(
                max_workers=min(jobs, len(missing)), thread_name_prefix="rayform-pull"
            ) as pool:
                futures = [pool.submit(fetch_one, r) for r in missing]
                try:  # the first failure, whichever blob it is, ends the wait
                    wait(futures, return_when=FIRST_EXCEPTION)
                finally:  # also on Ctrl-C: nothing new starts, running downloads end
                    failed.set()
                    for f in futures:
                        f.cancel()
                for ref, fut in zip(missing, futures, strict=True):
                    result = None if fut.cancelled() else fut.result()
                    if result is not None and result[1] > 0:
                        fetched_bytes += result[1]
                        fetched_blobs += 1
                        fetched.add(ref.hash)
    finally:
        if bar is not None:
            bar.close()
    if missing:
        cache.clean_tmp()  # leftovers of killed pullers whose blobs are now complete
    total = sum(r.size for r in refs)
    cached = [r for r in refs if r.hash not in fetched]
    return PullReport(
        slice_id=slice_id,
        blobs=len(refs),
        bytes=total,
        fetched_blobs=fetched_blobs,
        fetched_bytes=fetched_bytes,
        cached_blobs=len(cached),
        cached_bytes=sum(r.size for r in cached),
        seconds=round(time.monotonic() - t0, 3),
    )
