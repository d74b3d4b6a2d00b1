"""A throttled loopback "link" for the streaming benchmark: bandwidth and latency on TCP.

``Link(rate_bps, latency_s)`` forwards local ports to upstream ports byte for byte (HTTP
headers, ``Host`` included, pass untouched, so presigned SigV4 URLs still verify). Every byte
that flows back to the client, on every forwarded port, draws from one token bucket of
``rate_bps`` bytes per second (one shared link); every chunk the client sends is held
``latency_s`` first (a round trip's worth of delay per request). ``rate_bps=None`` forwards
at full speed. ``bytes_down`` counts what reached the client.
"""

from __future__ import annotations

import asyncio
import threading
import time

__all__ = ["Link"]

_CHUNK = 64 << 10


class _Bucket:
    def __init__(self, rate_bps: float | None) -> None:
        self.rate = rate_bps
        self.level = 0.0
        self.t = time.monotonic()

    async def take(self, n: int) -> None:
        if self.rate is None:
            return
        while True:
            now = time.monotonic()
            self.level = min(
                self.rate * 0.05, self.level + (now - self.t) * self.rate
            )  # 50 ms burst
            self.t = now
            if self.level >= n or self.level >= self.rate * 0.05:
                self.level -= n
                return
            await asyncio.sleep((n - self.level) / self.rate)


class Link:
    """Throttled TCP forwarding on 127.0.0.1, run in its own thread with one event loop."""

    def __init__(self, rate_bps: float | None, latency_s: float = 0.0) -> None:
        self.rate_bps = rate_bps
        self.latency_s = latency_s
        self.bytes_down = 0
        self._loop = asyncio.new_event_loop()
        self._bucket = _Bucket(rate_bps)
        self._servers: list[asyncio.AbstractServer] = []
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        assert self._thread.ident is not None
        #: The forwarding thread's ID (its CPU time: ``time.pthread_getcpuclockid``).
        self.thread_id: int = self._thread.ident

    def forward(self, upstream_port: int) -> int:
        """Start forwarding a new local port to ``127.0.0.1:upstream_port``; returns the port."""

        async def start() -> int:
            server = await asyncio.start_server(
                lambda r, w: self._handle(r, w, upstream_port), "127.0.0.1", 0
            )
            self._servers.append(server)
            return int(server.sockets[0].getsockname()[1])

        return asyncio.run_coroutine_threadsafe(start(), self._loop).result(10)

    async def _handle(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, port: int
    ) -> None:
        try:
            up_r, up_w = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            writer.close()
            return

        async def up() -> None:  # client -> server, delayed
            try:
                while data := await reader.read(_CHUNK):
                    if self.latency_s:
                        await asyncio.sleep(self.latency_s)
                    up_w.write(data)
                    await up_w.drain()
            except (ConnectionError, OSError):
                pass
            finally:
                up_w.close()

        async def down() -> None:  # server -> client, rate-limited
            try:
                while data := await up_r.read(_CHUNK):
                    await self._bucket.take(len(data))
                    writer.write(data)
                    self.bytes_down += len(data)
                    await writer.drain()
            except (ConnectionError, OSError):
                pass
            finally:
                writer.close()

        try:
            await asyncio.gather(up(), down())
        except asyncio.CancelledError:  # the link is closing
            up_w.close()
            writer.close()

    def set_rate(self, rate_bps: float | None) -> None:
        """Change the bandwidth (the shared bucket starts empty)."""
        self._loop.call_soon_threadsafe(setattr, self, "_bucket", _Bucket(rate_bps))
        self.rate_bps = rate_bps

    def close(self) -> None:
        async def stop() -> None:
            for s in self._servers:
                s.close()
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()
