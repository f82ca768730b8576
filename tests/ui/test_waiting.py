"""The UI's waiting view answers from one follower of the journals (issue 46): polling
``/api/waiting`` makes no consumer per request, and a question appears, then goes once
answered. A real worker on the real broker; httpx talks to the real UI server."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Awaitable, Callable
from typing import Any

import httpx

from pyrula_stream import AgentContext, KafkaAgentClient, WorkerOptions, kafka_agent
from pyrula_stream.llm import FakeLLM
from pyrula_stream.testing import running_worker, unique_name
from pyrula_stream.ui.feed import FeedOptions
from pyrula_stream.ui.server import UIApp, UIOptions, UIServer


async def until(check: Callable[[], Awaitable[bool]], what: str, timeout_s: float = 60) -> None:
    """Ask ``check`` (an HTTP poll, as the page does) until it says yes."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not await check():
        if asyncio.get_running_loop().time() > deadline:
            raise TimeoutError(what)
        await asyncio.sleep(0.2)  # the page polls too


async def test_the_waiting_view_reads_one_follower_not_one_per_poll(
    kafka_bootstrap_servers: str, client: KafkaAgentClient
) -> None:
    @kafka_agent(
        name=unique_name("uiwait"), llm=FakeLLM(["x"]), partitions=1, human_in_the_loop=True
    )
    async def agent(ctx: AgentContext) -> Any:
        return await ctx.interrupt({"ask": "ship it?"})

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    feed = FeedOptions(kafka_bootstrap_servers, agents=(agent.name,))
    ui = UIApp(feed, UIOptions(port=port))
    server = UIServer(ui)
    serving = asyncio.create_task(server.serve(sockets=[sock]))
    polls: list[dict[str, Any]] = []
    try:
        async with (
            running_worker(agent, kafka_bootstrap_servers, WorkerOptions(shutdown_grace=0.2)),
            httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30) as http,
        ):
            turn = await client.submit(agent.name)

            async def asked() -> bool:
                polls.append((await http.get("/api/waiting")).json())
                return any(q["turn_id"] == turn.turn_id for q in polls[-1]["questions"])

            await until(asked, "the question shows")
            question = next(q for q in polls[-1]["questions"] if q["turn_id"] == turn.turn_id)
            await client.approve(agent.name, turn.turn_id, question["key"])

            async def answered() -> bool:
                polls.append((await http.get("/api/waiting")).json())
                return all(q["turn_id"] != turn.turn_id for q in polls[-1]["questions"])

            await until(answered, "the answered question goes")
            for _ in range(5):
                polls.append((await http.get("/api/waiting")).json())
    finally:
        server.should_exit = True
        await serving
        sock.close()
    assert question["question"] == {"ask": "ship it?"}
    assert polls[-1]["errors"] == []
    assert ui.questions.consumers_made == 1, f"one consumer for {len(polls)} polls"
