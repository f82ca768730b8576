"""MCP tools across worker changes: a replay uses the journaled tool list and recorded
calls with the server down; a live call to a down server is an error the model reads;
the pool reconnects once the server is back. Over streamable HTTP and stdio."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pyrula_stream import (
    AgentContext,
    Event,
    KafkaAgentClient,
    MCPServer,
    ToolContext,
    WorkerOptions,
    kafka_agent,
    tool,
)
from pyrula_stream.llm import FakeLLM, ModelResponse, ToolDefinition, reply_text, reply_tool_call
from pyrula_stream.llm.fake import count_model_calls
from pyrula_stream.runtime.replay import replay_turn
from pyrula_stream.state.history import export_turn
from pyrula_stream.testing import running_worker, unique_name, wait_for
from tests.mcp_servers.processes import OrderServer, stdio_declaration

QUICK_STOP = WorkerOptions(shutdown_grace=0.2)
V1_TOOLS = [
    "hold",
    "orders_lookup",
    "orders_refund",
    "orders_broken",
    "orders_whoami",
    "orders_call_count",
]


class Script:
    """The model: a reply per model call index; remembers which calls really ran."""

    def __init__(self, replies: list[ModelResponse | str]) -> None:
        self.replies = replies
        self.calls: list[int] = []
        self.offered: dict[int, list[str]] = {}

    def __call__(self, messages: list[dict[str, Any]], tools: list[ToolDefinition]) -> Any:
        index = count_model_calls(messages)
        self.calls.append(index)
        self.offered[index] = [t.name for t in tools]
        reply = self.replies[index]
        return reply_text(reply) if isinstance(reply, str) else reply


class Gate:
    """A local tool that holds the turn until the test opens the gate."""

    def __init__(self) -> None:
        self.started = 0
        self.open = asyncio.Event()

        @tool
        async def hold(ctx: ToolContext) -> str:
            """Wait for the test."""
            self.started += 1
            await self.open.wait()
            return "released"

        self.tool = hold


class Transport:
    """One MCP transport: a declaration, and a way to take the server down."""

    def __init__(self, kind: str, tmp_path: Path) -> None:
        self.kind = kind
        self.flag = tmp_path / "down"
        self.http = OrderServer().start() if kind == "http" else None

    def declaration(self, toolset: str = "v1", retry: int = 0) -> MCPServer:
        if self.http is not None:
            return self.http.declaration(retry=retry)
        return stdio_declaration(toolset=toolset, down_flag=self.flag, retry=retry)

    def take_down(self) -> None:
        if self.http is not None:
            self.http.kill()
        self.flag.write_text("down")

    def replace(self, toolset: str) -> None:
        """Serve ``toolset`` from now on (same URL for HTTP)."""
        if self.http is not None:
            self.http.kill()
            self.http = OrderServer(toolset=toolset, port=self.http.port).start()

    def close(self) -> None:
        if self.http is not None:
            self.http.kill()


@pytest.fixture(params=["http", "stdio"])
def transport(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Transport]:
    t = Transport(request.param, tmp_path)
    yield t
    t.close()


async def collect(client: KafkaAgentClient, agent: str, turn_id: str) -> list[Event]:
    return [e async for e in client.stream(agent, turn_id)]


def make_agent(name: str, script: Script, gate: Gate, server: MCPServer) -> Any:
    @kafka_agent(
        name=name, llm=FakeLLM(script), tools=[gate.tool], mcp_servers=[server], partitions=1
    )
    async def agent(ctx: AgentContext) -> str:
        return await ctx.llm.run([{"role": "user", "content": "go"}])

    return agent


async def test_a_replay_with_the_server_down_uses_the_journal_and_live_calls_fail_recoverably(
    kafka_bootstrap_servers: str, client: KafkaAgentClient, transport: Transport
) -> None:
    script = Script(
        [
            reply_tool_call("orders_refund", order_id="7", cents=100),
            reply_tool_call("hold"),
            reply_tool_call("orders_lookup", order_id="7"),
            "Refunded; the lookup failed.",
        ]
    )
    gate = Gate()
    agent = make_agent(unique_name("mcpdown"), script, gate, transport.declaration(retry=1))
    async with running_worker(agent, kafka_bootstrap_servers, QUICK_STOP):
        handle = await client.submit(agent.name)
        await wait_for(lambda: gate.started == 1, 60, "the local tool started")
    # The refund ran and was journaled; the worker stopped while `hold` ran.
    assert script.calls == [0, 1]
    transport.take_down()
    gate.open.set()
    async with running_worker(agent, kafka_bootstrap_servers, QUICK_STOP):
        events = await asyncio.wait_for(collect(client, agent.name, handle.turn_id), 90)

    assert events[-1].type == "run:complete", events[-1].data
    assert script.calls == [0, 1, 2, 3], "calls 0 and 1 came from the journal"
    assert script.offered[2] == script.offered[0] == V1_TOOLS, "the journaled tool list"
    results = [
        (e.data["tool"], e.data["status"], e.data["output"], e.data["attempts"])
        for e in events
        if e.type == "tool:result"
    ]
    assert results[0] == ("orders_refund", "ok", "refunded 100 cents on order 7", 1)
    assert [r[0] for r in results] == ["orders_refund", "hold", "orders_lookup"]
    lookup = results[2]
    assert lookup[1] == "error" and "MCPServerUnavailable" in lookup[2], lookup
    assert lookup[3] == 2, "retried once, per MCPServer(retry=1)"
    assert "MCP server 'orders'" in lookup[2]


async def test_a_replay_offers_the_journaled_tool_list_when_the_server_changed_its_tools(
    kafka_bootstrap_servers: str, client: KafkaAgentClient, transport: Transport
) -> None:
    script = Script(
        [
            reply_tool_call("hold"),
            reply_tool_call("orders_refund", order_id="3", cents=5),
            "The refund tool is gone.",
        ]
    )
    gate = Gate()
    name = unique_name("mcpchanged")
    first = make_agent(name, script, gate, transport.declaration("v1"))
    async with running_worker(first, kafka_bootstrap_servers, QUICK_STOP):
        handle = await client.submit(name)
        await wait_for(lambda: gate.started == 1, 60, "the local tool started")
    transport.replace("v2")  # refund removed, cancel added, lookup re-described
    gate.open.set()
    second = make_agent(name, script, gate, transport.declaration("v2"))
    async with running_worker(second, kafka_bootstrap_servers, QUICK_STOP):
        events = await asyncio.wait_for(collect(client, name, handle.turn_id), 90)

    # Model call 0 replayed (its recorded tool list matched), and call 1, live, was
    # offered the same journaled v1 list: the turn keeps the tools it started with.
    assert events[-1].type == "run:complete", events[-1].data
    assert script.calls == [0, 1, 2]
    assert script.offered[1] == V1_TOOLS
    refund = [e.data for e in events if e.type == "tool:result"][-1]
    assert refund["tool"] == "orders_refund" and refund["status"] == "error"
    assert "Unknown tool: refund" in refund["output"]


async def test_the_pool_reconnects_after_the_server_comes_back(
    kafka_bootstrap_servers: str, client: KafkaAgentClient
) -> None:
    server = OrderServer().start()

    @tool
    def outage(ctx: ToolContext) -> str:
        """Kill the MCP server."""
        server.kill()
        return "killed"

    @tool
    def restore(ctx: ToolContext) -> str:
        """Start it again on the same port."""
        server.start()
        return "restored"

    script = Script(
        [
            reply_tool_call("orders_lookup", order_id="1"),
            reply_tool_call("outage"),
            reply_tool_call("orders_lookup", order_id="2"),
            reply_tool_call("restore"),
            reply_tool_call("orders_lookup", order_id="3"),
            "done",
        ]
    )

    @kafka_agent(
        name=unique_name("mcpback"),
        llm=FakeLLM(script),
        tools=[outage, restore],
        mcp_servers=[server.declaration()],
        partitions=1,
    )
    async def agent(ctx: AgentContext) -> str:
        return await ctx.llm.run([{"role": "user", "content": "go"}])

    try:
        async with running_worker(agent, kafka_bootstrap_servers) as worker:
            events = await client.run(agent.name, timeout=90)
            connection = worker._executor.mcp_pool.connection("orders")  # type: ignore[union-attr]
    finally:
        server.kill()
    assert events[-1].type == "run:complete", events[-1].data
    lookups = [
        (e.data["status"], e.data["output"])
        for e in events
        if e.type == "tool:result" and e.data["tool"] == "orders_lookup"
    ]
    assert lookups[0] == ("ok", "order 1 has shipped")
    assert lookups[1][0] == "error" and "MCPServerUnavailable" in lookups[1][1]
    assert lookups[2] == ("ok", "order 3 has shipped")
    assert connection.opened == 2  # one connection, reopened once after the outage


async def test_an_exported_turn_with_mcp_tools_replays_offline_with_the_server_down(
    kafka_bootstrap_servers: str, client: KafkaAgentClient
) -> None:
    script = Script([reply_tool_call("orders_lookup", order_id="7"), "Order 7 shipped."])
    server = OrderServer().start()
    try:

        @kafka_agent(
            name=unique_name("mcpoffline"),
            llm=FakeLLM(script),
            mcp_servers=[server.declaration()],
            keep_history=True,
            partitions=1,
        )
        async def agent(ctx: AgentContext) -> str:
            return await ctx.llm.run([{"role": "user", "content": "go"}])

        async with running_worker(agent, kafka_bootstrap_servers, QUICK_STOP):
            events = await client.run(agent.name, timeout=60)
    finally:
        server.kill()
    assert events[-1].type == "run:complete", events[-1].data
    recording = await asyncio.to_thread(
        export_turn,
        kafka_bootstrap_servers,
        history_topic=agent.topics.history,
        events_topic=agent.topics.events,
        turn_id=events[0].turn_id,
    )

    report = await replay_turn(agent, recording)
    assert report.clean, report.message
    assert script.calls == [0, 1], "offline, no model call ran"
