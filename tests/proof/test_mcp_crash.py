"""A worker process SIGKILLed after an MCP call's journal commit: the next worker resumes
the turn without calling the MCP tool again (counted on the MCP server's side)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

from mcp import Client

from pyrula_stream import Event, KafkaAgentClient
from pyrula_stream.testing import agent_topics_ready, unique_name
from tests.mcp_servers.processes import ROOT, OrderServer, sigkill


def start_worker(bootstrap: str, env: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pyrula_stream.cli",
            "worker",
            "tests.agents.mcp_refund:refunder",
            "--bootstrap-servers",
            bootstrap,
            "--worker-id",
            "mcp-crash",
        ],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": ROOT, **env},
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )


async def refunds(server: OrderServer) -> int:
    async with Client(server.url) as mcp:
        result = await mcp.call_tool("call_count", {"key": "refund:k1"})
    return int(result.structured_content["result"])  # type: ignore[index]


async def test_sigkill_after_the_mcp_calls_commit_does_not_call_it_again(
    kafka_bootstrap_servers: str, client: KafkaAgentClient, tmp_path: Path
) -> None:
    server = OrderServer().start()
    gate = tmp_path / "gate"
    name = unique_name("mcpkill")
    env = {"MCP_AGENT_NAME": name, "MCP_URL": server.url, "GATE_FILE": str(gate)}
    first = start_worker(kafka_bootstrap_servers, env)
    second: subprocess.Popen[bytes] | None = None
    try:
        await agent_topics_ready(kafka_bootstrap_servers, name)
        handle = await client.submit(name)
        seen: list[Event] = []

        async def until_the_refund_is_committed() -> None:
            async for event in client.stream(name, handle.turn_id):  # read_committed
                seen.append(event)
                if event.type == "tool:result":
                    return

        await asyncio.wait_for(until_the_refund_is_committed(), 120)
        sigkill(first)  # the turn is parked in its gate step, after the refund's commit
        assert seen[-1].data["tool"] == "orders_refund" and seen[-1].data["status"] == "ok"
        assert await refunds(server) == 1

        gate.write_text("open")
        second = start_worker(kafka_bootstrap_servers, env)
        events = await asyncio.wait_for(_collect(client, name, handle.turn_id), 120)
        assert events[-1].type == "run:complete", events[-1].data
        assert events[-1].data["result"] == "refunded"
        assert events[-1].attempt == 2
        assert [e.type for e in events].count("tool:result") == 1
        assert await refunds(server) == 1, "the journaled MCP call was not made again"
    finally:
        sigkill(first)
        sigkill(second)
        server.kill()


async def _collect(client: KafkaAgentClient, agent: str, turn_id: str) -> list[Event]:
    return [e async for e in client.stream(agent, turn_id)]
