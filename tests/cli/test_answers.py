"""``pyrula-stream signal`` (and the answers to questions) against a running worker."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

from pyrula_stream import AgentContext, KafkaAgentClient, ToolCallRejected, kafka_agent
from pyrula_stream.llm import FakeLLM
from pyrula_stream.testing import unique_name, wait_for
from tests.approvals_kit import Refunds, Serve, hitl_agent

ROOT = Path(__file__).parents[2]


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
    kafka_bootstrap_servers: str, client: KafkaAgentClient, serve: Serve
) -> None:
    @kafka_agent(name=unique_name("cli-signal"), llm=FakeLLM(["ok"]), partitions=1)
    async def agent(ctx: AgentContext) -> object:
        signal = await ctx.wait_for_signal("go")
        return {"payload": signal.payload, "sender": signal.sender}

    bootstrap = ["--bootstrap-servers", kafka_bootstrap_servers]
    async with serve(agent) as worker:
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


async def test_pending_approve_reject_and_tail_show_the_question(
    kafka_bootstrap_servers: str, client: KafkaAgentClient, serve: Serve, refunds: Refunds
) -> None:
    refund = refunds.tool()

    async def body(ctx: AgentContext, cents: int) -> str:
        try:
            return str(await refund(ctx, cents=cents))
        except ToolCallRejected as exc:
            return f"rejected: {exc.reason}"

    agent = hitl_agent("cli-approve", body, [refund])

    bootstrap = ["--bootstrap-servers", kafka_bootstrap_servers]
    async with serve(agent) as worker:
        first = await client.submit(agent.name, cents=1)
        second = await client.submit(agent.name, cents=2)
        await wait_for(lambda: worker.parked_turns == 2, 60, "both turns asked")
        listed, tailed = await asyncio.gather(  # two readers: run side by side
            cli("pending", agent.name, *bootstrap),
            cli(
                "tail",
                agent.name,
                "--turn",
                first.turn_id,
                "--from-beginning",
                "--timeout",
                "3",
                *bootstrap,
            ),
        )
        assert listed.returncode == 0, listed.stderr
        questions = [json.loads(line) for line in listed.stdout.splitlines()]
        assert {(q["turn_id"], q["tool_input"]["cents"]) for q in questions} == {
            (first.turn_id, 1),
            (second.turn_id, 2),
        }
        key = questions[0]["key"]
        assert key == "tool_approval:refund#0"
        assert "run:interrupted" in tailed.stdout
        assert f"pyrula-stream approve|reject {agent.name} {first.turn_id} {key}" in tailed.stdout
        ok, no = await asyncio.gather(  # answers to two different turns
            cli("approve", agent.name, first.turn_id, key, "--as", "ana", *bootstrap),
            cli("reject", agent.name, second.turn_id, key, "--reason", "too much", *bootstrap),
        )
        assert ok.returncode == 0, ok.stderr
        assert no.returncode == 0, no.stderr
        done = [[e async for e in client.stream(agent.name, h.turn_id)] for h in (first, second)]
        again = await cli("approve", agent.name, first.turn_id, key, *bootstrap)
    assert again.returncode == 3 and "refused" in again.stderr
    assert done[0][-1].data["result"] == "refunded"
    assert done[1][-1].data["result"] == "rejected: too much"
    answered = next(e.data for e in done[0] if e.type == "tool:result")
    assert answered["answered_by"] == "ana"
    assert refunds.ran == [1]
