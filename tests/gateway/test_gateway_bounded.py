"""Bounded work per request (issue 46): uvicorn serves the gateway with a connection
limit, so clients that open connections and never finish a request cannot take every
socket; the worker's health server closes a connection that sends nothing; asking again
for a turn that is not there does not scan its turns partition again."""

from __future__ import annotations

import asyncio

import httpx

from pyrula_stream.access.api_keys import APIKeyAuth
from pyrula_stream.gateway import AppOptions, create_app
from pyrula_stream.gateway.serve import running_gateway
from pyrula_stream.gateway.served import Gateway
from pyrula_stream.kafka.admin import agent_topic_specs, apply_topics
from pyrula_stream.runtime.health import start_health_server
from pyrula_stream.testing import unique_name

WEB = "k-web-0123456789abcdef0123456789abcdef"


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


async def test_a_missing_turn_is_read_once_not_once_per_request(
    kafka_bootstrap_servers: str,
) -> None:
    name = unique_name("gwmiss")
    await asyncio.to_thread(
        apply_topics, kafka_bootstrap_servers, agent_topic_specs(name, partitions=1)
    )
    options = AppOptions(bootstrap_servers=kafka_bootstrap_servers, auth=APIKeyAuth({"web": WEB}))
    app = create_app(agents=[name], options=options)
    gateway: Gateway = app.state.gateway
    async with (
        running_gateway(app) as url,
        httpx.AsyncClient(base_url=url, timeout=30) as http,
    ):
        answers = [
            await http.get(
                f"/agents/{name}/turns/no-such-turn",
                headers={"Authorization": f"Bearer {WEB}"},
            )
            for _ in range(5)
        ]
    assert [a.status_code for a in answers] == [404] * 5
    assert gateway.owners.reads == 1
