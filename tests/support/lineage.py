"""Helpers of the lineage tests (dataset URIs, MLflow, W&B): datasets on the demo slice and
sample comparison."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import torch

from rayform.format import hash_bytes, segments_to_table
from rayform.torch import EpisodeDataset, EpisodeSampler, MixtureDataset
from rayform_server.builder import commit_table
from rayform_server.store import Store
from support import DEMO_SLICE

OBS = ["cam0/rgb", "wrist/rgb", "joints/position"]
ACTION = "joints/position_delta"
#: Indices compared between a dataset and its rebuild: first, a middle one, the last.
PICKS = (0, 17, -1)


def demo_dataset(client: Any, slice_id: str, **kwargs: Any) -> EpisodeDataset:
    """The README's dataset on the demo slice, two episodes in reverse order, seed 3."""
    slice_ = client.slices.get(slice_id)
    segments = kwargs.pop("segments", [s.id for s in slice_.segments[:2]][::-1])
    return EpisodeDataset(
        slice_,
        obs=OBS,
        action=ACTION,
        fps=15,
        horizon=4,
        frame="ros",
        segments=segments,
        seed=3,
        **kwargs,
    )


def success_filter_dataset(client: Any) -> tuple[Any, list[str], Any, EpisodeDataset]:
    """``(slice_, ids, view, dataset)``: episodes 0 and 2 of the demo slice labelled
    ``success``, the view ``select(where="success")`` and the README-like dataset over it (the
    label-set version it read pinned in its URI). Needs a write token."""
    slice_ = client.slices.get(DEMO_SLICE)
    ids = [str(i) for i in slice_.segments.ids().to_pylist()]
    slice_.label_all({ids[0]: {"success": True}, ids[2]: {"success": True}})
    view = client.slices.get(DEMO_SLICE).select(where="success")
    return (
        slice_,
        ids,
        view,
        EpisodeDataset(view, obs=OBS, action=ACTION, fps=15, horizon=4, seed=3),
    )


def relabel_success(slice_: Any, ids: list[str]) -> None:
    """Move ``success`` from episode 0 to episode 1, and check that the same filter now keeps
    episodes 1 and 2."""
    slice_.label_all({ids[0]: {"success": False}, ids[1]: {"success": True}})
    now = slice_.client.slices.get(DEMO_SLICE).select(where="success")
    assert set(now.segments.ids().to_pylist()) == {ids[1], ids[2]}


def assert_same_samples(a: EpisodeDataset, b: EpisodeDataset) -> None:
    """Same length and, at PICKS, equal tensors (bit for bit) and equal meta."""
    assert len(a) == len(b)
    for i in PICKS:
        x, y = a[i], b[i]
        assert x.keys() == y.keys()
        for key, value in x.items():
            if isinstance(value, torch.Tensor):
                assert torch.equal(value, y[key]), (i, key)
            else:
                assert value == y[key], (i, key)


def sample_digests(ds: EpisodeDataset) -> list[str]:
    """A hash per PICKS sample: comparable across processes."""
    out = []
    for i in PICKS:
        sample = ds[i]
        parts = [
            f"{k}:{v.dtype}:{tuple(v.shape)}:{v.numpy().tobytes().hex()}"
            for k, v in sorted(sample.items())
            if isinstance(v, torch.Tensor)
        ]
        parts.append(repr(sorted(sample["meta"].items())))
        out.append(hash_bytes("\n".join(parts).encode()))
    return out


def copy_root(src: Path, dst: Path) -> Path:
    """A private copy of a data root (so a test may rebuild its slices)."""
    shutil.copytree(src, dst)
    return dst


def rebuild_slice_without_first_segment(root: Path, slice_id: str) -> str:
    """Point ``slice_id`` at a new manifest (its segments minus the first): same ID, other
    content, as when data owners rebuild a slice. Returns the new manifest hash."""
    store = Store(root)
    current = store.get_slice(slice_id)
    assert current is not None
    segments = list(store.load_manifest(current["manifest"]).segments)
    digest = commit_table(store, segments_to_table(segments[1:]), "rebuilt")
    store.set_slice(slice_id, digest, description="rebuilt")
    return digest


def demo_mixture(client: Any, slice_id: str, **options: Any) -> MixtureDataset:
    """A mixture of two datasets on the demo slice: a selection view (weight 3) and two
    episodes in reverse order (weight 1), 40 draws with replacement, seed 5. ``options`` go to
    both sources."""
    slice_ = client.slices.get(slice_id)
    site = slice_.segments[0].site
    view = EpisodeDataset(
        slice_.select(sites=[site]),
        obs=OBS,
        action=ACTION,
        fps=15,
        horizon=4,
        frame="ros",
        seed=1,
        **options,
    )
    return MixtureDataset(
        [(view, 3), (demo_dataset(client, slice_id, **options), 1)],
        num_samples=40,
        replacement=True,
        seed=5,
    )


def mixture_digests(mix: MixtureDataset, n: int = 6) -> list[str]:
    """A hash per sample of the first ``n`` draws of epoch 0 (what a DataLoader would read)."""
    keys = [(int(i), 0) for i in EpisodeSampler(mix).next_indices(n)]
    out = []
    for sample in mix.__getitems__(keys):
        parts = [
            f"{k}:{v.dtype}:{tuple(v.shape)}:{v.numpy().tobytes().hex()}"
            for k, v in sorted(sample.items())
            if isinstance(v, torch.Tensor)
        ]
        parts.append(repr(sorted(sample["meta"].items())))
        out.append(hash_bytes("\n".join(parts).encode()))
    return out
