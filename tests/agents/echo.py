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


@tool
async def note(ctx: ToolContext, text: str) -> str:
    """Write the text down: an effect, so the model's response commits before it runs."""
    return text


@kafka_agent(
    name=os.environ.get("ECHO_AGENT_NAME", "noting"),
    llm=FakeLLM([reply_tool_call("note", text="hello"), "noted"]),
    tools=[note],
    partitions=2,
)
async def noting(ctx: AgentContext, text: str) -> str:
    """Like ``echo``, with a tool that has effects: its first steps are committed before the
    tool runs, so the journal holds them while the turn runs."""
    return await ctx.llm.run([{"role": "user", "content": text}])
