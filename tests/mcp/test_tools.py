"""Tools from a real MCP server (the SDK's, in a subprocess) in turns on the real broker,
over streamable HTTP and over stdio: discovery, calls, ``isError`` results."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from pyrula_stream import AgentContext, KafkaAgentClient, MCPServer, ToolContext, kafka_agent
from pyrula_stream.chaos.processes import free_port
from pyrula_stream.errors import (
    ConfigurationError,
    MCPServerUnavailable,
    ToolRegistrationError,
    TurnFailure,
)
from pyrula_stream.llm import (
    FakeLLM,
    LLMClient,
    ModelResponse,
    ToolDefinition,
    reply_text,
    reply_tool_call,
)
from pyrula_stream.llm.fake import count_model_calls
from pyrula_stream.mcp.pool import MCPPool
from pyrula_stream.mcp.tools import MCPTool, MCPToolListing
from pyrula_stream.testing import running_worker, unique_name
from pyrula_stream.testing_servers.anthropic_server import AnthropicWireServer, Text, ToolUse
from tests.llm.servers import fixtures
from tests.mcp_servers.processes import OrderServer, stdio_declaration

anthropic_server = fixtures.anthropic_server
anthropic_llm = fixtures.anthropic_llm


@pytest.fixture(scope="module")
def http_orders() -> Iterator[OrderServer]:
    server = OrderServer().start()
    yield server
    server.kill()


@pytest.fixture(params=["http", "stdio"])
def orders(request: pytest.FixtureRequest, http_orders: OrderServer) -> MCPServer:
    if request.param == "http":
        return http_orders.declaration()
    return stdio_declaration()


class Model:
    """A scripted model that remembers the tools it was offered."""

    def __init__(self, script: list[ModelResponse | str]) -> None:
        self.script = script
        self.offered: list[list[str]] = []

    def __call__(self, messages: list[dict[str, Any]], tools: list[ToolDefinition]) -> Any:
        self.offered.append([t.name for t in tools])
        reply = self.script[min(count_model_calls(messages), len(self.script) - 1)]
        return reply_text(reply) if isinstance(reply, str) else reply


async def test_the_model_sees_and_calls_mcp_tools_beside_its_own(
    kafka_bootstrap_servers: str, client: KafkaAgentClient, orders: MCPServer
) -> None:
    model = Model(
        [
            reply_tool_call("orders_lookup", order_id="9"),
            reply_tool_call("orders_refund", order_id="9", cents=250),
            reply_tool_call("orders_broken", order_id="9"),
            "Order 9 shipped and was refunded; it is locked now.",
        ]
    )

    @kafka_agent(name=unique_name("mcp"), llm=FakeLLM(model), mcp_servers=[orders], partitions=1)
    async def agent(ctx: AgentContext, question: str) -> str:
        return await ctx.llm.run([{"role": "user", "content": question}])

    async with running_worker(agent, kafka_bootstrap_servers):
        events = await client.run(agent.name, question="What about order 9?", timeout=60)

    assert events[-1].type == "run:complete", events[-1].data
    assert model.offered[0] == [
        "orders_lookup",
        "orders_refund",
        "orders_broken",
        "orders_whoami",
        "orders_call_count",
    ]
    starts = [e.data for e in events if e.type == "tool:start"]
    results = [e.data for e in events if e.type == "tool:result"]
    assert [s["tool"] for s in starts] == ["orders_lookup", "orders_refund", "orders_broken"]
    assert starts[0]["mcp_server"] == "orders" and starts[0]["mcp_tool"] == "lookup"
    assert "destructive" not in starts[0]
    assert starts[1]["destructive"] is True  # destructiveHint, shown to whoever reads events
    assert [(r["status"], r["output"]) for r in results[:2]] == [
        ("ok", "order 9 has shipped"),
        ("ok", "refunded 250 cents on order 9"),
    ]
    assert results[2]["status"] == "error"  # isError: the model reads it, the turn goes on
    assert "order 9 is locked" in results[2]["output"]
    assert results[2]["error_code"] == "tool_error"


async def test_ctx_mcp_tools_and_a_direct_call(
    kafka_bootstrap_servers: str, client: KafkaAgentClient, orders: MCPServer
) -> None:
    seen: dict[str, Any] = {}

    @kafka_agent(
        name=unique_name("mcpctx"),
        llm=FakeLLM([reply_tool_call("orders_lookup", order_id="4"), "done"]),
        mcp_servers=[orders],
        partitions=1,
    )
    async def agent(ctx: AgentContext) -> Any:
        tools = await ctx.mcp_tools("orders")
        seen["names"] = [t.name for t in tools]
        seen["read_only"] = {t.name: t.spec.read_only for t in tools}
        lookup = next(t for t in tools if t.name == "orders_lookup")
        direct = await lookup(ctx, order_id="5")
        answer = await ctx.llm.run([{"role": "user", "content": "go"}], tools=[lookup])
        try:
            await ctx.mcp_tools("nope")
        except ConfigurationError as exc:
            seen["unknown"] = str(exc)
        return {"direct": direct, "answer": answer}

    async with running_worker(agent, kafka_bootstrap_servers):
        events = await client.run(agent.name, timeout=60)

    assert events[-1].type == "run:complete", events[-1].data
    assert events[-1].data["result"] == {
        "direct": {"result": "order 5 has shipped"},
        "answer": "done",
    }
    assert seen["read_only"] == {  # from readOnlyHint
        "orders_lookup": True,
        "orders_refund": False,
        "orders_broken": True,
        "orders_whoami": True,
        "orders_call_count": True,
    }
    assert "no such MCP server" in seen["unknown"] and "orders" in seen["unknown"]
    outputs = [e.data["output"] for e in events if e.type == "tool:result"]
    assert outputs == ["order 5 has shipped", "order 4 has shipped"]


async def test_an_sdk_backed_model_calls_an_mcp_tool(
    kafka_bootstrap_servers: str,
    client: KafkaAgentClient,
    http_orders: OrderServer,
    anthropic_server: AnthropicWireServer,
    anthropic_llm: LLMClient,
) -> None:
    anthropic_server.reply_stream(
        [ToolUse("toolu_1", "orders_lookup", {"order_id": "12"})], stop_reason="tool_use"
    )
    anthropic_server.reply_stream([Text("Order 12 has shipped.")])

    @kafka_agent(
        name=unique_name("mcpwire"),
        llm=anthropic_llm,
        mcp_servers=[http_orders.declaration()],
        partitions=1,
    )
    async def agent(ctx: AgentContext, question: str) -> str:
        return await ctx.llm.run([{"role": "user", "content": question}])

    async with running_worker(agent, kafka_bootstrap_servers):
        events = await client.run(agent.name, question="Order 12?", timeout=60)

    assert events[-1].type == "run:complete", events[-1].data
    assert events[-1].data["result"] == "Order 12 has shipped."
    first, second = (r.body for r in anthropic_server.requests)
    offered = {t["name"]: t for t in first["tools"]}
    assert offered["orders_lookup"]["description"] == "Look up an order by id."
    assert offered["orders_lookup"]["input_schema"]["required"] == ["order_id"]
    result = second["messages"][-1]["content"][0]
    assert result["type"] == "tool_result" and result["tool_use_id"] == "toolu_1"
    assert "order 12 has shipped" in str(result["content"])


async def test_a_server_down_at_discovery_fails_the_turn_naming_it(
    kafka_bootstrap_servers: str, client: KafkaAgentClient
) -> None:
    """Named by its URL without the credentials it may carry (the message is an event)."""
    secret = "Zq7mcpSecret"
    down = MCPServer("orders", url=f"http://u:{secret}@127.0.0.1:{free_port()}/mcp?key={secret}")

    @kafka_agent(name=unique_name("mcpnone"), llm=FakeLLM(["x"]), mcp_servers=[down])
    async def agent(ctx: AgentContext) -> str:
        return await ctx.llm.run([{"role": "user", "content": "go"}])

    async with running_worker(agent, kafka_bootstrap_servers):
        events = await client.run(agent.name, timeout=60)
    assert events[-1].type == "run:error"
    assert events[-1].data["code"] == "tool_error"
    assert events[-1].data["error_type"] == "MCPServerUnavailable"
    message = events[-1].data["message"]
    assert f"MCP server 'orders' ({down.location}) is unavailable" in message
    assert "127.0.0.1" in down.location and secret not in message
    assert not [e for e in events if e.type == "llm:complete"]


async def test_one_connection_per_worker_with_its_headers_closed_for_good(
    http_orders: OrderServer,
) -> None:
    server = http_orders.declaration(headers={"Authorization": "Bearer t0k"}, timeout=5)
    async with MCPPool([server]) as pool, httpx.AsyncClient() as http:
        connection = pool.connection("orders")
        listed = [MCPToolListing.from_sdk(server, t) for t in await connection.list_tools()]
        tools = {t.name: MCPTool(t, server, connection) for t in listed}
        whoami = await tools["orders_whoami"](ToolContext(http=http))
        shipped = await tools["orders_lookup"](ToolContext(http=http), order_id="3")
        with pytest.raises(TurnFailure, match="order 3 is locked"):
            await tools["orders_broken"](ToolContext(http=http), order_id="3")
    assert whoami == {"result": "Bearer t0k"}
    assert shipped == {"result": "order 3 has shipped"}
    assert connection.opened == 1, "every request went over the one connection"
    with pytest.raises(MCPServerUnavailable, match="pool is closed"):
        await connection.list_tools()


def test_declarations_are_checked_where_they_are_written() -> None:
    with pytest.raises(ConfigurationError, match=r"exactly one of url= .* or command="):
        MCPServer("orders")
    with pytest.raises(ConfigurationError, match="exactly one"):
        MCPServer("orders", url="http://x/mcp", command=["srv"])
    with pytest.raises(ConfigurationError, match="name must be"):
        MCPServer("my orders", url="http://x/mcp")
    with pytest.raises(ConfigurationError, match="tool_names"):
        MCPServer("orders", url="http://x/mcp", tool_names={"lookup": "look up"})
    github = MCPServer("github", url="http://x/mcp", tool_names={"search": "find_code"})
    assert github.model_tool_name("issues.list") == "github_issues_list"
    assert github.model_tool_name("search") == "find_code"


async def test_a_tool_name_clash_fails_the_turn_naming_the_fix(
    kafka_bootstrap_servers: str, client: KafkaAgentClient, http_orders: OrderServer
) -> None:
    clash = http_orders.declaration(tool_names={"refund": "orders_lookup"})

    @kafka_agent(name=unique_name("clash"), llm=FakeLLM(["x"]), mcp_servers=[clash], partitions=1)
    async def agent(ctx: AgentContext) -> str:
        return await ctx.llm.run([{"role": "user", "content": "go"}])

    async with running_worker(agent, kafka_bootstrap_servers):
        events = await client.run(agent.name, timeout=60)
    assert events[-1].type == "run:error"
    assert "tool_names" in events[-1].data["message"]
    assert ToolRegistrationError.__name__ == events[-1].data["error_type"]
