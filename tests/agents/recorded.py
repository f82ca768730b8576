"""An agent that keeps history, for export, replay and branch tests. Its name and system
prompt come from the environment, so a test can replay a turn on changed code."""

from __future__ import annotations

import os
from typing import Any

from pyrula_stream import AgentContext, ToolContext, kafka_agent, tool
from pyrula_stream.agent.definition import KafkaAgent
from pyrula_stream.llm import FakeLLM, ModelResponse, ToolDefinition, reply_text, reply_tool_call
from pyrula_stream.llm.fake import count_model_calls, last_tool_results

SYSTEM = "Answer order questions in one sentence."
NOTES: list[str] = []


@tool(read_only=True)
async def lookup_order(ctx: ToolContext, order_id: str) -> dict[str, str]:
    """Look up an order by id."""
    return {"order_id": order_id, "status": "shipped"}


@tool(writes=True)
async def add_note(ctx: ToolContext, order_id: str, text: str) -> str:
    """Add a note to an order."""
    NOTES.append(f"{order_id}:{text}")
    return f"noted on {order_id}"


def order_model(messages: list[dict[str, Any]], tools: list[ToolDefinition]) -> ModelResponse:
    """Looks the order up, notes the answer, then answers."""
    question = str(messages[0]["content"])
    order_id = question.split()[-1].strip("?")
    calls = count_model_calls(messages)
    if calls == 0:
        return reply_tool_call("lookup_order", order_id=order_id)
    if calls == 1:
        return reply_tool_call("add_note", order_id=order_id, text="customer asked")
    result = last_tool_results(messages)
    return reply_text(f"Order {order_id}: {result[0] if result else 'unknown'}")


def make_agent(name: str, system: str = SYSTEM) -> KafkaAgent:
    @kafka_agent(
        name=name,
        llm=FakeLLM(order_model),
        tools=[lookup_order, add_note],
        keep_history=True,
        partitions=1,
    )
    async def recorded(ctx: AgentContext, question: str) -> str:
        return await ctx.llm.run([{"role": "user", "content": question}], system=system)

    return recorded


recorded = make_agent(
    os.environ.get("RECORDED_AGENT_NAME", "recorded"), os.environ.get("RECORDED_SYSTEM", SYSTEM)
)
