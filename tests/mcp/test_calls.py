"""MCP calls as durable tool calls, and the worker's connection to a server, over a real
SDK server in a subprocess: the call carries the turn's idempotency key, the result
limit and the call timeout apply, a slow-starting server gets ``connect_timeout`` (not
the call's ``timeout``), and a stdio server is reused across turns, restarted after it
dies mid-call and stopped with the worker."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from pyrula_stream import AgentContext, AgentLimits, KafkaAgentClient, MCPServer, kafka_agent
from pyrula_stream.errors import ConfigurationError
from pyrula_stream.llm import FakeLLM, ModelResponse, ToolDefinition, reply_text, reply_tool_call
from pyrula_stream.llm.fake import count_model_calls, last_tool_results
from pyrula_stream.mcp.pool import MCPPool
from pyrula_stream.mcp.tools import MCPTool, MCPToolListing
from pyrula_stream.testing import running_worker, unique_name
from pyrula_stream.tools.contract import ToolContext
from tests.mcp_servers.processes import OrderServer, stdio_declaration


@pytest.fixture(scope="module")
def http_ops() -> Iterator[OrderServer]:
    server = OrderServer(toolset="ops").start()
    yield server
    server.kill()


@pytest.fixture(params=["http", "stdio"])
def ops(request: pytest.FixtureRequest, http_ops: OrderServer) -> Any:
    """A declaration factory for the ``ops`` toolset over one transport."""
    if request.param == "http":
        return http_ops.declaration
    return lambda **options: stdio_declaration(toolset="ops", **options)


def scripted(
    replies: dict[str, list[ModelResponse | str]], read: list[list[str]] | None = None
) -> FakeLLM:
    """A model whose replies depend on the turn's question and its model call index;
    ``read`` collects the tool results each model call was given."""

    def model(messages: list[dict[str, Any]], tools: list[ToolDefinition]) -> Any:
        if read is not None:
            read.append(last_tool_results(messages))
        reply = replies[messages[0]["content"]][count_model_calls(messages)]
        return reply_text(reply) if isinstance(reply, str) else reply

    return FakeLLM(model)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def test_a_call_carries_the_turns_idempotency_key_and_its_result_is_cut_to_the_limit(
    kafka_bootstrap_servers: str, client: KafkaAgentClient, ops: Any
) -> None:
    read: list[list[str]] = []
    llm = scripted(
        {"go": [reply_tool_call("idem_key"), reply_tool_call("orders_big", size=5000), "ok"]},
        read,
    )

    @kafka_agent(
        name=unique_name("mcpkey"),
        llm=llm,
        mcp_servers=[ops(tool_names={"key": "idem_key"})],  # the model's name for `key`
        limits=AgentLimits(max_tool_result_bytes=300),
        partitions=1,
    )
    async def agent(ctx: AgentContext) -> str:
        return await ctx.llm.run([{"role": "user", "content": "go"}])

    async with running_worker(agent, kafka_bootstrap_servers):
        events = await client.run(agent.name, timeout=90)

    assert events[-1].type == "run:complete", events[-1].data
    start = next(e for e in events if e.type == "tool:start" and e.data["tool"] == "idem_key")
    assert start.data["mcp_tool"] == "key"
    key, big = (e.data for e in events if e.type == "tool:result")
    # The key a @tool reads as ctx.idempotency_key, sent in the call's _meta.
    assert key["output"] == f"{start.turn_id}:{start.data['call_key']}:idem_key"
    assert big["status"] == "ok"
    assert big["output"] == "x" * 300 + "\n[truncated: showed 300 of 5000 bytes]"
    assert read[-1] == [big["output"]], "the model read the cut result"


async def test_naming_a_server_the_agent_does_not_declare_raises(
    kafka_bootstrap_servers: str, client: KafkaAgentClient
) -> None:
    @kafka_agent(name=unique_name("nomcp"), llm=FakeLLM(["x"]), partitions=1)
    async def agent(ctx: AgentContext) -> dict[str, Any]:
        every = await ctx.mcp_tools()
        try:
            await ctx.mcp_tools("orders")
        except ConfigurationError as exc:
            return {"every": len(every), "named": str(exc)}
        return {"every": len(every), "named": "no error"}

    async with running_worker(agent, kafka_bootstrap_servers):
        events = await client.run(agent.name, timeout=60)

    assert events[-1].type == "run:complete", events[-1].data
    result = events[-1].data["result"]
    assert result["every"] == 0
    assert "ctx.mcp_tools('orders')" in result["named"] and "mcp_servers" in result["named"]


async def test_a_call_past_its_timeout_is_an_error_and_the_connection_lives_on(ops: Any) -> None:
    server: MCPServer = ops(timeout=2)
    async with MCPPool([server]) as pool, httpx.AsyncClient() as http:
        connection = pool.connection("orders")
        listed = [MCPToolListing.from_sdk(server, t) for t in await connection.list_tools()]
        tools = {t.name: MCPTool(t, server, connection) for t in listed}
        stalled = await tools["orders_stall"].invoke(ToolContext(http=http), {})
        after = await tools["orders_lookup"].invoke(ToolContext(http=http), {"order_id": "2"})
    assert stalled.is_error and stalled.error_type == "ToolTimeout", stalled
    assert "timed out after 2s" in stalled.text
    assert (after.is_error, after.text) == (False, "order 2 has shipped")
    assert connection.opened == 1


def _lookup_listing(server: MCPServer) -> MCPToolListing:
    return MCPToolListing(
        server=server.name,
        tool="lookup",
        name="orders_lookup",
        description="Look up an order by id.",
        input_schema={"type": "object", "properties": {"order_id": {"type": "string"}}},
        read_only=True,
        destructive=None,
    )


async def test_a_slow_starting_server_gets_connect_timeout_not_the_call_timeout(
    kafka_bootstrap_servers: str, client: KafkaAgentClient
) -> None:
    # The server starts in > 6 s; a call, once connected, answers well within 4 s.
    slow = stdio_declaration(start_delay=6, timeout=4)
    async with MCPPool([slow]) as pool, httpx.AsyncClient() as http:  # a call opens it
        lookup = MCPTool(_lookup_listing(slow), slow, pool.connection("orders"))
        called = await lookup.invoke(ToolContext(http=http), {"order_id": "1"})
    assert (called.is_error, called.text) == (False, "order 1 has shipped"), called

    @kafka_agent(  # discovery opens it
        name=unique_name("mcpslow"),
        llm=FakeLLM([reply_tool_call("orders_lookup", order_id="6"), "done"]),
        mcp_servers=[slow],
        partitions=1,
    )
    async def agent(ctx: AgentContext) -> str:
        return await ctx.llm.run([{"role": "user", "content": "go"}])

    async with running_worker(agent, kafka_bootstrap_servers):
        events = await client.run(agent.name, timeout=120)
    assert events[-1].type == "run:complete", events[-1].data
    assert [e.data["output"] for e in events if e.type == "tool:result"] == ["order 6 has shipped"]


async def test_a_stdio_server_is_reused_restarted_after_it_dies_and_stopped_with_the_worker(
    kafka_bootstrap_servers: str, client: KafkaAgentClient
) -> None:
    llm = scripted(
        {
            "one": [reply_tool_call("orders_pid"), "one"],
            "two": [
                reply_tool_call("orders_pid"),
                reply_tool_call("orders_crash"),
                reply_tool_call("orders_pid"),
                "two",
            ],
        }
    )

    @kafka_agent(
        name=unique_name("mcplife"),
        llm=llm,
        mcp_servers=[stdio_declaration(toolset="ops", timeout=120)],
        partitions=1,
    )
    async def agent(ctx: AgentContext, question: str) -> str:
        return await ctx.llm.run([{"role": "user", "content": question}])

    async with running_worker(agent, kafka_bootstrap_servers) as worker:
        first = await client.run(agent.name, question="one", timeout=90)
        second = await client.run(agent.name, question="two", timeout=120)
        connection = worker._executor.mcp_pool.connection("orders")  # type: ignore[union-attr]
        assert connection.opened == 2  # one for both turns, reopened once after the crash

    assert first[-1].type == "run:complete" and second[-1].type == "run:complete"
    results = [
        (e.data["tool"], e.data["status"], e.data["output"])
        for e in first + second
        if e.type == "tool:result"
    ]
    (_, _, pid1), (_, _, pid1_again), crash, (_, _, pid2) = results
    assert pid1 == pid1_again, "the second turn used the first turn's server"
    assert crash[1] == "error" and "MCPServerUnavailable" in crash[2], crash
    assert pid2 != pid1, "a new server process after the crash"
    assert not alive(int(pid2)), "the worker stopped its stdio server when it stopped"
