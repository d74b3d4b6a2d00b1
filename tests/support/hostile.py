"""A hostile Rayform server on loopback, for ``test_hostile_server.py``.

:class:`HostileServer` is a real HTTP server (``http.server`` in a thread) that speaks the
wire protocol of ``docs/protocol.md``: a test scripts its answer to each path with
:class:`Answer` (status, headers, a body sent whole, trickled, endlessly, or gzip-encoded), and
anything unscripted is served honestly from a real data root, so each case changes one thing.
:func:`crafted_slice` publishes manifest bytes under their correct hash, which is what a
compromised server can do: the hash proves the bytes are the ones it chose, nothing more.

:func:`cache_names_ok` states what may appear in a client cache after any answer: only names
that are a hash, a slice ID or one of the documented temporary and lock names.
"""

from __future__ import annotations

import gzip
import json
import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from rayform.format import canonical_json, hash_bytes

__all__ = [
    "Answer",
    "HostileServer",
    "cache_names_ok",
    "crafted_slice",
    "gzip_bomb",
    "has_control",
    "page_bytes",
    "v2_root",
]

#: File names a cache may hold (docs/cache.md): blobs and manifests by hash, refs by slice
#: ID, lock and claim files (and a stale claim its taker moved aside), a store's recorded
#: stall (``<server>.<host>.outage``, ``rayform._net._outage``), the page check marks of
#: each user (``checked/u<uid>/<hash>``, ``rayform.manifest._checkmarks``), the ledger of the
#: processes that use the cache (``live/ledger``, ``rayform.cache._live``), the pins of live
#: readers (``pins/<hash>.<host>.<pid>.<lease>-<mark>``, ``rayform.cache._pinmarks``), the
#: label-set heads last read (``labels/<endpoint-key>/<slice>/<manifest hash>``,
#: ``rayform.curation._remote``), and
#: temporary files (``<hash>.<host>.<pid>.<random>.part``, or ``.<stem>.<pid>.<random>.tmp`` from
#: ``rayform.files.unique_tmp_name``).
_CACHE_NAME = re.compile(
    r"[0-9a-f]{64}|[0-9a-f]{64}\.lock|slc_[0-9a-f]{8,64}|[0-9a-f]{2}|[A-Za-z0-9_.-]+-[0-9a-f]{8}"
    r"|[0-9a-f]{64}\.[A-Za-z0-9_.-]+\.[0-9]+\.[0-9a-f]+\.part|\.[A-Za-z0-9_.-]+\.[0-9]+\.[0-9a-f]+\.tmp"
    r"|[0-9a-f]{64}\.claim|[0-9a-f]{64}\.claim\.[A-Za-z0-9_.-]+\.[0-9]+\.[0-9a-f]+\.stale"
    r"|[A-Za-z0-9_.-]+-[0-9a-f]{8}\.[A-Za-z0-9_.-]+\.outage"
    r"|[0-9a-f]{64}\.[A-Za-z0-9_.-]+\.[0-9]+\.[0-9a-f]+-[0-9a-f]+"
    r"|blobs|manifests|refs|labels|tmp|locks|claims|checked|live|ledger|pins|u[0-9]+"
    r"|[a-z_]+\.(json|db|lock)"
)
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def has_control(text: str) -> bool:
    """Whether ``text`` holds a control character a terminal may act on (newline and tab
    excepted)."""
    return bool(_CONTROL.search(text))


def cache_names_ok(cache: Path) -> list[str]:
    """Paths under ``cache`` whose name is not a documented cache name (``[]`` when fine)."""
    if not cache.exists():
        return []
    return [
        str(p.relative_to(cache)) for p in cache.rglob("*") if not _CACHE_NAME.fullmatch(p.name)
    ]


def gzip_bomb(expanded: int) -> bytes:
    """``expanded`` zero bytes, gzip-compressed (about 1,000 times smaller)."""
    return gzip.compress(b"\0" * expanded, compresslevel=9)


@dataclass
class Answer:
    """What the server answers to one path.

    Attributes:
        status: HTTP status.
        body: the body bytes.
        headers: extra headers (``Content-Length`` is added for a whole body unless given).
        trickle_bps: send the body at this many bytes per second (then no Content-Length).
        endless: after ``body``, send zeros until the client hangs up (no Content-Length).
        head_byte_s: send the status line and headers one byte every this many seconds.
    """

    status: int = 200
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)
    trickle_bps: float | None = None
    endless: bool = False
    head_byte_s: float | None = None

    @classmethod
    def json(cls, doc: object, status: int = 200, **kw: object) -> Answer:
        """An answer whose body is ``doc`` as JSON (already-encoded ``bytes`` pass through)."""
        body = doc if isinstance(doc, bytes) else json.dumps(doc).encode()
        return cls(status, body, {"Content-Type": "application/json"}, **kw)  # type: ignore[arg-type]


class HostileServer:
    """A scripted HTTP server on 127.0.0.1 with a fallback to a real data root.

    Args:
        root: a data root whose slices, manifests, pages and blobs are served honestly for
            any path not in :attr:`answers`.

    Attributes:
        answers: path (e.g. ``/v1/slices/slc_7c1e04aa``; ``POST /v1/slices`` for a write) ->
            :class:`Answer`.
        requests: the paths asked for, in order.
    """

    def __init__(self, root: Path) -> None:
        self.root = root
        self.answers: dict[str, Answer] = {}
        self.requests: list[str] = []
        self._stop = threading.Event()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                # A write: the body is read and dropped; only scripted answers (else 404).
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                server.requests.append(f"POST {self.path}")
                answer = server.answers.get(f"POST {self.path}") or Answer.json(
                    {"error": "not_found", "message": "unknown path"}, 404
                )
                try:
                    server.send(self, answer)
                except (BrokenPipeError, ConnectionResetError):
                    pass

            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                server.requests.append(self.path)
                answer = server.answers.get(self.path) or server.honest(self.path)
                try:
                    server.send(self, answer)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client hung up: that is the point of several cases

            def log_message(self, *args: object) -> None:
                pass

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._httpd.server_address[1]}"
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop serving; trickling and endless answers end at once."""
        self._stop.set()
        self._httpd.shutdown()
        self._httpd.server_close()

    def send(self, handler: BaseHTTPRequestHandler, answer: Answer) -> None:
        whole = answer.trickle_bps is None and not answer.endless
        headers = dict(answer.headers)
        if whole:
            headers.setdefault("Content-Length", str(len(answer.body)))
        headers["Connection"] = "close"
        if answer.head_byte_s is not None:
            head = f"HTTP/1.1 {answer.status} Slow\r\n" + "".join(
                f"{name}: {value}\r\n" for name, value in headers.items()
            )
            for byte in (head + "\r\n").encode("latin-1"):
                if self._stop.wait(answer.head_byte_s):
                    return
                handler.wfile.write(bytes([byte]))
                handler.wfile.flush()
        else:
            handler.send_response(answer.status)
            for name, value in headers.items():
                handler.send_header(name, value)
            handler.end_headers()
        for chunk in self._chunks(answer):
            handler.wfile.write(chunk)
            handler.wfile.flush()

    def _chunks(self, answer: Answer) -> Iterator[bytes]:
        if answer.trickle_bps is not None:
            step = max(1, int(answer.trickle_bps / 4))
            for i in range(0, len(answer.body), step):
                if self._stop.wait(step / answer.trickle_bps):
                    return
                yield answer.body[i : i + step]
            return
        yield answer.body
        while answer.endless and not self._stop.is_set():
            yield bytes(65536)

    def honest(self, path: str) -> Answer:
        """What a well-behaved server answers to ``path`` from :attr:`root`."""
        parts = path.split("?")[0].strip("/").split("/")
        if parts[:2] != ["v1", "slices"]:
            return Answer.json({"error": "not_found", "message": "unknown path"}, 404)
        if len(parts) == 2:
            slices = [
                json.loads(p.read_bytes()) for p in sorted((self.root / "slices").glob("*.json"))
            ]
            return Answer.json(
                {
                    "slices": [
                        {
                            "id": s["id"],
                            "manifest": s["manifest"],
                            "description": s.get("description", ""),
                        }
                        for s in slices
                    ]
                }
            )
        if len(parts) == 5 and parts[3] in ("pages", "blobs"):  # by hash, whatever the slice
            folder = "manifests" if parts[3] == "pages" else "blobs"
            path_ = self.root / folder / parts[4][:2] / parts[4]
            if path_.is_file():
                return Answer(200, path_.read_bytes())
        ref_path = self.root / "slices" / f"{parts[2]}.json"
        if not ref_path.is_file():
            return Answer.json({"error": "not_found", "message": f"no slice {parts[2]}"}, 404)
        ref = json.loads(ref_path.read_bytes())
        manifest = self.root / "manifests" / ref["manifest"][:2] / ref["manifest"]
        if len(parts) == 3:
            return Answer.json(
                {
                    "id": ref["id"],
                    "manifest": ref["manifest"],
                    "manifest_size": manifest.stat().st_size,
                    "description": ref.get("description", ""),
                }
            )
        if len(parts) == 4 and parts[3] == "manifest":
            return Answer(200, manifest.read_bytes())
        return Answer.json({"error": "not_found", "message": "not found"}, 404)


def crafted_slice(
    server: HostileServer,
    slice_id: str,
    manifest: bytes,
    *,
    description: str = "crafted",
    pages: dict[str, bytes] | None = None,
) -> str:
    """Serve ``manifest`` (and v2 ``pages`` by hash) as slice ``slice_id``, correctly hashed;
    returns the manifest's hash."""
    digest = hash_bytes(manifest)
    base = f"/v1/slices/{slice_id}"
    server.answers[base] = Answer.json(
        {
            "id": slice_id,
            "manifest": digest,
            "manifest_size": len(manifest),
            "description": description,
        }
    )
    server.answers[base + "/manifest"] = Answer(200, manifest)
    for page_hash, page in (pages or {}).items():
        server.answers[f"{base}/pages/{page_hash}"] = Answer(200, page)
    return digest


def page_bytes(table: Any, compression: str | None = None) -> bytes:
    """``table`` (of the page schema, any content) as an Arrow IPC file, unchecked."""
    import pyarrow as pa
    import pyarrow.ipc  # noqa: F401

    sink = pa.BufferOutputStream()
    options = pa.ipc.IpcWriteOptions(compression=compression)
    with pa.ipc.new_file(sink, table.schema, options=options) as writer:
        writer.write_table(table)
    return bytes(sink.getvalue().to_pybytes())


def v2_root(honest_root: dict[str, Any], page_list: list[bytes], **changes: Any) -> bytes:
    """A v2 root like ``honest_root`` but listing ``pages`` (one page: the same segments)."""
    doc = dict(honest_root, **changes)
    if "pages" not in changes:
        n = doc["summary"]["segments"]
        doc["pages"] = [{"hash": hash_bytes(p), "size": len(p), "segments": n} for p in page_list]
    return canonical_json(doc)
