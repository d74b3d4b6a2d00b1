"""A fault-injecting HTTP proxy on loopback, for the network-fault tests.

It sits between the SDK and a real server stub, forwards every request, and applies queued
faults to the requests whose path matches: 5xx bursts, 429 with ``Retry-After``, connection
resets mid-body, truncated bodies, flipped bits, stalls longer than the client's read timeout.
It also counts what it forwarded, so tests can assert that each blob was transferred once.
Every response closes its connection (``Connection: close``), which keeps the proxy simple and
makes every retry a fresh connection.
"""

from __future__ import annotations

import asyncio
import collections
import json
import random
import socket
import struct
import threading
from dataclasses import dataclass, field

import httpx

#: ``stall`` sends half the body, then nothing for ``stall_s`` (a resume with ``Range`` makes
#: progress); ``hang`` sends nothing at all for ``stall_s`` (a stalled server), then resets.
FAULTS = ("500", "503", "429", "reset", "truncate", "flip", "stall", "drop", "hang")


@dataclass
class Fault:
    kind: str
    match: str = "/blobs/"
    times: int = 1
    stall_s: float = 5.0
    retry_after_s: int = 1


@dataclass
class Stats:
    requests: collections.Counter[str] = field(default_factory=collections.Counter)
    transfers: collections.Counter[str] = field(default_factory=collections.Counter)
    #: blob GETs without ``Range`` (whole-blob downloads, not resumes) per hash
    whole: collections.Counter[str] = field(default_factory=collections.Counter)
    faults: collections.Counter[str] = field(default_factory=collections.Counter)


class FaultProxy:
    """``FaultProxy(upstream).url`` forwards to ``upstream``; ``add(Fault(...))`` queues faults.

    ``stats.requests`` counts requests per path, ``stats.transfers`` blob bodies the upstream
    served (200/206, faulted or not) per hash, ``stats.whole`` those asked for without
    ``Range``, ``stats.faults`` faults injected per kind.
    """

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream.rstrip("/")
        self.stats = Stats()
        #: seconds to sleep between 1 KiB chunks of blob bodies (slows pulls so kills land mid-transfer)
        self.throttle_s = 0.0
        #: fraction of all requests answered 503 or 429 with ``Retry-After: 1`` at random
        self.busy_rate = 0.0
        self._rng = random.Random(1234)
        self._faults: list[Fault] = []
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        self._ready.wait(10)
        self.url = f"http://127.0.0.1:{self.port}"

    # -- control -----------------------------------------------------------------------------
    def add(self, *faults: Fault) -> None:
        with self._lock:
            self._faults.extend(faults)

    def clear(self) -> None:
        with self._lock:
            self._faults.clear()

    def pending(self) -> int:
        with self._lock:
            return sum(f.times for f in self._faults)

    def _take(self, path: str) -> Fault | None:
        with self._lock:
            for f in self._faults:
                if f.match in path and f.times > 0:
                    f.times -= 1
                    if f.times == 0:
                        self._faults.remove(f)
                    self.stats.faults[f.kind] += 1
                    return f
        return None

    def close(self) -> None:
        """Stop serving, close the upstream client and the event loop (idempotent)."""
        if self._loop.is_closed():
            return

        async def shutdown() -> None:
            self._server.close()
            await self._client.aclose()
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(shutdown(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    def __enter__(self) -> FaultProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- serving -----------------------------------------------------------------------------
    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._client = httpx.AsyncClient(
            timeout=30, limits=httpx.Limits(max_keepalive_connections=0)
        )
        self._server = self._loop.run_until_complete(
            asyncio.start_server(self._handle, "127.0.0.1", 0)
        )
        self.port = self._server.sockets[0].getsockname()[1]
        self._ready.set()
        self._loop.run_forever()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
            writer.close()
            return
        lines = head.decode("latin-1").split("\r\n")
        method, target, _ = lines[0].split(" ", 2)
        headers = {}
        for line in lines[1:]:
            if ":" in line:
                k, v = line.split(":", 1)
                if k.strip().lower() not in ("host", "connection", "accept-encoding"):
                    headers[k.strip()] = v.strip()
        path = target.split("?", 1)[0]
        length = next((v for k, v in headers.items() if k.lower() == "content-length"), "0")
        try:  # a POST's body (the blob-URL batches) goes upstream with it
            body = await reader.readexactly(int(length)) if length.isdigit() else b""
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()
            return
        self.stats.requests[path] += 1
        fault = self._take(path)
        if fault is None and self.busy_rate and self._rng.random() < self.busy_rate:
            self.stats.faults["busy"] += 1
            fault = Fault(self._rng.choice(("503", "429")), retry_after_s=1)
        try:
            await self._respond(writer, method, target, headers, path, fault, body)
        except (ConnectionError, OSError):
            pass
        finally:
            if not writer.is_closing():
                writer.close()

    async def _respond(  # noqa: ANN001
        self, writer, method, target, headers, path, fault: Fault | None, content: bytes = b""
    ) -> None:
        if fault is not None and fault.kind in ("500", "503", "429"):
            extra = f"Retry-After: {fault.retry_after_s}\r\n" if fault.kind != "500" else ""
            await _json_error(
                writer, f"{fault.kind} Injected", "injected", "fault injected by test proxy", extra
            )
            return
        if fault is not None and fault.kind == "drop":
            _reset(writer)
            return
        if fault is not None and fault.kind == "hang":
            await asyncio.sleep(fault.stall_s)
            _reset(writer)
            return
        try:
            up = await self._client.request(
                method, self.upstream + target, headers=headers, content=content or None
            )
        except httpx.HTTPError:  # the upstream server is down: answer like a gateway would
            await _json_error(writer, "502 Bad Gateway", "bad_gateway", "upstream unreachable")
            return
        body = up.content
        if up.status_code in (200, 206) and "/blobs/" in path and method == "GET":
            self.stats.transfers[path.rsplit("/", 1)[-1]] += 1
            if not any(k.lower() == "range" for k in headers):
                self.stats.whole[path.rsplit("/", 1)[-1]] += 1
        out_headers = [
            (k, v)
            for k, v in up.headers.items()
            if k.lower()
            not in ("connection", "transfer-encoding", "content-length", "content-encoding")
        ]
        if fault is not None and fault.kind == "flip" and body:
            b = bytearray(body)
            b[len(b) // 2] ^= 0x10
            body = bytes(b)
        head = f"HTTP/1.1 {up.status_code} {up.reason_phrase}\r\n"
        head += "".join(f"{k}: {v}\r\n" for k, v in out_headers)
        head += f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
        writer.write(head.encode("latin-1"))
        if method == "HEAD":
            await writer.drain()
            return
        if fault is None or fault.kind == "flip" or len(body) < 2:
            step = 1024 if self.throttle_s and "/blobs/" in path else len(body) or 1
            for i in range(0, len(body), step):
                writer.write(body[i : i + step])
                await writer.drain()
                if step == 1024:
                    await asyncio.sleep(self.throttle_s)
            await writer.drain()
            return
        half = body[: len(body) // 2]
        writer.write(half)
        await writer.drain()
        if fault.kind == "reset":
            _reset(writer)
        elif fault.kind == "truncate":
            writer.close()
        elif fault.kind == "stall":
            await asyncio.sleep(fault.stall_s)
            _reset(writer)


async def _json_error(
    writer: asyncio.StreamWriter, status: str, code: str, message: str, extra_headers: str = ""
) -> None:
    """Answer with a JSON error body like the server stub's, then let the caller close."""
    body = json.dumps({"error": code, "message": message}).encode()
    writer.write(
        f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\n{extra_headers}"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
        + body
    )
    await writer.drain()


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with RST instead of FIN (SO_LINGER 0), like a crashed peer or middlebox."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.close()
