"""The agent ``make deploy-check`` runs in containers: no model key (FakeLLM), a tool
that takes a second, so turns are in flight when a worker is stopped."""

from __future__ import annotations

import asyncio

from pyrula_stream import AgentContext, ToolContext, kafka_agent, tool
from pyrula_stream.llm import FakeLLM, reply_tool_call


@tool
async def slow_lookup(ctx: ToolContext, n: int) -> str:
    """Looks n up, slowly."""
    await asyncio.sleep(1.0)
    return f"record {n}"


@kafka_agent(
    name="check",
    llm=FakeLLM([reply_tool_call("slow_lookup", n=1), "found it"]),
    tools=[slow_lookup],
    partitions=4,
)
async def agent(ctx: AgentContext, n: int) -> str:
    return await ctx.llm.run([{"role": "user", "content": f"look {n} up"}])
