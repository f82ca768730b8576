"""An agent for the process tests of signals: it waits for a signal, with or without a
timeout; its name comes from the environment so each test has its own topics."""

from __future__ import annotations

import os

from pyrula_stream import AgentContext, WaitTimeout, kafka_agent
from pyrula_stream.llm import FakeLLM


@kafka_agent(name=os.environ.get("WAITING_AGENT", "waiting"), llm=FakeLLM(["ok"]), partitions=1)
async def waiting(ctx: AgentContext, seconds: float | None = None) -> str:
    await ctx.emit_status("waiting")
    try:
        signal = await ctx.wait_for_signal("go", timeout=seconds)
    except WaitTimeout as exc:
        return f"timed out at {exc.deadline.isoformat() if exc.deadline else None}"
    return f"went with {signal.payload}"
