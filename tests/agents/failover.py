"""A failing-over agent for process tests: OpenAI first, Anthropic second, both at the
local wire servers the environment names; its tool marks each run in a file and, on its
first run, waits to be killed."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from pyrula_stream import AgentContext, ToolContext, kafka_agent, tool
from pyrula_stream.llm import AnthropicLLM, FallbackLLM, OpenAILLM

RUNS = Path(os.environ.get("FAILOVER_RUNS", "/dev/null"))


def _mark(cents: int) -> bool:
    """Note one run of the tool; whether it is the first."""
    first = not RUNS.exists()
    with RUNS.open("a") as f:
        f.write(f"{cents}\n")
    return first


@tool
async def charge(ctx: ToolContext, cents: int) -> str:
    """Charges a card (an effect: the model's answer is durable before it runs)."""
    if await asyncio.to_thread(_mark, cents):
        await asyncio.sleep(3600)  # the test SIGKILLs the worker here
    return "charged"


@kafka_agent(
    name=os.environ.get("FAILOVER_AGENT_NAME", "failover"),
    llm=FallbackLLM(
        [
            OpenAILLM(
                os.environ.get("FAILOVER_OPENAI_MODEL", "gpt-4o-mini"),
                api_key="sk-proj-wire-test",
                base_url=os.environ.get("FAILOVER_OPENAI_URL"),
                backoff_base_s=0.001,
                max_retries=1,
            ),
            AnthropicLLM(
                os.environ.get("FAILOVER_ANTHROPIC_MODEL", "claude-sonnet-4-5"),
                api_key="sk-ant-wire-test",
                base_url=os.environ.get("FAILOVER_ANTHROPIC_URL"),
                max_tokens=1024,
                backoff_base_s=0.001,
            ),
        ]
    ),
    tools=[charge],
    partitions=1,
)
async def failover(ctx: AgentContext) -> str:
    return await ctx.llm.run([{"role": "user", "content": "charge 5"}])
