"""A versioned agent for rolling-deploy tests, one process per worker. The environment
says which versions this worker has: ``VERSIONS=1`` (the old deploy), ``2`` (new code
only) or ``1,2`` (new code that keeps version 1 for in-flight turns)."""

from __future__ import annotations

import os
import time
from pathlib import Path

from pyrula_stream import AgentContext, ToolContext, kafka_agent, tool
from pyrula_stream.llm import FakeLLM, reply_tool_call

GATE = Path(os.environ.get("VERSIONED_GATE", "/nonexistent"))
EFFECTS = Path(os.environ.get("VERSIONED_EFFECTS", "/dev/null"))
TAG = os.environ.get("VERSIONED_TAG", "?")


@tool(read_only=True, timeout=300)
def slow_lookup(ctx: ToolContext, order_id: str) -> str:
    """Look an order up; waits (in its thread) until the test opens the gate."""
    with EFFECTS.open("a") as f:
        f.write(f"{TAG} {ctx.idempotency_key}\n")
    while not GATE.exists():
        time.sleep(0.05)
    return f"order {order_id} shipped"


async def version_1(ctx: AgentContext, question: str) -> str:
    answer = await ctx.llm.run([{"role": "user", "content": question}], system="Version one.")
    return f"v1: {answer}"


async def version_2(ctx: AgentContext, question: str) -> str:
    answer = await ctx.llm.run([{"role": "user", "content": question}], system="Version two.")
    return f"v2: {answer}"


HAS = os.environ.get("VERSIONS", "1").split(",")
agent = kafka_agent(
    name=os.environ.get("VERSIONED_AGENT_NAME", "versioned"),
    llm=FakeLLM([reply_tool_call("slow_lookup", order_id="7"), "it shipped"]),
    tools=[slow_lookup],
    partitions=1,
    version=HAS[-1],
    versions={"1": version_1} if HAS == ["1", "2"] else {},
)(version_1 if HAS == ["1"] else version_2)
