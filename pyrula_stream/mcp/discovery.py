"""Durable discovery: a turn's MCP tool list is fetched once and journaled as a step.

The first time a turn needs a server's tools (its first model call, or
``ctx.mcp_tools()``) the list is fetched from the worker's connection and journaled;
a replay takes the journaled list, so it offers the model the same tools (and its
recorded model calls still match) even when the server is down or now lists others.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import TYPE_CHECKING

from pyrula_stream.errors import ConfigurationError, MCPServerUnavailable, ToolRegistrationError
from pyrula_stream.mcp.tools import MCPTool, MCPToolListing
from pyrula_stream.tools.mcp_servers import MCPServer
from pyrula_stream.tools.retry import run_with_retry
from pyrula_stream.wire.fingerprint import fingerprint

if TYPE_CHECKING:
    from mcp.types import Tool

    from pyrula_stream.durable.steps import DurableSteps, StepData
    from pyrula_stream.mcp.pool import MCPPool

STEP_KIND = "mcp_tools"


class MCPToolbox:
    """One turn's MCP tools: each declared server discovered at most once, durably."""

    def __init__(
        self,
        turn: DurableSteps,
        pool: MCPPool,
        servers: Sequence[MCPServer],
        *,
        reserved_names: Sequence[str] = (),
    ) -> None:
        self._turn = turn
        self._pool = pool
        self._servers = {s.name: s for s in servers}
        self._reserved = set(reserved_names)
        self._found: dict[str, list[MCPTool]] = {}

    async def tools(self, server: str | None = None) -> list[MCPTool]:
        """The tools of ``server`` (or of every declared server, in declaration order)."""
        if server is not None and server not in self._servers:
            declared = ", ".join(self._servers) or "none"
            raise ConfigurationError(
                f"ctx.mcp_tools({server!r}): no such MCP server on this agent "
                f"(declared: {declared}); add it to @kafka_agent(mcp_servers=[...])"
            )
        names = list(self._servers) if server is None else [server]
        found: list[MCPTool] = []
        for name in names:
            if name not in self._found:
                self._found[name] = await self._discover(self._servers[name])
            found += self._found[name]
        return found

    async def _discover(self, server: MCPServer) -> list[MCPTool]:
        connection = self._pool.connection(server.name)

        async def attempt() -> list[Tool]:
            await connection.connect()  # under connect_timeout, not timeout
            try:
                async with asyncio.timeout(server.timeout):
                    return await connection.list_tools()
            except TimeoutError as exc:
                raise MCPServerUnavailable(
                    f"MCP server '{server.name}' did not list its tools within "
                    f"timeout={server.timeout:g}s",
                    detail={"server": server.name},
                ) from exc

        async def live() -> StepData:
            run = await run_with_retry(
                server.retry_policy, attempt, label=f"MCP server {server.name!r}"
            )
            if run.error is not None:
                raise run.error
            listings = [MCPToolListing.from_sdk(server, t) for t in run.value]
            return {"server": server.name, "tools": [t.as_data() for t in listings]}

        data, _ = await self._turn.durable_step(
            STEP_KIND, server.name, fingerprint({"server": server.name}), live
        )
        tools = [MCPTool(MCPToolListing.from_data(d), server, connection) for d in data["tools"]]
        self._check_names(server, tools)
        return tools

    def _check_names(self, server: MCPServer, tools: list[MCPTool]) -> None:
        taken = self._reserved | {t.name for found in self._found.values() for t in found}
        for tool in tools:
            if tool.name in taken:
                raise ToolRegistrationError(
                    f"MCP server '{server.name}' tool '{tool.listing.tool}' would be offered "
                    f"as '{tool.name}', a name already taken; map it with "
                    f"MCPServer(tool_names={{'{tool.listing.tool}': '<other name>'}})"
                )
            taken.add(tool.name)
