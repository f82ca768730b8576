"""``pyrula-stream signal`` (and the answers to questions) against a running worker."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

from pyrula_stream import AgentContext, KafkaAgentClient, WorkerOptions, kafka_agent
from pyrula_stream.llm import FakeLLM
from pyrula_stream.testing import running_worker, unique_name, wait_for

ROOT = Path(__file__).parent.parent
OPTIONS = WorkerOptions(shutdown_grace=0.2)


async def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "pyrula_stream.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


async def test_signal_command_delivers_and_reports_a_refusal(
    kafka_bootstrap_servers: str, client: KafkaAgentClient
) -> None:
    @kafka_agent(name=unique_name("cli-signal"), llm=FakeLLM(["ok"]), partitions=1)
    async def agent(ctx: AgentContext) -> object:
        signal = await ctx.wait_for_signal("go")
        return {"payload": signal.payload, "sender": signal.sender}

    bootstrap = ["--bootstrap-servers", kafka_bootstrap_servers]
    async with running_worker(agent, kafka_bootstrap_servers, OPTIONS) as worker:
        handle = await client.submit(agent.name)
        await wait_for(lambda: worker.parked_turns == 1, 60, "the turn parked")
        sent = await cli(
            "signal", agent.name, handle.turn_id, "go", "n=3", "--as", "bo", *bootstrap
        )
        assert sent.returncode == 0, sent.stderr
        assert json.loads(sent.stdout)["accepted"] is True
        events = [e async for e in client.stream(agent.name, handle.turn_id)]
        assert events[-1].data["result"] == {"payload": {"n": 3}, "sender": "bo"}
        again = await cli("signal", agent.name, handle.turn_id, "go", *bootstrap)
    assert again.returncode == 3
    assert "refused (ended)" in again.stderr
