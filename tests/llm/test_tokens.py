"""The token estimate: the same number counted whole or one message at a time, and a
tool loop that counts each message of its conversation once, however long the turn."""

from __future__ import annotations

import json
import math
import random
from typing import Any

from pyrula_stream import (
    AgentContext,
    AgentLimits,
    KafkaAgentClient,
    ToolContext,
    kafka_agent,
    tool,
)
from pyrula_stream.bench.workload import ScriptModel
from pyrula_stream.llm import reply_text, reply_tool_call
from pyrula_stream.llm.base import ToolDefinition
from pyrula_stream.llm.tokens import RunningEstimate, estimate_tokens
from pyrula_stream.testing import running_worker, unique_name

_JSON = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), default=str)


def recount(messages: list[dict[str, Any]], system: str | None, tools: list[Any] | None) -> int:
    """The documented formula, written out the slow way: the whole request's compact JSON,
    a token per four ASCII characters (rounded up) and one per other character, plus four
    a message and eight a request."""
    as_json = [
        {"name": t.name, "description": t.description, "schema": t.input_schema}
        if isinstance(t, ToolDefinition)
        else dict(t)
        for t in tools or ()
    ]
    text = _JSON.encode({"system": system or "", "tools": as_json, "messages": messages})
    other = sum(1 for ch in text if ord(ch) > 127)
    return math.ceil((len(text) - other) / 4) + other + 4 * len(messages) + 8


def _message(rng: random.Random, i: int) -> dict[str, Any]:
    text = "".join(rng.choice('abc d\n"\\日本語😀é') for _ in range(rng.randint(0, 80)))
    if i % 3 == 2:
        return {"role": "user", "content": [{"type": "tool_result", "content": text}]}
    return {"role": "assistant" if i % 2 else "user", "content": text}


def test_running_estimate_equals_a_full_recount_through_edits_and_compaction() -> None:
    rng = random.Random(47)
    tools: list[Any] = [ToolDefinition("lookup", "Find ✓ an order.", {"type": "object"})]
    running = RunningEstimate()
    conversation: list[dict[str, Any]] = []
    system: str | None = None
    for i in range(600):
        conversation.append(_message(rng, i))
        if i == 100:
            system = "You are terse. Réponds."
        if i == 200:
            tools = [*tools, {"name": "raw", "description": "a dict tool ✓"}]
        if i == 250:
            tools = tools[:1]
        if i == 300:  # compaction: a summary replaces everything before
            conversation = [{"role": "user", "content": "Summary ✓"}, conversation[-1]]
        if i == 400:  # the newest message edited in place: another object at the end
            conversation[-1] = {**conversation[-1], "content": "edited 日本"}
        if i == 450:  # an earlier message replaced: the first one is another object
            conversation = [dict(conversation[0]), *conversation[1:]]
        if i == 500:  # cut short: shorter than what was counted
            conversation = conversation[:10]
        sent = [*conversation]  # each call its own copy, as the tool loop sends
        expected = recount(sent, system, tools)
        assert running.of(sent, system, tools) == expected, i
        assert estimate_tokens(sent, system, tools) == expected, i


class _Counted:
    """A message part whose JSON is its ``str``: counts how often it is encoded."""

    def __init__(self) -> None:
        self.encoded = 0

    def __str__(self) -> str:
        self.encoded += 1
        return "Where is order 1234?"


@tool(read_only=True)
async def lookup(ctx: ToolContext, order_id: str) -> str:
    """Look up an order."""
    return f"order {order_id}: shipped"


async def test_a_long_turn_counts_each_message_once(
    kafka_bootstrap_servers: str, client: KafkaAgentClient
) -> None:
    """30 model calls with a context window: the question is encoded once for the input
    fingerprint and once for the estimate, not again before every call."""
    steps = 30
    question = _Counted()
    llm = ScriptModel(
        [*(reply_tool_call("lookup", order_id=str(i)) for i in range(steps)), reply_text("done")]
    )

    @kafka_agent(
        name=unique_name("tokens"),
        llm=llm,
        tools=[lookup],
        partitions=1,
        limits=AgentLimits(
            max_llm_calls=steps + 1, context_window=1_000_000, reserved_output_tokens=1000
        ),
    )
    async def agent(ctx: AgentContext) -> str:
        return await ctx.llm.run([{"role": "user", "content": question}])

    async with running_worker(agent, kafka_bootstrap_servers):
        events = await client.run(agent.name, timeout=60)
    assert events[-1].type == "run:complete", events[-1].data
    assert question.encoded == 2


async def test_an_agents_own_estimate_still_decides(
    kafka_bootstrap_servers: str, client: KafkaAgentClient
) -> None:
    """``AgentLimits(estimate_tokens=...)`` is asked before every model call, instead of
    the running estimate: a window the default estimate would overflow lets it through."""
    asked: list[int] = []

    def estimate(messages: list[dict[str, Any]], system: str | None, tools: Any) -> int:
        asked.append(len(messages))
        return 1

    llm = ScriptModel([reply_tool_call("lookup", order_id="1"), reply_text("done")])

    @kafka_agent(
        name=unique_name("own-estimate"),
        llm=llm,
        tools=[lookup],
        partitions=1,
        limits=AgentLimits(context_window=50, estimate_tokens=estimate),
    )
    async def agent(ctx: AgentContext) -> str:
        return await ctx.llm.run([{"role": "user", "content": "x" * 1000}])

    assert estimate_tokens([{"role": "user", "content": "x" * 1000}]) > 50
    async with running_worker(agent, kafka_bootstrap_servers):
        events = await client.run(agent.name, timeout=60)
    assert events[-1].type == "run:complete", events[-1].data
    assert asked == [1, 3]  # each model call's whole request, as the agent's own function
