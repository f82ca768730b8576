"""A tenanted agent for process tests: its name from the environment, its tenant from the
request's metadata, three turns a minute per tenant across the group."""

from __future__ import annotations

import os

from pyrula_stream import AgentContext, kafka_agent
from pyrula_stream.agent.tenants import TenantLimits
from pyrula_stream.llm import FakeLLM


@kafka_agent(
    name=os.environ.get("TENANTED_AGENT_NAME", "tenanted"),
    llm=FakeLLM(["ok"]),
    partitions=2,
    tenant=lambda request: request.metadata.get("tenant"),
    unknown_tenants="own",
    tenant_limits=TenantLimits(turns_per_minute=3),
)
async def tenanted(ctx: AgentContext) -> str:
    return await ctx.llm.run([{"role": "user", "content": "hi"}])
