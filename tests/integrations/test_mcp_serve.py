"""``build_mcp_server`` and ``pyrula-stream mcp serve``: the MCP SDK's own client lists and
calls our tools, and calls a Kafka agent end to end (turn on the real broker)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import sys
from collections.abc import AsyncIterator
from typing import Any

import pytest
from mcp import Client, StdioServerParameters

from pyrula_stream import (
    AgentContext,
    Fatal,
    ToolContext,
    ToolRegistrationError,
    WorkerOptions,
    build_mcp_server,
    kafka_agent,
    tool,
)
from pyrula_stream.chaos.processes import free_port
from pyrula_stream.errors import ConfigurationError
from pyrula_stream.llm import FakeLLM
from pyrula_stream.testing import running_worker, unique_name
from tests.agents.echo import echo
from tests.mcp_servers.processes import ROOT, sigkill, start_listening


@tool(read_only=True)
async def lookup_order(ctx: ToolContext, order_id: str, verbose: bool = False) -> dict[str, str]:
    """Look up an order by id."""
    return {"order_id": order_id, "status": "shipped"}


@tool
async def cancel_order(ctx: ToolContext, order_id: str) -> str:
    """Cancel an order."""
    raise Fatal(f"order {order_id} already shipped")


async def test_the_sdk_client_lists_and_calls_our_tools() -> None:
    server = build_mcp_server(tools=[lookup_order, cancel_order], name="orders")
    async with Client(server) as mcp:
        listed = {t.name: t for t in (await mcp.list_tools()).tools}
        ok = await mcp.call_tool("lookup_order", {"order_id": "9"})
        failed = await mcp.call_tool("cancel_order", {"order_id": "9"})
        invalid = await mcp.call_tool("lookup_order", {"order": "9"})

    assert sorted(listed) == ["cancel_order", "lookup_order"]
    lookup = listed["lookup_order"]
    assert lookup.description == "Look up an order by id."
    assert lookup.input_schema["required"] == ["order_id"]
    assert lookup.annotations is not None and lookup.annotations.read_only_hint is True
    assert listed["cancel_order"].annotations.read_only_hint is False  # type: ignore[union-attr]
    assert not ok.is_error
    assert ok.content[0].text == '{"order_id":"9","status":"shipped"}'  # type: ignore[union-attr]
    assert failed.is_error and "already shipped" in failed.content[0].text  # type: ignore[union-attr]
    assert invalid.is_error and "order_id" in invalid.content[0].text  # type: ignore[union-attr]


def test_approval_gated_tools_and_empty_servers_are_refused() -> None:
    @tool(requires_approval=True)
    async def refund(ctx: ToolContext, cents: int) -> str:
        """Needs a person."""
        return "no"

    with pytest.raises(ToolRegistrationError, match="cannot expose tool 'refund'"):
        build_mcp_server(tools=[refund])
    with pytest.raises(ConfigurationError, match="needs bootstrap_servers"):
        build_mcp_server(agents=[echo])
    with pytest.raises(ConfigurationError, match="at least one"):
        build_mcp_server()


@contextlib.asynccontextmanager
async def served_over(transport: str, agent: str, bootstrap: str) -> AsyncIterator[Client]:
    """``pyrula-stream mcp serve tests.agents.echo:echo`` in a subprocess, and a client."""
    command = ["-m", "pyrula_stream.cli", "mcp", "serve", "tests.agents.echo:echo"]
    command += ["--bootstrap-servers", bootstrap]
    env = {"PYTHONPATH": ROOT, "ECHO_AGENT_NAME": agent}
    if transport == "stdio":
        params = StdioServerParameters(command=sys.executable, args=command, env=env, cwd=ROOT)
        async with Client(params) as mcp:
            yield mcp
        return
    port = free_port()
    argv = [sys.executable, *command, "--http", str(port)]
    proc = await asyncio.to_thread(start_listening, argv, port, env)
    try:
        async with Client(f"http://127.0.0.1:{port}/mcp") as mcp:
            yield mcp
    finally:
        sigkill(proc)


@pytest.mark.parametrize("transport", ["stdio", "http"])
async def test_an_mcp_client_calls_a_kafka_agent_end_to_end(
    kafka_bootstrap_servers: str, transport: str
) -> None:
    agent = dataclasses.replace(echo, name=unique_name("mcpecho"))
    async with (
        running_worker(agent, kafka_bootstrap_servers),
        served_over(transport, agent.name, kafka_bootstrap_servers) as mcp,
    ):
        listed = (await mcp.list_tools()).tools
        result = await mcp.call_tool(agent.name, {"text": "hello"})
        invalid = await mcp.call_tool(agent.name, {"txt": "hello"})

    assert [t.name for t in listed] == [agent.name]
    assert listed[0].input_schema["required"] == ["text"]
    assert not result.is_error
    text: Any = result.content[0]
    assert text.text == "said it"  # the turn's result, after the model called `shout`
    assert invalid.is_error and "text" in invalid.content[0].text  # type: ignore[union-attr]


async def test_an_agent_turn_that_fails_or_outlasts_turn_timeout_is_an_error_result(
    kafka_bootstrap_servers: str,
) -> None:
    release = asyncio.Event()

    @kafka_agent(name=unique_name("mcpfail"), llm=FakeLLM(["x"]), partitions=1)
    async def failing(ctx: AgentContext, order_id: str) -> str:
        """Refund an order."""
        raise Fatal(f"order {order_id} is locked")

    @kafka_agent(name=unique_name("mcpslow"), llm=FakeLLM(["x"]), partitions=1)
    async def waiting(ctx: AgentContext) -> str:
        await release.wait()
        return "late"

    server = build_mcp_server(
        agents=[failing, waiting], bootstrap_servers=kafka_bootstrap_servers, turn_timeout=3
    )
    quick_stop = WorkerOptions(shutdown_grace=0.2)
    async with (
        running_worker(failing, kafka_bootstrap_servers),
        running_worker(waiting, kafka_bootstrap_servers, quick_stop),
        Client(server) as mcp,
    ):
        failed = await mcp.call_tool(failing.name, {"order_id": "9"})
        late = await mcp.call_tool(waiting.name, {})
        release.set()

    assert failed.is_error
    assert "failed (fatal): order 9 is locked" in failed.content[0].text  # type: ignore[union-attr]
    assert late.is_error, late
    text = late.content[0].text  # type: ignore[union-attr]
    assert "did not finish within turn_timeout=3s" in text and "still runs" in text, text
