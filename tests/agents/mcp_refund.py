"""An agent for the MCP crash test: its model refunds through an MCP server, then the
turn waits for a file, so the test can SIGKILL the worker after the refund is journaled."""

from __future__ import annotations

import asyncio
import os
import time

from pyrula_stream import AgentContext, MCPServer, kafka_agent
from pyrula_stream.llm import FakeLLM, reply_tool_call


def _block_until_exists(path: str) -> None:
    while not os.path.exists(path):
        time.sleep(0.05)


async def wait_for_file(path: str) -> bool:
    await asyncio.to_thread(_block_until_exists, path)
    return True


@kafka_agent(
    name=os.environ.get("MCP_AGENT_NAME", "mcp_refund"),
    llm=FakeLLM([reply_tool_call("orders_refund", order_id="k1", cents=100), "refunded"]),
    mcp_servers=[MCPServer("orders", url=os.environ.get("MCP_URL", "http://127.0.0.1:9/mcp"))],
    partitions=1,
)
async def refunder(ctx: AgentContext) -> str:
    answer = await ctx.llm.run([{"role": "user", "content": "refund order k1"}])
    await ctx.step("gate", wait_for_file, os.environ.get("GATE_FILE", "/nonexistent"))
    return answer
