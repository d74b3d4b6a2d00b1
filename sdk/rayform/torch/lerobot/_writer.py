"""One file group of an export: a data parquet file and one MP4 per camera, for some episodes.

Row ``k`` of an episode is grid step ``k`` of the dataset (``rayform.torch._index``, the grid
``EpisodeDataset`` itself uses). Tables: each stream's latest record at or before the row's
time (``latest_at_or_before``, the reader's own rule for observations), from the table blob, in
the stream's dtype. Cameras: the stored packets copied (``_copy``) where possible, else the
frames ``EpisodeDataset`` returns, encoded.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from rayform import lerobot_layout as layout
from rayform.format import decode_table
from rayform.torch._align import latest_at_or_before
from rayform.torch._decoding import open_intra
from rayform.torch._index import GridIndex, build_index
from rayform.torch.dataset import EpisodeDataset
from rayform.torch.lerobot import _format as fmt
from rayform.torch.lerobot._copy import PacketCopier
from rayform.torch.lerobot._language import LANGUAGE_FEATURES, Language, load_text
from rayform.torch.lerobot._plan import Plan, Unit

__all__ = ["WORK_DIR", "UnitWriter"]

WORK_DIR = ".rayform-export"
#: Frames decoded per ``__getitems__`` call while encoding (bounds memory: 64 x 480x640x3).
BATCH = 64
#: Frames per episode that camera statistics are taken from (evenly spaced).
STATS_FRAMES = 100


class UnitWriter(Dataset[dict[str, Any]]):
    """Writes one :class:`Unit` per item (a map-style dataset, so that DataLoader workers can
    write units in parallel and hand back their episodes' statistics).

    Args:
        ds: the export's dataset (every exported stream; its sample keys are the features).
        root: the dataset directory.
        plan: the episodes and files.
        features: ``info.json``'s non-video features (recorded ones, then bookkeeping).
        mapping: ``{feature: stream}``.
        cameras: camera features.
        copy: copy the stored packets (else always encode).
        version, crf, gop: as ``export_lerobot``'s.
        pending: the units still to write.
        language: the rows' tasks and language columns.
    """

    def __init__(
        self,
        ds: EpisodeDataset,
        root: Path,
        plan: Plan,
        features: dict[str, dict[str, Any]],
        mapping: dict[str, str],
        cameras: list[str],
        copy: bool,
        version: str,
        crf: int,
        gop: int,
        pending: list[Unit],
        language: Language,
    ) -> None:
        self.ds, self.root, self.plan, self.features = ds, root, plan, features
        self.mapping, self.cameras, self.copy, self.version = mapping, cameras, copy, version
        self.crf, self.gop, self.pending = crf, gop, pending
        self.language = language
        self.index: GridIndex = build_index(ds.segments, list(mapping.values()), ds.fps)
        self.first = plan.first_index
        #: Called with each episode's row count as it is written (in this process only).
        self.progress: Callable[[int], Any] | None = None

    def __len__(self) -> int:
        return len(self.pending)

    def __getitem__(self, i: int) -> dict[str, Any]:
        torch.set_num_threads(1)
        unit = self.pending[i]
        copiers = self._copiers(unit) if self.copy else {}
        videos: dict[str, Any] = dict(copiers)
        columns: dict[str, list[np.ndarray]] = {k: [] for k in self.features}
        episodes = []
        try:
            for j, e in enumerate(unit.episodes):
                stats, tasks = self._tables(e, columns)
                stats.update(self._frames(unit, j, e, videos, copiers))
                n = self.plan.lengths[e]
                episodes.append({"episode_index": e, "length": n, "stats": stats, "tasks": tasks})
                if self.progress is not None:
                    self.progress(n)
            for w in videos.values():
                w.close()
        except BaseException:
            for w in videos.values():
                w.abort()
            raise
        path = self.root / layout.data_path(self.version, unit.file, unit.episodes[0])
        fmt.write_table(
            path, {k: np.concatenate(v) for k, v in columns.items()}, self.features, self.version
        )
        doc = {"file": unit.file, "episodes": episodes, "copied": sorted(copiers)}
        fmt.write_json(self.root / WORK_DIR / f"unit-{unit.file:06d}.json", doc)
        return doc

    def _times(self, e: int) -> np.ndarray:
        pos = self.plan.positions[e]
        return self.index.times_ns(pos, np.arange(self.plan.lengths[e]))

    def _tables(
        self, e: int, columns: dict[str, list[np.ndarray]]
    ) -> tuple[dict[str, Any], list[int]]:
        """Append episode ``e``'s rows to ``columns``; return their statistics and the
        episode's tasks (``task_index``, in order of first appearance)."""
        seg = self.ds.segments[self.plan.positions[e]]
        t = self._times(e)
        n = len(t)
        pos = self.plan.positions[e]
        t_prev = self.index.times_ns(pos, np.arange(n) - 1)
        text = self.language.rows(seg, t, t_prev, load_text(self.ds.slice))
        cols: dict[str, np.ndarray] = {k: v for k, v in text.items() if k in LANGUAGE_FEATURES}
        for key, spec in self.features.items():
            if key in layout.BOOKKEEPING_FEATURES or key in LANGUAGE_FEATURES:
                continue
            ref = seg.streams[self.mapping[key]].blob
            t_rec, values = decode_table(self.ds.slice.blob_path(ref).read_bytes())
            cols[key] = values[latest_at_or_before(t_rec, t)].reshape(n, -1).astype(spec["dtype"])
        k = np.arange(n, dtype=np.int64)
        cols["timestamp"] = (k / self.ds.fps).astype(np.float32)
        cols["frame_index"] = k
        cols["episode_index"] = np.full(n, e, dtype=np.int64)
        cols["index"] = self.first[e] + k
        cols["task_index"] = text["task_index"]
        for key, col in cols.items():
            columns[key].append(col)
        stats = {
            key: fmt.feature_stats(col) for key, col in cols.items() if key not in LANGUAGE_FEATURES
        }
        return stats, list(dict.fromkeys(text["task_index"].tolist()))

    def _copiers(self, unit: Unit) -> dict[str, PacketCopier]:
        """A packet copier per camera whose videos in this unit can be copied."""
        out = {}
        for key in self.cameras:
            sources = []
            for e in unit.episodes:
                st = self.ds.segments[self.plan.positions[e]].streams[self.mapping[key]]
                assert st.timestamps is not None
                sources.append(
                    (
                        self.ds.slice.blob_path(st.blob),
                        self.ds.slice.blob_path(st.timestamps),
                        self._times(e),
                    )
                )
            path = self.root / layout.video_path(self.version, key, unit.file, unit.episodes[0])
            try:
                out[key] = PacketCopier(path, self.ds.fps, sources)
            except ValueError:
                continue  # encoded instead
        return out

    def _frames(
        self,
        unit: Unit,
        j: int,
        e: int,
        videos: dict[str, Any],
        copiers: dict[str, PacketCopier],
    ) -> dict[str, Any]:
        """Episode ``e``'s frames into each camera's video; their statistics."""
        n = self.plan.lengths[e]
        pick = np.unique(np.linspace(0, n - 1, min(n, STATS_FRAMES)).round().astype(int))
        stats = {}
        for key in self.cameras:
            if key in copiers:
                copiers[key].copy(j)
                stats[key] = fmt.image_stats(self._stored_frames(e, key, pick))
        encode = [k for k in self.cameras if k not in copiers]
        if not encode:
            return stats
        start = int(self.index.offsets[self.plan.positions[e]])
        sampled: dict[str, list[np.ndarray]] = {k: [] for k in encode}
        for lo in range(0, n, BATCH):
            hi = min(n, lo + BATCH)
            samples = self.ds.__getitems__(list(range(start + lo, start + hi)))
            for key in encode:
                frames = torch.stack([s[key] for s in samples]).permute(0, 2, 3, 1).numpy()
                if key not in videos:
                    h, w = frames.shape[1:3]
                    path = self.root / layout.video_path(self.version, key, unit.file, e)
                    videos[key] = fmt.VideoWriter(
                        path, self.ds.fps, w, h, crf=self.crf, gop=self.gop
                    )
                videos[key].write(frames)
                sampled[key] += [frames[p - lo] for p in pick if lo <= p < hi]
        for key in encode:
            stats[key] = fmt.image_stats(np.stack(sampled[key]))
        return stats

    def _stored_frames(self, e: int, key: str, rows: np.ndarray) -> np.ndarray:
        """Frames ``(N, H, W, 3)`` of camera ``key`` at rows ``rows`` of episode ``e``, as stored."""
        st = self.ds.segments[self.plan.positions[e]].streams[self.mapping[key]]
        assert st.timestamps is not None
        from rayform.format import decode_timestamps

        t_frames = decode_timestamps(self.ds.slice.blob_path(st.timestamps).read_bytes())
        idx = latest_at_or_before(t_frames, self._times(e)[rows])
        decoder = open_intra(self.ds.slice.blob_path(st.blob))
        assert decoder is not None
        return (
            decoder.get_frames_at([int(i) for i in idx], channels_last=True)
            .permute(0, 2, 3, 1)
            .numpy()
        )
