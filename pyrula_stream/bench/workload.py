"""The agents the bench runs: a one-tool turn (two model calls) and an N-step turn.

The one-tool turn is the issue's unit of work: a model call that asks for one tool, the
tool, and a second model call that answers; ``steps=20`` makes it twenty model-and-tool
steps before the answer (what the CPU phase prices per step). The N-step turn makes
exactly N ``ctx.step`` calls with a fixed ~100-byte result each, so the journal's growth
per step can be read off.

The one-tool and N-step turns are answered by ``ScriptModel``: the scripted replies of
``FakeLLM`` at a constant cost per call. ``FakeLLM`` encodes the whole conversation on
every call to fill in its usage, which in a 200-step turn is most of the worker's CPU and
grows with the turn's length; the bench measures the framework, not the stand-in model.
Its latency is fixed, or (``spread`` > 0) drawn per call, uniformly within
``latency_s x (1 +- spread)``, from a seeded generator: real model calls do not all
return in the same millisecond, and the in-flight phase measures the worker under those.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Sequence
from typing import Any

from pyrula_stream import AgentContext, ToolContext, kafka_agent, tool
from pyrula_stream.agent.definition import KafkaAgent
from pyrula_stream.agent.limits import DEFAULT_MAX_LLM_CALLS, DEFAULT_MAX_TOOL_CALLS, AgentLimits
from pyrula_stream.bench.harness import PREFIX
from pyrula_stream.llm.base import (
    LLMClient,
    ModelResponse,
    StreamItem,
    TextBlock,
    TextDelta,
    ToolDefinition,
    Usage,
)
from pyrula_stream.llm.fake import FakeLLM, reply_text, reply_tool_call

QUESTION = {"question": "Where is order 1234? It was due on Monday."}
SYSTEM = "You are a support agent. Use the tools, then answer in one sentence."
STEP_TEXT = "x" * 100


@tool(read_only=True)
async def lookup_order(ctx: ToolContext, order_id: str) -> dict[str, Any]:
    """Look up an order by id: status and carrier. Answers at once (no simulated time)."""
    return {"order_id": order_id, "status": "shipped", "carrier": "DHL", "eta": "Thursday"}


@tool(name="lookup_order")
async def lookup_order_with_effects(ctx: ToolContext, order_id: str) -> dict[str, Any]:
    """``lookup_order`` as a tool with effects (not ``read_only``): the model's response
    must be durable before it runs, so the turn waits for one more commit."""
    return {"order_id": order_id, "status": "shipped", "carrier": "DHL", "eta": "Thursday"}


class ScriptModel(LLMClient):
    """The n-th reply for a conversation of ``1 + 2n`` messages (the question, then a
    response and a tool result per step); the last one repeats. Constant work per call:
    the reply is picked by the conversation's length and its usage is fixed."""

    provider = "fake"

    def __init__(
        self,
        replies: Sequence[ModelResponse],
        *,
        latency_s: float = 0.0,
        spread: float = 0.0,
        seed: int = 47,
    ) -> None:
        self.model = "fake"
        self.latency_s = latency_s
        self.spread = spread
        self._random = random.Random(seed)
        usage = Usage(input_tokens=100, output_tokens=20)
        self._replies = [
            r.model_copy(update={"usage": usage, "model": self.model}) for r in replies
        ]

    async def stream(
        self,
        messages: list[dict[str, Any]],
        tools: list[ToolDefinition] | None = None,
        system: str | None = None,
    ) -> AsyncIterator[StreamItem]:
        if self.latency_s:
            await asyncio.sleep(model_latency(self.latency_s, self.spread, self._random))
        response = self._replies[min((len(messages) - 1) // 2, len(self._replies) - 1)]
        for block in response.content:
            if isinstance(block, TextBlock):
                yield TextDelta(block.text)
        yield response


def model_latency(latency_s: float, spread: float, rng: random.Random) -> float:
    """One call's latency: ``latency_s``, or uniform within ``latency_s x (1 +- spread)``."""
    if spread <= 0:
        return latency_s
    return latency_s * rng.uniform(1 - spread, 1 + spread)


def tool_turn_agent(
    name: str,
    *,
    latency_s: float,
    partitions: int,
    steps: int = 1,
    read_only: bool = True,
    spread: float = 0.0,
) -> KafkaAgent:
    """``steps`` times a model call asking for ``lookup_order`` and the tool, then one model
    call answering (a step: one model call and one tool call; the default is the one-tool
    turn). ``read_only=False`` gives it the tool with effects (same answer); ``spread`` draws
    each call's latency around ``latency_s`` (``model_latency``)."""
    llm = ScriptModel(
        [
            *(reply_tool_call("lookup_order", order_id=str(1234 + i)) for i in range(steps)),
            reply_text("Order 1234 shipped with DHL and should arrive on Thursday."),
        ],
        latency_s=latency_s,
        spread=spread,
    )
    limits = AgentLimits(
        max_llm_calls=max(DEFAULT_MAX_LLM_CALLS, steps + 1),
        max_tool_calls=max(DEFAULT_MAX_TOOL_CALLS, steps),
    )

    @kafka_agent(
        name=name,
        prefix=PREFIX,
        llm=llm,
        tools=[lookup_order if read_only else lookup_order_with_effects],
        partitions=partitions,
        limits=limits,
    )
    async def support(ctx: AgentContext, question: str) -> str:
        return await ctx.llm.run([{"role": "user", "content": question}], system=SYSTEM)

    return support


def _step_result(i: int) -> dict[str, Any]:
    return {"i": i, "text": STEP_TEXT}


def steps_agent(name: str, *, partitions: int = 1) -> KafkaAgent:
    """A turn of ``steps`` durable ``ctx.step`` calls, each journaling ~100 bytes."""

    @kafka_agent(name=name, prefix=PREFIX, partitions=partitions, llm=FakeLLM())
    async def stepper(ctx: AgentContext, steps: int) -> int:
        for i in range(steps):
            await ctx.step(f"step{i}", _step_result, i)
        return steps

    return stepper
