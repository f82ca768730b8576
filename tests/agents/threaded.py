"""A thread-keeping agent for tests that run workers in subprocesses.

Its model answers with the user messages it was sent, joined by ``|``: a turn's result
shows which earlier turns' messages reached the model, and in which order.
"""

from __future__ import annotations

import os
from typing import Any

from pyrula_stream import AgentContext, kafka_agent
from pyrula_stream.llm import FakeLLM, ModelResponse, ToolDefinition, reply_text


def user_texts(messages: list[dict[str, Any]]) -> list[str]:
    return [m["content"] for m in messages if m["role"] == "user" and isinstance(m["content"], str)]


def echo_users(messages: list[dict[str, Any]], tools: list[ToolDefinition]) -> ModelResponse:
    return reply_text("|".join(user_texts(messages)))


@kafka_agent(
    name=os.environ.get("THREADED_AGENT_NAME", "threaded"),
    llm=FakeLLM(echo_users),
    partitions=2,
)
async def threaded(ctx: AgentContext, text: str) -> str:
    return await ctx.llm.run([{"role": "user", "content": text}])
