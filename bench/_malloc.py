"""glibc malloc settings that keep large buffers instead of returning them to the kernel.

glibc serves allocations above a (dynamic) threshold of up to 32 MiB with fresh ``mmap``s
and gives the top of the heap back to the kernel once more than twice that is free. A loader
allocates and frees the same big buffers every batch (decoded frames of 0.9 MB each, collated
batches of 29.5 MB per camera), so depending on the heap's layout those buffers are
page-faulted, zeroed and freed again every batch: measured as 0.3-1.1 ms of system time per
sample in the in-process row, varying from run to run. The settings below, applied with
``mallopt`` (the same as the environment variables
``MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TRIM_THRESHOLD_=1073741824`` at process start), keep
them in the heap. Forked DataLoader workers inherit them. Bench-only: the SDK never changes
the process's allocator.
"""

from __future__ import annotations

import ctypes
import ctypes.util

__all__ = ["ENV", "tune_glibc_malloc"]

#: The equivalent environment variables (read by glibc at process start).
ENV = {"MALLOC_MMAP_THRESHOLD_": str(32 << 20), "MALLOC_TRIM_THRESHOLD_": str(1 << 30)}

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3


def tune_glibc_malloc() -> None:
    """Set glibc's mmap threshold to 32 MiB (its maximum) and its trim threshold to 1 GiB.

    Raises:
        OSError: not glibc, or ``mallopt`` refused a value.
    """
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    if not hasattr(libc, "mallopt"):
        raise OSError("this C library has no mallopt (not glibc)")
    for param, value in ((_M_MMAP_THRESHOLD, 32 << 20), (_M_TRIM_THRESHOLD, 1 << 30)):
        if libc.mallopt(ctypes.c_int(param), ctypes.c_int(value)) != 1:
            raise OSError(f"mallopt({param}, {value}) failed")
