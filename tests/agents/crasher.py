"""An agent whose tool kills its worker process on a marker: a record no decoder guards
against, for the poison-quarantine tests. The name comes from the environment."""

from __future__ import annotations

import os
from typing import Any

from pyrula_stream import AgentContext, ToolContext, kafka_agent, tool
from pyrula_stream.llm import FakeLLM, reply_text, reply_tool_call
from pyrula_stream.llm.base import ModelResponse, ToolDefinition
from pyrula_stream.llm.fake import count_model_calls

CRASH_MARKER = "CRASH"


@tool(read_only=True)
async def inspect(ctx: ToolContext, text: str) -> str:
    """Look at the text; the marker ends the process at once (no cleanup, like a segfault)."""
    if CRASH_MARKER in text:
        os._exit(17)
    return text.upper()


def _respond(messages: list[dict[str, Any]], tools: list[ToolDefinition]) -> ModelResponse:
    if count_model_calls(messages):
        return reply_text("looked")
    return reply_tool_call("inspect", text=str(messages[0].get("content", "")))


@kafka_agent(
    name=os.environ.get("CRASHER_AGENT_NAME", "crasher"),
    llm=FakeLLM(_respond),
    tools=[inspect],
    partitions=1,
)
async def crasher(ctx: AgentContext, text: str) -> str:
    return await ctx.llm.run([{"role": "user", "content": text}])
