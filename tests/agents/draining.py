"""An agent for the probe tests of a draining worker: a turn that takes ``seconds``, and
says it started by writing the file ``$DRAINING_MARK``, so a test stops the worker while
the turn is in flight."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from pyrula_stream import AgentContext, kafka_agent
from pyrula_stream.llm import FakeLLM


@kafka_agent(
    name=os.environ.get("DRAINING_AGENT_NAME", "draining"), llm=FakeLLM(["ok"]), partitions=1
)
async def draining(ctx: AgentContext, seconds: float) -> str:
    await asyncio.to_thread(Path(os.environ["DRAINING_MARK"]).write_text, ctx.turn_id)
    await asyncio.sleep(seconds)
    return f"slept {seconds}s"
