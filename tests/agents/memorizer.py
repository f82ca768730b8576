"""A memory-writing agent for tests that SIGKILL its worker process mid-turn.

The turn puts an item, then calls ``park``, which waits while ``$MEMORIZER_DIR/hold``
exists (and creates ``parked`` so the test knows the put is behind it).
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

from pyrula_stream import AgentContext, ToolContext, kafka_agent, tool
from pyrula_stream.llm import FakeLLM, reply_tool_call


@tool(writes=True)
async def park(ctx: ToolContext) -> str:
    """Wait while the test holds the turn."""
    base = Path(os.environ["MEMORIZER_DIR"])
    (base / "parked").touch()
    while (base / "hold").exists():  # noqa: ASYNC110 (the test process holds the file)
        await asyncio.sleep(0.05)
    return "parked"


@kafka_agent(
    name=os.environ.get("MEMORIZER_AGENT_NAME", "memorizer"),
    llm=FakeLLM([reply_tool_call("park"), "done"]),
    tools=[park],
    partitions=1,
)
async def memorizer(ctx: AgentContext, ns: str) -> Any:
    await ctx.memory.put(("tests", ns), "k", {"v": 1})
    await ctx.llm.run([{"role": "user", "content": "park"}])
    item = await ctx.memory.get(("tests", ns), "k")
    return None if item is None else item.value
