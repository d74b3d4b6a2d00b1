"""The dataset's epoch, visible to forked DataLoader workers.

``persistent_workers=True`` keeps the workers' copy of the dataset for the whole run, so a
plain attribute set by ``dataset.set_epoch`` in the main process would never reach them and
their random transforms would keep the epoch they started with. The epoch therefore lives in
8 bytes of anonymous shared memory (``mmap(-1, 8)``: ``MAP_SHARED | MAP_ANONYMOUS``, no file
descriptor), which forked workers share with the main process. ``set_epoch`` must be called
before iterating the loader (as usual), because workers read it when they build a sample.
Pickling (spawned workers) carries the current value into a fresh private map.
"""

from __future__ import annotations

import mmap
import struct
from typing import Any

__all__ = ["SharedEpoch"]

_FMT = "<q"


class SharedEpoch:
    """An int64 shared between a process and the children it forks."""

    def __init__(self, value: int = 0) -> None:
        self._open(value)

    def _open(self, value: int) -> None:
        self._map = mmap.mmap(-1, struct.calcsize(_FMT))
        self.set(value)

    def get(self) -> int:
        return int(struct.unpack_from(_FMT, self._map, 0)[0])

    def set(self, value: int) -> None:
        struct.pack_into(_FMT, self._map, 0, int(value))

    def __getstate__(self) -> dict[str, Any]:
        return {"value": self.get()}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._open(state["value"])
