"""The agents the bench runs: a one-tool turn (two model calls) and an N-step turn.

The one-tool turn is the issue's unit of work: a model call that asks for one tool, the
tool, and a second model call that answers; ``steps=20`` makes it twenty model-and-tool
steps before the answer (what the CPU phase prices per step). The N-step turn makes
exactly N ``ctx.step`` calls with a fixed ~100-byte result each, so the journal's growth
per step can be read off.
"""

from __future__ import annotations

from typing import Any

from pyrula_stream import AgentContext, ToolContext, kafka_agent, tool
from pyrula_stream.agent import KafkaAgent
from pyrula_stream.bench.harness import PREFIX
from pyrula_stream.llm.fake import FakeLLM, reply_text, reply_tool_call

QUESTION = {"question": "Where is order 1234? It was due on Monday."}
SYSTEM = "You are a support agent. Use the tools, then answer in one sentence."
STEP_TEXT = "x" * 100


@tool(read_only=True)
async def lookup_order(ctx: ToolContext, order_id: str) -> dict[str, Any]:
    """Look up an order by id: status and carrier. Answers at once (no simulated time)."""
    return {"order_id": order_id, "status": "shipped", "carrier": "DHL", "eta": "Thursday"}


def tool_turn_agent(name: str, *, latency_s: float, partitions: int, steps: int = 1) -> KafkaAgent:
    """``steps`` times a model call asking for ``lookup_order`` and the tool, then one model
    call answering (a step: one model call and one tool call; the default is the one-tool
    turn)."""
    llm = FakeLLM(
        [
            *(reply_tool_call("lookup_order", order_id=str(1234 + i)) for i in range(steps)),
            reply_text("Order 1234 shipped with DHL and should arrive on Thursday."),
        ],
        latency_s=latency_s,
    )

    @kafka_agent(name=name, prefix=PREFIX, llm=llm, tools=[lookup_order], partitions=partitions)
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
