"""Agents for the process tests of sub-agents and durable timers; names come from the
environment so each test has its own topics."""

from __future__ import annotations

import asyncio
import os
from typing import Any

from pyrula_stream import AgentContext, kafka_agent
from pyrula_stream.llm import FakeLLM


@kafka_agent(name=os.environ.get("MESH_REFUNDS", "refunds"), llm=FakeLLM(["ok"]), partitions=2)
async def refunds(ctx: AgentContext, order_id: str, cents: int) -> dict[str, Any]:
    return {"order_id": order_id, "refunded": cents}


@kafka_agent(name=os.environ.get("MESH_TRIAGE", "triage"), llm=FakeLLM(["ok"]), partitions=2)
async def triage(ctx: AgentContext, order_id: str, cents: int) -> str:
    done = await ctx.call_agent(refunds, order_id=order_id, cents=cents)
    return f"refunded {done['refunded']}"


@kafka_agent(name=os.environ.get("MESH_TIMER", "timer"), llm=FakeLLM(["ok"]), partitions=1)
async def timer(ctx: AgentContext, seconds: float) -> str:
    await ctx.emit_status("sleeping")
    await ctx.sleep(seconds)
    return f"woke after {seconds}"


@kafka_agent(name=os.environ.get("MESH_PATIENT", "patient"), llm=FakeLLM(["ok"]), partitions=1)
async def patient(ctx: AgentContext) -> str:
    for _ in range(1800):  # until its cancel arrives (90 s at most)
        if ctx.cancelled:
            break
        await asyncio.sleep(0.05)
    return "never cancelled"


@kafka_agent(name=os.environ.get("MESH_WAITER", "waiter"), llm=FakeLLM(["ok"]), partitions=1)
async def waiter(ctx: AgentContext) -> Any:
    return await ctx.call_agent(patient)
