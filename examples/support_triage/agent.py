"""The support-triage agent: three tools over a small bundled data file.

Runs on ``FakeLLM`` (a scripted model, no key needed) unless ``ANTHROPIC_API_KEY`` or
``OPENAI_API_KEY`` is set, in which case it uses that provider.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from pyrula_stream import AgentContext, AgentLimits, ToolContext, kafka_agent, tool
from pyrula_stream.llm import FakeLLM, LLMClient, ModelResponse, ToolDefinition
from pyrula_stream.llm.fake import count_model_calls, last_tool_results, reply_text, reply_tool_call

DATA = json.loads((Path(__file__).parent / "data.json").read_text())
TICKETS: dict[str, dict[str, Any]] = {}  # a stand-in helpdesk, deduplicated by key

SYSTEM = (
    "You are a support triage agent for a kitchenware shop. Use the tools to look up "
    "orders and policies; open a ticket for damaged goods or refunds. Answer in two "
    "sentences or fewer."
)


@tool(read_only=True)
async def lookup_order(ctx: ToolContext, order_id: str) -> dict[str, Any]:
    """Look up an order by its id: status, carrier, expected delivery date and items."""
    order = DATA["orders"].get(order_id)
    if order is None:
        return {"order_id": order_id, "found": False}
    return {"order_id": order_id, "found": True, **order}


@tool(read_only=True, cache_ttl=300)
async def search_faq(ctx: ToolContext, query: str) -> list[dict[str, str]]:
    """Search the shop's policy FAQ (returns, shipping, warranty, payment)."""
    words = set(re.findall(r"[a-z]+", query.lower()))
    return [f for f in DATA["faq"] if f["topic"] in words or f["topic"].rstrip("s") in words]


@tool(writes=True)
async def create_ticket(ctx: ToolContext, order_id: str, reason: str) -> dict[str, str]:
    """Open a support ticket for an order (refunds, damaged goods)."""
    key = ctx.idempotency_key or f"{order_id}:{reason}"
    ticket = TICKETS.setdefault(
        key, {"ticket_id": f"T-{len(TICKETS) + 1:04d}", "order_id": order_id, "reason": reason}
    )
    await ctx.emit_status(f"ticket {ticket['ticket_id']} opened")
    return ticket


def scripted_support_model(
    messages: list[dict[str, Any]], tools: list[ToolDefinition]
) -> ModelResponse:
    """A deterministic stand-in for a real model: picks a tool, then answers from it."""
    question = str(messages[0]["content"])
    lowered = question.lower()
    order = re.search(r"\b(\d{4})\b", question)
    if count_model_calls(messages) == 0:
        if order and ("refund" in lowered or "broken" in lowered):
            return reply_tool_call(
                "create_ticket", order_id=order.group(1), reason="damaged item, refund requested"
            )
        if order:
            return reply_tool_call("lookup_order", order_id=order.group(1))
        topic = next(
            (t for t in ("returns", "shipping", "warranty", "payment") if t.rstrip("s") in lowered),
            "returns",
        )
        return reply_tool_call("search_faq", query=topic)
    result = json.loads(last_tool_results(messages)[0] or "null")
    if isinstance(result, list):
        return reply_text(result[0]["answer"] if result else "I could not find that policy.")
    if isinstance(result, dict) and "ticket_id" in result:
        return reply_text(
            f"I opened ticket {result['ticket_id']} for order "
            f"{result['order_id']}; a refund will follow once it is reviewed."
        )
    if isinstance(result, dict) and result.get("found"):
        eta = f", expected {result['eta']}" if result.get("eta") else ""
        return reply_text(f"Order {result['order_id']} is {result['status']}{eta}.")
    return reply_text("I could not find that order; please check the number.")


def choose_llm() -> LLMClient:
    """Anthropic if its key is set, else OpenAI (or compatible), else the scripted model."""
    if os.environ.get("ANTHROPIC_API_KEY"):
        from pyrula_stream.llm import AnthropicLLM

        return AnthropicLLM(os.environ.get("PYRULA_ANTHROPIC_MODEL", "claude-sonnet-4-5"))
    if os.environ.get("OPENAI_API_KEY"):
        from pyrula_stream.llm import OpenAILLM

        return OpenAILLM(
            os.environ.get("PYRULA_OPENAI_MODEL", "gpt-4.1-mini"),
            base_url=os.environ.get("OPENAI_BASE_URL"),
        )
    return FakeLLM(scripted_support_model, latency_s=0.05)


@kafka_agent(
    name="support",
    llm=choose_llm(),
    tools=[lookup_order, search_faq, create_ticket],
    limits=AgentLimits(max_llm_calls=6, max_tool_calls=6),
    partitions=3,
    keep_history=True,  # finished turns go to pyrula.support.history (golden turns)
)
async def support(ctx: AgentContext, customer: str, question: str) -> dict[str, str]:
    answer = await ctx.llm.run([{"role": "user", "content": question}], system=SYSTEM)
    return {"customer": customer, "answer": answer}
