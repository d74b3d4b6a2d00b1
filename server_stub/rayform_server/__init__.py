"""Rayform server stub: serves slices (manifests + content-addressed blobs) over HTTP.

Public Python API: :class:`Store` (the data root on disk) and :class:`SliceBuilder`
(turn recorded arrays and frames into segments and a slice).
"""

from rayform_server.builder import SliceBuilder, TableData, VideoData
from rayform_server.store import Store

__all__ = ["SliceBuilder", "Store", "TableData", "VideoData"]
