"""A record that kills worker processes is quarantined after ``max_retries`` crashes.

A supervised worker whose tool calls ``os._exit`` on a marker: no decoder can guard
against that, so the next owners count the crashes from the partition's journal and the
record ends in the DLQ with ``poison_quarantine``, while later records complete.
"""

from __future__ import annotations

import asyncio
import os
import re
import sys
from pathlib import Path

from pyrula_stream import KafkaAgentClient
from pyrula_stream.testing import agent_topics_ready, read_topic, unique_name, wait_for

ROOT = Path(__file__).parent.parent
STARTED = re.compile(r"worker (\S+) started \(pid (\d+)\)")


async def test_a_record_that_kills_workers_is_quarantined_and_the_partition_moves_on(
    kafka_bootstrap_servers: str, client: KafkaAgentClient
) -> None:
    agent = unique_name("crasher")
    supervisor = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "pyrula_stream.cli",
        "worker",
        "tests.agents.crasher:crasher",
        "--bootstrap-servers",
        kafka_bootstrap_servers,
        "--processes",
        "1",
        "--worker-id",
        "poison",
        "--static-membership",
        "--shutdown-grace",
        "5",
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), "CRASHER_AGENT_NAME": agent},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    lines: list[str] = []

    async def collect() -> None:
        assert supervisor.stdout is not None
        async for line in supervisor.stdout:
            lines.append(line.decode(errors="replace"))

    collector = asyncio.create_task(collect())
    dlq = f"pyrula.{agent}.dlq"
    try:
        await agent_topics_ready(kafka_bootstrap_servers, agent)
        before = await client.run(agent, text="fine before", timeout=120)
        assert before[-1].type == "run:complete"
        poison = await client.submit(agent, text="please CRASH now")
        after = await client.submit(agent, text="fine after")

        async def events_of(turn_id: str) -> list[str]:
            seen = []
            async for event in client.stream(agent, turn_id):
                seen.append(event.type)
            return seen

        after_events = await asyncio.wait_for(events_of(after.turn_id), 240)
        assert after_events[-1] == "run:complete", "".join(lines)
        poison_events = await asyncio.wait_for(events_of(poison.turn_id), 60)
        assert poison_events[-1] == "run:error"

        def letters() -> list[dict[str, str]]:
            return [h for _, _, h in read_topic(kafka_bootstrap_servers, dlq)]

        await wait_for(lambda: len(letters()) == 1, 30, "the quarantined record in the DLQ")
        (letter,) = letters()
        assert letter["pyrula.dlq.code"] == "poison_quarantine"
        assert "3 worker processes died" in letter["pyrula.dlq.reason"], letter
        # The first process and one per counted crash; the fourth reads it quarantined.
        assert len(STARTED.findall("".join(lines))) == 4, "".join(lines)
        again = await client.run(agent, text="fine again", timeout=120)
        assert again[-1].type == "run:complete"
    finally:
        supervisor.terminate()
        await asyncio.wait_for(supervisor.wait(), 90)
        await collector
