"""Decoding: stored blobs to arrays, in the process that reads them.

``_video`` (a bounded per-process cache of video decoders: torchcodec, PyAV, or the packet
decoder), ``_intra`` (the all-intra packet decoder), ``_tables`` (a bounded cache of decoded
table blobs), ``_resize`` (frames to the training resolution, antialiased, the same pixels
whichever decoder read them), ``_batch`` (a batch's frames decoded and resized in one pass,
whichever readers planned them).
"""

from rayform.torch._decoding._batch import BatchPlan, ResizeJob, run_plans
from rayform.torch._decoding._intra import IntraDecoder, open_intra
from rayform.torch._decoding._resize import resize_frames
from rayform.torch._decoding._tables import TableCache
from rayform.torch._decoding._video import (
    BACKENDS,
    DecoderCache,
    default_backend,
    forget_intra_checks,
    intra_checks,
)

__all__ = [
    "BACKENDS",
    "BatchPlan",
    "ResizeJob",
    "run_plans",
    "DecoderCache",
    "IntraDecoder",
    "TableCache",
    "default_backend",
    "forget_intra_checks",
    "intra_checks",
    "open_intra",
    "resize_frames",
]
