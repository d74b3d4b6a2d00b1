"""First-frame thumbnails for a slice's notebook repr, from blobs already in the cache.

A repr must be instant and must never fetch or fail: a camera whose video blob is not cached
is left out, and anything that goes wrong leaves the thumbnail out.
"""

from __future__ import annotations

import base64
import html
from typing import TYPE_CHECKING

from rayform.view._frames import frame_jpeg

if TYPE_CHECKING:
    from rayform._seams import ViewSource

__all__ = ["thumbnails_html"]


def thumbnails_html(slice_: ViewSource, height: int = 72) -> str:
    """``<img>`` tags (JPEG data URIs) of the first frame of every camera of the slice's first
    segment whose video is cached; ``""`` if there is none.

    Args:
        slice_: a :class:`~rayform.Slice` (or a ``select()`` view).
        height: displayed height in CSS pixels.
    """
    if not len(slice_):
        return ""
    seg = slice_.segments[0]
    tags = []
    for name, st in sorted(seg.streams.items()):
        if st.kind != "video" or slice_.would_fetch(st.blob):
            continue
        try:
            jpeg = frame_jpeg(slice_.blob_path(st.blob), 0, st.rate_hz, quality=6)
        except Exception:  # not cached offline, unreadable, undecodable: a repr shows less
            continue
        data = base64.b64encode(jpeg).decode("ascii")
        label = html.escape(f"{seg.id} {name}, first frame")
        tags.append(
            f'<img src="data:image/jpeg;base64,{data}" alt="{label}" title="{label}" '
            f'height="{int(height)}" style="margin:2px">'
        )
    return f"<div>{''.join(tags)}</div>" if tags else ""
