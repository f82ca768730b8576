"""``MCPServer(requires_approval=...)`` gates those MCP tools for a reviewer, for an agent
bound with ``human_in_the_loop=True``; the other tools of the server run as before."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from pyrula_stream import AgentContext, Event, KafkaAgentClient, WorkerOptions, kafka_agent
from pyrula_stream.llm import FakeLLM, reply_tool_call
from pyrula_stream.testing import running_worker, unique_name
from tests.mcp_servers.processes import OrderServer


@pytest.fixture(scope="module")
def orders() -> Iterator[OrderServer]:
    server = OrderServer().start()
    yield server
    server.kill()


async def test_a_gated_mcp_tool_asks_and_runs_only_when_approved(
    kafka_bootstrap_servers: str, client: KafkaAgentClient, orders: OrderServer
) -> None:
    script = [
        reply_tool_call("orders_lookup", order_id="9"),
        reply_tool_call("orders_refund", order_id="9", cents=250),
        "refunded",
    ]

    @kafka_agent(
        name=unique_name("mcp-gate"),
        llm=FakeLLM(script),
        mcp_servers=[orders.declaration(requires_approval=("refund",))],
        partitions=1,
        human_in_the_loop=True,
    )
    async def agent(ctx: AgentContext) -> str:
        return await ctx.llm.run([{"role": "user", "content": "refund order 9"}])

    seen: list[Event] = []
    async with running_worker(agent, kafka_bootstrap_servers, WorkerOptions(shutdown_grace=0.2)):
        handle = await client.submit(agent.name)

        async def until_asked() -> Event:
            async for event in client.stream(agent.name, handle.turn_id):
                seen.append(event)
                if event.type == "run:interrupted":
                    return event
            raise AssertionError([(e.type, e.data) for e in seen])

        asked = await asyncio.wait_for(until_asked(), 60)
        assert asked.data["tool_name"] == "orders_refund"
        assert asked.data["tool_input"] == {"order_id": "9", "cents": 250}
        starts = [e.data["tool"] for e in seen if e.type == "tool:start"]
        assert starts == ["orders_lookup"], "the ungated lookup ran, the refund waits"
        await client.approve(agent.name, handle.turn_id, asked.data["key"], sender="ana")
        events = [e async for e in client.stream(agent.name, handle.turn_id)]
    results = [e.data for e in events if e.type == "tool:result"]
    assert [r["tool"] for r in results] == ["orders_lookup", "orders_refund"]
    assert results[1]["approval"] == "approved" and results[1]["answered_by"] == "ana"
    assert "refunded 250 cents" in results[1]["output"]
    assert events[-1].type == "run:complete"
