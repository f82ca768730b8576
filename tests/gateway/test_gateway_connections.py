"""Bounded work per connection (issue 46): uvicorn serves the gateway with a connection
limit, so clients that open connections and never finish a request cannot take every
socket; the worker's health server closes a connection that sends nothing."""

from __future__ import annotations

import asyncio

import httpx

from pyrula_stream.gateway import AppOptions, create_app
from pyrula_stream.gateway.serve import running_gateway
from pyrula_stream.runtime.health import start_health_server


async def test_connections_past_the_limit_are_refused_with_503() -> None:
    app = create_app(agents=["noagent"], options=AppOptions(max_connections=4))
    async with running_gateway(app) as url:
        host, port = url.removeprefix("http://").split(":")
        stalled = []
        for _ in range(4):  # each starts a request and never finishes its headers
            _reader, writer = await asyncio.open_connection(host, int(port))
            writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
            await writer.drain()
            stalled.append(writer)
        async with httpx.AsyncClient(base_url=url, timeout=30) as http:
            answer = await http.get("/healthz")
        for writer in stalled:
            writer.close()
    assert answer.status_code == 503


async def test_the_health_server_closes_a_connection_that_sends_nothing() -> None:
    server = await start_health_server("127.0.0.1", 0, lambda: True)
    port = server.sockets[0].getsockname()[1]
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        # a deadline for the test, well past the server's read timeout
        closed = await asyncio.wait_for(reader.read(), 30)
        writer.close()
    finally:
        server.close()
        await server.wait_closed()
    assert closed == b""
