"""LeRobot's on-disk dataset format (v3.0 and v2.1), written without the ``lerobot`` package.

The layout itself (paths, chunks, versions, bookkeeping columns) is
:mod:`rayform.lerobot_layout`, which the server stub's ingest reads by; this module writes
its files: JSON documents, data and metadata parquet files with the schema ``datasets``
writes, statistics as LeRobot aggregates them, and MP4 videos.

A feature of shape ``[1]`` is a scalar column; any other vector a fixed-size list column, as
``datasets`` writes them (LeRobot casts the columns to the features of ``info.json``).
"""

from __future__ import annotations

import json
import os
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from rayform import lerobot_layout as layout
from rayform.files import write_atomic
from rayform.torch.lerobot._language import language_column

__all__ = [
    "VideoWriter",
    "aggregate_stats",
    "feature_stats",
    "hf_metadata",
    "image_stats",
    "write_json",
    "write_table",
    "write_tasks",
]

_QUANTILES = {"q01": 0.01, "q10": 0.10, "q50": 0.50, "q90": 0.90, "q99": 0.99}


def write_json(path: Path, doc: Any, *, lines: bool = False) -> None:
    """``doc`` as JSON (or a list as JSON lines), written whole or not at all."""
    path.parent.mkdir(parents=True, exist_ok=True)
    text = (
        "".join(json.dumps(row) + "\n" for row in doc)
        if lines
        else json.dumps(doc, indent=4) + "\n"
    )
    write_atomic(path, text.encode())


def _hf_feature(spec: dict[str, Any], version: str) -> dict[str, Any]:
    kind = "Sequence" if version == "2.1" else "List"
    if spec["dtype"] == layout.LANGUAGE:  # a list of rows (rayform.torch.lerobot._language)
        string = {"dtype": "string", "_type": "Value"}
        row = {
            "role": string,
            "content": string,
            "style": string,
            "timestamp": {"dtype": "float32", "_type": "Value"},
            "camera": string,
            "tool_calls": {"feature": string, "_type": kind},
        }
        return {"feature": row, "_type": kind}
    value = {"dtype": spec["dtype"], "_type": "Value"}
    if list(spec["shape"]) == [1]:
        return value
    # datasets 4 writes a fixed-size list as "List"; datasets 3 (what LeRobot 0.3, the v2.1
    # release, pins) knows only "Sequence", which datasets 4 still reads.
    kind = "Sequence" if version == "2.1" else "List"
    return {"feature": value, "length": int(np.prod(spec["shape"])), "_type": kind}


def hf_metadata(features: dict[str, dict[str, Any]], version: str) -> dict[bytes, bytes]:
    """The ``huggingface`` schema metadata ``datasets`` writes for these (non-video) features."""
    doc = {"info": {"features": {k: _hf_feature(v, version) for k, v in features.items()}}}
    return {b"huggingface": json.dumps(doc).encode()}


def _column(values: np.ndarray, spec: dict[str, Any], key: str = "") -> pa.Array:
    if spec["dtype"] == layout.LANGUAGE:
        return language_column(key, values)
    dtype = np.dtype(spec["dtype"])
    if list(spec["shape"]) == [1]:
        return pa.array(values.reshape(-1).astype(dtype, copy=False))
    width = int(np.prod(spec["shape"]))
    flat = pa.array(values.reshape(-1).astype(dtype, copy=False))
    return pa.FixedSizeListArray.from_arrays(flat, width)


def write_table(
    path: Path, columns: dict[str, np.ndarray], features: dict[str, dict[str, Any]], version: str
) -> None:
    """A data parquet file: one column per feature (in ``features``' order), written whole."""
    table = pa.table({k: _column(columns[k], features[k], k) for k in features})
    table = table.replace_schema_metadata(hf_metadata(features, version))
    _write_parquet(path, table)


def _write_parquet(path: Path, table: pa.Table) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    write_atomic(path, sink.getvalue().to_pybytes())


def write_tasks(path: Path, tasks: list[str]) -> None:
    """``meta/tasks.parquet``: a pandas frame indexed by the task string, column ``task_index``
    (what ``pandas.DataFrame.to_parquet`` writes; LeRobot reads it with ``pd.read_parquet``)."""
    table = pa.table(
        {
            "task_index": pa.array(np.arange(len(tasks), dtype=np.int64)),
            "__index_level_0__": pa.array(tasks, pa.string()),
        }
    )
    pandas_meta = {
        "index_columns": ["__index_level_0__"],
        "column_indexes": [
            {
                "name": None,
                "field_name": None,
                "pandas_type": "unicode",
                "numpy_type": "object",
                "metadata": {"encoding": "UTF-8"},
            }
        ],
        "columns": [
            {
                "name": "task_index",
                "field_name": "task_index",
                "pandas_type": "int64",
                "numpy_type": "int64",
                "metadata": None,
            },
            {
                "name": None,
                "field_name": "__index_level_0__",
                "pandas_type": "unicode",
                "numpy_type": "object",
                "metadata": None,
            },
        ],
        "creator": {"library": "rayform", "version": "1"},
        "pandas_version": "2.0.0",
    }
    _write_parquet(
        path, table.replace_schema_metadata({b"pandas": json.dumps(pandas_meta).encode()})
    )


def write_episodes(path: Path, rows: list[dict[str, Any]]) -> None:
    """``meta/episodes/chunk-000/file-000.parquet`` (v3.0): one row per episode."""
    _write_parquet(path, pa.Table.from_pylist(rows))


def feature_stats(values: np.ndarray) -> dict[str, Any]:
    """LeRobot's statistics of one feature over rows ``(N, ...)``: ``min``/``max``/``mean``/
    ``std`` (population)/``count`` and the ``q01``...``q99`` quantiles, per component (lists)."""
    x = values.reshape(len(values), -1).astype(np.float64)
    out: dict[str, Any] = {
        "min": x.min(axis=0).tolist(),
        "max": x.max(axis=0).tolist(),
        "mean": x.mean(axis=0).tolist(),
        "std": x.std(axis=0).tolist(),
        "count": [len(x)],
    }
    for name, q in _QUANTILES.items():
        out[name] = np.quantile(x, q, axis=0).tolist()
    return out


def image_stats(frames: np.ndarray) -> dict[str, Any]:
    """Per-channel statistics of frames ``(N, H, W, 3) uint8`` in ``[0, 1]``, shaped
    ``(3, 1, 1)`` as LeRobot keeps them (``count`` is the number of frames). Taken on every
    ``s``-th pixel of each axis, ``s`` bringing the longer side to about 64 (LeRobot too
    downsamples frames for its image statistics)."""
    step = max(1, max(frames.shape[1:3]) // 64)
    x = frames[:, ::step, ::step].reshape(-1, frames.shape[-1]).astype(np.float64) / 255.0
    stats = feature_stats(x)
    out: dict[str, Any] = {k: [[[v]] for v in vals] for k, vals in stats.items() if k != "count"}
    out["count"] = [len(frames)]
    return out


def aggregate_stats(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """Per-episode statistics of one feature combined as LeRobot's ``aggregate_stats`` does:
    exact min/max/mean/std (pooled variance), quantiles as count-weighted means."""
    counts = np.array([p["count"][0] for p in parts], dtype=np.float64)
    w = counts / counts.sum()
    arr = {k: np.array([p[k] for p in parts], dtype=np.float64) for k in parts[0] if k != "count"}
    shape = (-1,) + (1,) * (arr["mean"].ndim - 1)
    wb = w.reshape(shape)
    mean = (arr["mean"] * wb).sum(axis=0)
    var = ((arr["std"] ** 2 + (arr["mean"] - mean) ** 2) * wb).sum(axis=0)
    out: dict[str, Any] = {
        "min": arr["min"].min(axis=0).tolist(),
        "max": arr["max"].max(axis=0).tolist(),
        "mean": mean.tolist(),
        "std": np.sqrt(var).tolist(),
        "count": [int(counts.sum())],
    }
    for name in _QUANTILES:
        if name in arr:
            out[name] = (arr[name] * wb).sum(axis=0).tolist()
    return out


class VideoWriter:
    """Frames ``(H, W, 3) uint8`` into one MP4 at a constant rate: frame ``i`` at ``i / fps``.

    H.264 (libx264, no B-frames, a keyframe every ``gop`` frames, ``yuv420p`` when both sides
    are even, else ``yuv444p``), written to a temporary file next to ``path`` and renamed over it
    on :meth:`close`, so ``path`` is whole or absent.
    """

    def __init__(
        self, path: Path, fps: float, width: int, height: int, *, crf: int, gop: int
    ) -> None:
        import av

        from rayform.files import unique_tmp_name

        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.tmp = path.parent / unique_tmp_name(path.name)
        self.pix_fmt = "yuv420p" if width % 2 == 0 and height % 2 == 0 else "yuv444p"
        self._container = av.open(str(self.tmp), mode="w", format="mp4")
        rate = Fraction(fps).limit_denominator(1001)
        stream = self._container.add_stream("libx264", rate=rate)
        stream.width, stream.height, stream.pix_fmt = width, height, self.pix_fmt
        stream.time_base = 1 / rate
        stream.codec_context.time_base = 1 / rate
        stream.options = {"crf": str(crf), "g": str(gop), "bf": "0", "preset": "veryfast"}
        self._stream = stream
        self.frames = 0

    def write(self, frames: np.ndarray) -> None:
        """Append frames ``(N, H, W, 3) uint8``."""
        import av

        for rgb in frames:
            frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(rgb), format="rgb24")
            frame = frame.reformat(format=self.pix_fmt)
            frame.pts = self.frames
            self.frames += 1
            self._container.mux(self._stream.encode(frame))

    def close(self) -> None:
        """Flush the encoder, close the file and rename it into place."""
        self._container.mux(self._stream.encode(None))
        self._container.close()
        os.replace(self.tmp, self.path)

    def abort(self) -> None:
        """Close and remove the temporary file (after an error)."""
        try:
            self._container.close()
        finally:
            self.tmp.unlink(missing_ok=True)
