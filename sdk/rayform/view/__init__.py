"""``rayform view``: look at a slice in a local web browser before training on it.

::

    rayform view slc_7c1e04aa            # prints http://127.0.0.1:PORT/?key=...; Ctrl-C stops

    server = rayform.view.serve(slice_)  # the same from Python, served from a thread
    print(server.url); server.stop()

The page lists the slice's episodes (paged and filtered on the server), plays every camera of
one episode in sync by the recorded frame times, plots the table streams with a cursor, opens
deep links (``&segment=ID&t=SECONDS``) and turns a selection into the ``slice_.select(...)``
call. Blobs come from the client's cache, fetched on demand unless the client is offline; the
token never reaches the page. Needs the ``view`` extra (``pip install "rayform[view]"``: PyAV
for the decoded-frame path). See docs/view.md.
"""

from __future__ import annotations

import html
import ipaddress
from typing import TYPE_CHECKING

from rayform.view._api import ViewAPI, ViewError
from rayform.view._server import ViewServer
from rayform.view._thumbs import thumbnails_html

if TYPE_CHECKING:
    from rayform._seams import ViewSource

__all__ = [
    "ViewAPI",
    "ViewError",
    "ViewLink",
    "ViewServer",
    "is_loopback",
    "serve",
    "show",
    "thumbnails_html",
]


def is_loopback(host: str) -> bool:
    """Whether ``host`` only listens for this machine (``127.0.0.1``, ``::1``, ``localhost``)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def serve(
    slice_: ViewSource,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    frames: bool = False,
    quiet: bool = True,
) -> ViewServer:
    """Serve the viewer of ``slice_`` from a daemon thread.

    Args:
        slice_: a :class:`~rayform.Slice` (or a ``select()`` view of one).
        host: address to listen on; anything but loopback lets other machines in (with the
            URL's secret).
        port: TCP port; 0 (the default) takes a free one.
        frames: serve cameras as decoded JPEG frames instead of their MP4 files (for browsers
            that cannot play the stored codec).
        quiet: log nothing but faults.

    Returns:
        The running :class:`ViewServer`; ``.url`` is the page, ``.stop()`` ends it.
    """
    return ViewServer(ViewAPI(slice_, frames=frames), host, port, quiet=quiet).start()


def show(slice_: ViewSource, *, host: str = "127.0.0.1", port: int = 0) -> ViewLink:
    """Start the viewer of ``slice_`` from a thread and return its link (``Slice.show()``).

    Args:
        slice_: a :class:`~rayform.Slice` (or a ``select()`` view of one).
        host: address to listen on (default: this machine only).
        port: TCP port; 0 takes a free one.

    Returns:
        A :class:`ViewLink`: Jupyter displays it as the link; ``.url`` is the page (with its
        key), ``.stop()`` ends the server.
    """
    return ViewLink(serve(slice_, host=host, port=port))


class ViewLink:
    """What ``Slice.show()`` returns: a running viewer that Jupyter displays as its link."""

    def __init__(self, server: ViewServer) -> None:
        self.server = server
        self.url = server.url

    def stop(self) -> None:
        """Stop the viewer."""
        self.server.stop()

    def __repr__(self) -> str:
        return f"<rayform view of {self.server.api.slice.id} at {self.url}>"

    def _repr_html_(self) -> str:
        url = html.escape(self.url, quote=True)
        return (
            f'<a href="{url}" target="_blank" rel="noopener">Open the viewer of '
            f"{html.escape(self.server.api.slice.id)}</a> <code>{url}</code>"
        )
