"""The client's own socket layer under httpx (k25exp.load.sockets), against raw loopback
servers whose behaviour is known: keep-alive connections the server closes while idle, bodies
larger than its read buffer in both directions, a refused connection."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from k25exp.load.client import CompletionClient
from k25exp.serving.ports import free_port
from k25exp.load.sockets import HIGH_WATER, AsyncioBackend


async def _serve(handler):
    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    return server, f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"


async def _read_request(reader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    n = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
              if line.lower().startswith(b"content-length:")), 0)
    return await reader.readexactly(n)


def test_plain_http_lanes_run_on_the_asyncio_backend_and_https_keeps_httpx_own():
    async def go():
        async with CompletionClient("http://127.0.0.1:9", "m") as c:
            c.prepare(2)
            lanes = [c._take(), c._take()]
            backends = {type(lane._transport._pool._network_backend) for lane in lanes}
            assert backends == {AsyncioBackend}  # fails if httpx moves its pool: a tag would say
            assert c.socket_layer.startswith("asyncio protocol")
        async with CompletionClient("https://gpu-box:8443", "m") as c:
            assert c.socket_layer == "httpx's default (anyio)"

    asyncio.run(go())


def test_a_keep_alive_connection_the_server_closed_while_idle_is_not_reused():
    """The server answers each request, then closes the connection 50 ms later. The second
    request, 200 ms on, must get a new connection, not fail on the dead one."""
    conns = []

    async def handler(reader, writer):
        conns.append(writer)
        await _read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
        await writer.drain()
        await asyncio.sleep(0.05)
        writer.close()

    async def go():
        server, url = await _serve(handler)
        async with server, httpx.AsyncClient(base_url=url) as http:
            from k25exp.load.sockets import use_asyncio_sockets

            assert use_asyncio_sockets(http)
            r1 = await http.get("/a")
            await asyncio.sleep(0.2)
            r2 = await http.get("/b")
        return r1, r2

    r1, r2 = asyncio.run(go())
    assert (r1.status_code, r1.text, r2.status_code, r2.text) == (200, "ok", 200, "ok")
    assert len(conns) == 2


def test_bodies_beyond_the_read_buffer_arrive_whole_both_ways():
    big_out = bytes(range(256)) * (3 * HIGH_WATER // 256)  # 3 MiB response
    big_in = b"x" * (8 << 20)  # an 8 MiB request: the socket's buffer fills, writing waits

    async def handler(reader, writer):
        body = await _read_request(reader)
        await asyncio.sleep(0.1)  # let the client's reads pile up first
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\nx-got: %d\r\n\r\n"
                     % (len(big_out), len(body)))
        writer.write(big_out)
        await writer.drain()
        writer.close()

    async def go():
        server, url = await _serve(handler)
        async with server, httpx.AsyncClient(base_url=url) as http:
            from k25exp.load.sockets import use_asyncio_sockets

            use_asyncio_sockets(http)
            async with http.stream("POST", "/", content=big_in) as r:
                await asyncio.sleep(0.3)  # unread: reading pauses past the high-water mark
                got = b"".join([x async for x in r.aiter_raw()])
            return r.headers["x-got"], got

    got_in, got_out = asyncio.run(go())
    assert int(got_in) == len(big_in) and got_out == big_out


def test_a_refused_connection_is_httpx_connect_error():
    async def go():
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{free_port()}") as http:
            from k25exp.load.sockets import use_asyncio_sockets

            use_asyncio_sockets(http)
            await http.get("/")

    with pytest.raises(httpx.ConnectError):
        asyncio.run(go())
