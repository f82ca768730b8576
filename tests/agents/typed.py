"""An agent with a typed result, for `pyrula-stream schema` (no optional extras needed)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel

from pyrula_stream import AgentContext, kafka_agent
from pyrula_stream.llm import FakeLLM


class Triage(BaseModel):
    order_id: str
    priority: Literal["low", "high"]
    reply: str


@kafka_agent(name="typed", llm=FakeLLM(), output_type=Triage)
async def typed(ctx: AgentContext, order_id: str) -> str:
    return await ctx.llm.run([{"role": "user", "content": order_id}])
