"""A fleet-sized demo slice that is cheap to build: many segments over a small pool of blobs.

``rayform-server demo --episodes N --share-blobs`` renders a pool of real demo episodes (the
demo's usual count, or ``N`` if smaller) and then lists ``N`` segments, segment ``i`` reusing
the streams (blobs, record times) of pool episode ``i % pool`` under its own ID
(:func:`~rayform_server.demo.segment_id`, so the first ``pool`` segments are exactly the
ordinary demo's). The segment table is built with Arrow column operations (no Python object
per segment) and committed as one version 2 manifest: 1,000,000 segments take seconds.

A segment's record times are its pool episode's: the blobs hold absolute timestamps, and a
manifest that shifted them would disagree with its own blobs.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import numpy as np

from rayform.errors import InvalidArgumentError
from rayform.format import check_slice_id, hash_bytes, segments_to_table
from rayform_server.builder import commit_table
from rayform_server.demo import SITES, build_demo, demo_spec, segment_id
from rayform_server.store import Store

__all__ = ["build_shared_demo", "demo_description", "shared_ids", "stage_demo"]


def shared_ids(seed: int, count: int) -> list[str]:
    """The demo's segment IDs for episodes ``0..count-1`` (``seg_`` + 16 hex of (seed, i))."""
    return [segment_id(seed, i) for i in range(count)]


def build_shared_demo(
    root: str | os.PathLike[str],
    slice_id: str,
    episodes: int,
    *,
    small: bool = False,
    seed: int = 0,
    jobs: int = 1,
    progress: Callable[[str], None] | None = None,
    renditions: tuple[int, ...] = (),
) -> str:
    """Build the pool, then commit ``episodes`` segments that share its blobs.

    Args:
        root: data root (created if missing).
        slice_id: the slice to create or replace.
        episodes: number of segments (>= 1).
        small: pool episodes of the small demo (2 s, 96x128).
        seed: everything random derives from it.
        jobs: pool episodes rendered in parallel.
        progress: called with a line of text per step.
        renditions: heights of camera renditions rendered for the pool (shared like its videos).

    Returns:
        The hash of the committed manifest (version 2; 3 with renditions).
    """
    import pyarrow as pa

    check_slice_id(slice_id)
    if episodes < 1:
        raise InvalidArgumentError(f"episodes must be at least 1, got {episodes}")
    spec = demo_spec(small)
    pool_n = min(episodes, spec.episodes)
    store = Store(root)
    # The pool is an ordinary demo build under a scratch slice, then that reference is dropped:
    # its blobs and manifest stay (content-addressed), only the fleet slice is named.
    scratch = "slc_" + hash_bytes(f"rayform-demo-pool:{slice_id}".encode())[:16]
    pool = build_demo(
        root,
        scratch,
        small=small,
        seed=seed,
        jobs=jobs,
        episodes=pool_n,
        progress=progress,
        renditions=renditions,
    )
    store.delete_slice(scratch)
    table = segments_to_table(list(pool.segments))
    if episodes > pool_n:
        take = np.arange(episodes, dtype=np.int64) % pool_n
        table = table.take(pa.array(take))
        ids = pa.array(shared_ids(seed, episodes), pa.string())
        table = table.set_column(table.schema.get_field_index("id"), "id", ids)
    if progress is not None:
        progress(f"segment table: {episodes} segments over {pool_n} pool episodes")
    description = (
        f"demo: bimanual pick-and-place, {episodes} episodes from {len(SITES)} sites sharing "
        f"the blobs of {pool_n} (procedurally generated, seed {seed})"
    )
    digest = commit_table(store, table, description)
    store.set_slice(slice_id, digest, description)
    return digest


def demo_description(episodes: int, seed: int) -> str:
    """The description :func:`~rayform_server.demo.build_demo` gives its slice."""
    return (
        f"demo: bimanual pick-and-place, {episodes} episodes from {len(SITES)} sites "
        f"(procedurally generated, seed {seed})"
    )


def stage_demo(
    root: str | os.PathLike[str],
    batch: str,
    shard: int,
    shards: int,
    *,
    small: bool = False,
    seed: int = 0,
    episodes: int | None = None,
    progress: Callable[[str], None] | None = None,
    renditions: tuple[int, ...] = (),
) -> int:
    """Render the demo episodes ``i`` with ``i % shards == shard`` (with camera renditions at the
    heights ``renditions``) and stage each in ``batch``
    (one worker of a distributed build; ``rayform-server commit`` then makes the slice).
    Returns the number staged. Ordered by episode index, so the committed slice is the
    ordinary demo's, byte for byte."""
    from rayform_server.demo import build_episode
    from rayform_server.staging import Shard, stage_segment

    Shard(shard, shards)  # checks the range
    spec = demo_spec(small)
    n = spec.episodes if episodes is None else episodes
    store = Store(root)
    count = 0
    for i in range(shard, n, shards):
        seg = build_episode(str(store.root), spec, seed, i, renditions=renditions)
        stage_segment(store, batch, seg, order=f"{i:012d}")
        count += 1
        if progress is not None:
            progress(f"staged episode {i + 1}/{n}: {seg.id} in batch {batch}")
    return count
