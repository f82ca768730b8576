"""An agent for CLI tests; its name comes from the environment so each test is isolated."""

from __future__ import annotations

import os

from pyrula_stream import AgentContext, ToolContext, kafka_agent, tool
from pyrula_stream.llm import FakeLLM, reply_tool_call


@tool(read_only=True)
async def shout(ctx: ToolContext, text: str) -> str:
    """Upper-case the text."""
    return text.upper()


@kafka_agent(
    name=os.environ.get("ECHO_AGENT_NAME", "echo"),
    llm=FakeLLM([reply_tool_call("shout", text="hello"), "said it"]),
    tools=[shout],
    partitions=2,
)
async def echo(ctx: AgentContext, text: str) -> str:
    return await ctx.llm.run([{"role": "user", "content": text}])
