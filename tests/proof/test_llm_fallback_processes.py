"""FallbackLLM across a SIGKILL: a turn whose primary is down gets its answer from the
second model; the worker is killed while the tool that answer asked for runs; the next
worker replays the recorded answer (no provider is asked for that call again), reruns the
tool and asks only for the turn's next call."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from pyrula_stream import KafkaAgentClient
from pyrula_stream.chaos.processes import Managed, child_env
from pyrula_stream.testing import agent_topics_ready, unique_name, wait_for
from pyrula_stream.testing_servers.anthropic_server import MODEL as ANTHROPIC_MODEL
from pyrula_stream.testing_servers.anthropic_server import AnthropicWireServer, ToolUse
from pyrula_stream.testing_servers.openai_server import MODEL as OPENAI_MODEL
from pyrula_stream.testing_servers.openai_server import OpenAIWireServer

TRIES = 2  # tests/agents/failover.py: max_retries=1 on the primary


async def test_a_failed_over_answer_is_replayed_after_a_sigkill_without_asking_again(
    kafka_bootstrap_servers: str, client: KafkaAgentClient, tmp_path: Path
) -> None:
    agent = unique_name("failover")
    runs = tmp_path / "runs"
    with OpenAIWireServer() as primary, AnthropicWireServer() as secondary:
        env = child_env(
            {
                "FAILOVER_AGENT_NAME": agent,
                "FAILOVER_RUNS": str(runs),
                "FAILOVER_OPENAI_URL": primary.base_url,
                "FAILOVER_OPENAI_MODEL": OPENAI_MODEL,
                "FAILOVER_ANTHROPIC_URL": secondary.base_url,
                "FAILOVER_ANTHROPIC_MODEL": ANTHROPIC_MODEL,
            }
        )
        argv = [
            sys.executable,
            "-m",
            "pyrula_stream.cli",
            "worker",
            "tests.agents.failover:failover",
            "--bootstrap-servers",
            kafka_bootstrap_servers,
            "--worker-id",
            "failover-1",
        ]
        workers = [
            Managed(f"failover-{i}", argv, env, tmp_path / f"worker-{i}.log") for i in (1, 2)
        ]

        for _ in range(TRIES):
            primary.reply_server_error(503)
        secondary.reply_stream([ToolUse("toolu_1", "charge", {"cents": 5})], stop_reason="tool_use")
        try:
            workers[0].start()
            await agent_topics_ready(kafka_bootstrap_servers, agent)
            handle = await client.submit(agent)
            await wait_for(runs.exists, 120, "the tool started after the failover")
            await asyncio.to_thread(workers[0].kill)
            asked = (len(primary.requests), len(secondary.requests))
            assert asked == (TRIES, 1)

            for _ in range(TRIES):  # the primary is still down for the turn's next call
                primary.reply_server_error(503)
            secondary.reply_text("charged 5 cents")
            workers[1].start()  # under the same id: it fences what the killed one left
            events = [
                e async for e in client.stream(agent, handle.turn_id, idle_timeout_seconds=120)
            ]
        finally:
            for worker in workers:
                await asyncio.to_thread(worker.stop, 30)
    assert events[-1].type == "run:complete", events[-1].data
    assert events[-1].data["result"] == "charged 5 cents"
    completes = [e.data for e in events if e.type == "llm:complete"]
    assert [c["model"] for c in completes] == [ANTHROPIC_MODEL, ANTHROPIC_MODEL]
    # The first call's answer came from the journal: each provider was asked once more,
    # for the second call only.
    assert (len(primary.requests), len(secondary.requests)) == (2 * TRIES, 2)
    assert runs.read_text().split() == ["5", "5"], "the tool reran after the kill"
