"""The client's sockets: an asyncio Protocol under httpx/httpcore/h11, in place of anyio.

httpx speaks HTTP through httpcore and h11 over a *network backend*; the default one (anyio)
opens a cancel scope, asks sniffio which event loop runs and maps exceptions on every read,
for every streamed chunk. This backend reads from a plain asyncio Protocol's buffer instead:
measured with benchmarks.client_capacity's setup (C = 64 streams, a chunk every 10 ms,
uvloop, 3 alternated runs) it took 39-47 µs of client CPU per chunk against 69-83 µs with
anyio. HTTP is still httpx's, httpcore's and h11's: requests, responses, keep-alive and errors
are theirs; only the bytes move differently.

Used for plain http:// only (vLLM's API server on a host or private network); https:// keeps
httpx's own backend, TLS and all. Per-read and per-write timeouts are not applied here: the
client bounds every request as a whole (CompletionClient's timeout_s), and a timer per chunk is
the cost this exists to avoid. Connecting keeps its timeout.
"""

from __future__ import annotations

import asyncio
import socket
from typing import Any, Iterable, Optional

import httpcore
import httpx
from httpcore._utils import is_socket_readable

HIGH_WATER = 1 << 20  # bytes buffered unread before the socket stops being read


class _Protocol(asyncio.Protocol):
    def __init__(self) -> None:
        self.buf = bytearray()
        self.eof = False
        self.exc: Optional[BaseException] = None
        self.waiter: Optional[asyncio.Future] = None
        self.writable: Optional[asyncio.Future] = None
        self.transport: Optional[asyncio.Transport] = None
        self.reading_paused = False

    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buf += data
        if len(self.buf) > HIGH_WATER and not self.reading_paused:
            self.transport.pause_reading()
            self.reading_paused = True
        self._wake()

    def eof_received(self) -> bool:
        self.eof = True
        self._wake()
        return False  # close the transport

    def connection_lost(self, exc: Optional[BaseException]) -> None:
        self.eof, self.exc = True, exc
        self._wake()
        self.resume_writing()

    def pause_writing(self) -> None:
        if self.writable is None or self.writable.done():
            self.writable = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        if self.writable is not None and not self.writable.done():
            self.writable.set_result(None)

    def _wake(self) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)


class _Stream(httpcore.AsyncNetworkStream):
    def __init__(self, transport: asyncio.Transport, protocol: _Protocol) -> None:
        self.transport, self.p = transport, protocol

    async def read(self, max_bytes: int, timeout: Optional[float] = None) -> bytes:
        p = self.p
        while not p.buf:
            if p.eof:
                if p.exc is not None:
                    raise httpcore.ReadError(f"{type(p.exc).__name__}: {p.exc}")
                return b""  # the peer closed: httpcore says what that means
            p.waiter = asyncio.get_running_loop().create_future()
            try:
                await p.waiter
            finally:
                p.waiter = None
        if len(p.buf) <= max_bytes:
            data = bytes(p.buf)
            p.buf.clear()
        else:
            data = bytes(p.buf[:max_bytes])
            del p.buf[:max_bytes]
        if p.reading_paused and len(p.buf) < HIGH_WATER // 2:
            p.reading_paused = False
            self.transport.resume_reading()
        return data

    async def write(self, buffer: bytes, timeout: Optional[float] = None) -> None:
        if not buffer:
            return
        if self.transport.is_closing():
            raise httpcore.WriteError("the connection is closed")
        self.transport.write(buffer)
        if self.p.writable is not None and not self.p.writable.done():
            await self.p.writable
            if self.p.exc is not None:
                raise httpcore.WriteError(f"{type(self.p.exc).__name__}: {self.p.exc}")

    async def aclose(self) -> None:
        self.transport.close()

    def get_extra_info(self, info: str) -> Any:
        if info == "socket":
            return self.transport.get_extra_info("socket")
        if info == "is_readable":  # an idle keep-alive connection the server has closed
            sock = self.transport.get_extra_info("socket")
            return bool(self.p.eof or self.p.buf or (sock is not None and is_socket_readable(sock)))
        if info == "client_addr":
            return self.transport.get_extra_info("sockname")
        if info == "server_addr":
            return self.transport.get_extra_info("peername")
        return None  # ssl_object: plain TCP has none


class AsyncioBackend(httpcore.AsyncNetworkBackend):
    async def connect_tcp(self, host: str, port: int, timeout: Optional[float] = None,
                          local_address: Optional[str] = None,
                          socket_options: Optional[Iterable] = None) -> httpcore.AsyncNetworkStream:
        loop = asyncio.get_running_loop()
        try:
            transport, protocol = await asyncio.wait_for(loop.create_connection(
                _Protocol, host, port,
                local_addr=(local_address, 0) if local_address else None), timeout)
        except asyncio.TimeoutError as e:
            raise httpcore.ConnectTimeout(f"no connection to {host}:{port} in {timeout} s") from e
        except OSError as e:
            raise httpcore.ConnectError(str(e)) from e
        sock = transport.get_extra_info("socket")
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # as anyio does
        for opt in socket_options or ():
            sock.setsockopt(*opt)
        return _Stream(transport, protocol)

    async def connect_unix_socket(self, path: str, timeout: Optional[float] = None,
                                  socket_options: Optional[Iterable] = None):
        raise httpcore.ConnectError("unix sockets: not supported by k25exp's client backend")

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


def use_asyncio_sockets(client: httpx.AsyncClient) -> bool:
    """Puts AsyncioBackend under `client`'s connection pool (httpx builds the pool with its
    default backend and offers no argument for another). False, changing nothing, when the
    pool is not where httpx 0.28 keeps it: then the client runs on httpx's own backend, as the
    tag says (CompletionClient.socket_layer), and a test of this module fails."""
    pool = getattr(getattr(client, "_transport", None), "_pool", None)
    if pool is None or not hasattr(pool, "_network_backend"):
        return False
    pool._network_backend = AsyncioBackend()
    return True
