"""An agent whose tool returns a value far past a Kafka record (stored by reference), for
the crash-between-object-and-commit test. Name and prefix come from the environment."""

from __future__ import annotations

import os

from pyrula_stream import AgentContext, AgentLimits, ToolContext, kafka_agent, tool
from pyrula_stream.llm import FakeLLM, reply_tool_call

TOOL_BYTES = 1_500_000


@tool
async def fetch_report(ctx: ToolContext) -> str:
    """A report too big for one record."""
    return "R" * TOOL_BYTES


@kafka_agent(
    name=os.environ.get("LARGE_AGENT_NAME", "large"),
    prefix=os.environ.get("LARGE_AGENT_PREFIX", "pyrula"),
    llm=FakeLLM([reply_tool_call("fetch_report"), "read"]),
    tools=[fetch_report],
    partitions=1,
    limits=AgentLimits(max_tool_result_bytes=None),
)
async def large(ctx: AgentContext) -> str:
    return await ctx.llm.run([{"role": "user", "content": "fetch the report"}])
