"""A child's reply is never lost to a failure after it was read: the worker that cannot
decide or apply a reply restores the partition from its journal and reads the reply
again, instead of logging the failure and moving on; a reply that keeps failing is
quarantined to the DLQ, never skipped (issue 46)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from pyrula_stream import (
    AgentContext,
    Event,
    KafkaAgent,
    KafkaAgentClient,
    WorkerOptions,
    kafka_agent,
)
from pyrula_stream.llm import FakeLLM
from pyrula_stream.runtime.options import PoisonOptions
from pyrula_stream.testing import read_topic, running_worker, unique_name, wait_for

QUICK = WorkerOptions(shutdown_grace=0.2)


def agents(release: asyncio.Event) -> tuple[KafkaAgent, KafkaAgent]:
    @kafka_agent(name=unique_name("refunds"), llm=FakeLLM(["ok"]), partitions=1)
    async def refunds(ctx: AgentContext, order_id: str) -> dict[str, Any]:
        await release.wait()  # answers only once the parent's disk has failed
        return {"order_id": order_id, "refunded": 500}

    @kafka_agent(name=unique_name("triage"), llm=FakeLLM(["ok"]), partitions=1)
    async def triage(ctx: AgentContext, order_id: str) -> str:
        done = await ctx.call_agent(refunds, order_id=order_id)
        return f"refunded {done['refunded']}"

    return refunds, triage


async def test_a_reply_the_parent_worker_fails_to_apply_still_wakes_the_parent(
    kafka_bootstrap_servers: str, client: KafkaAgentClient, tmp_path: Path
) -> None:
    release = asyncio.Event()
    refunds, triage = agents(release)
    parent_options = WorkerOptions(shutdown_grace=0.2, state_dir=tmp_path)
    async with (
        running_worker(refunds, kafka_bootstrap_servers, QUICK),
        running_worker(triage, kafka_bootstrap_servers, parent_options) as parent,
    ):
        handle = await client.submit(triage.name, order_id="7")
        await wait_for(lambda: parent.parked_turns == 1, 60, "the parent parked")
        # The parked turns' local table (a SQLite file the partition's journal rebuilds)
        # is damaged under the worker, as a failing disk would: deciding the reply for
        # the parked parent now raises, after the reply was read and parsed.
        damage_parked_table(tmp_path)
        release.set()
        events = await asyncio.wait_for(_events(client, triage.name, handle.turn_id), 90)
        restarts = parent.metrics.exposition().decode()

    assert events[-1].type == "run:complete", [e.data for e in events]
    assert events[-1].data["result"] == "refunded 500"
    assert metric(restarts, "pyrula_session_restarts_total", triage.name, 'repeated="false"') == 1
    assert metric(restarts, "pyrula_quarantined_records_total", triage.name, "") == 0


async def test_a_reply_that_keeps_failing_is_quarantined_not_skipped(
    kafka_bootstrap_servers: str, client: KafkaAgentClient, tmp_path: Path
) -> None:
    """With ``max_retries=1`` one failed session is enough: the reply read again after
    the restore goes to the DLQ as ``poison_quarantine`` (redrivable), with a metric."""
    release = asyncio.Event()
    refunds, triage = agents(release)
    parent_options = WorkerOptions(
        shutdown_grace=0.2, state_dir=tmp_path, poison=PoisonOptions(max_retries=1)
    )
    async with (
        running_worker(refunds, kafka_bootstrap_servers, QUICK),
        running_worker(triage, kafka_bootstrap_servers, parent_options) as parent,
    ):
        handle = await client.submit(triage.name, order_id="7")
        await wait_for(lambda: parent.parked_turns == 1, 60, "the parent parked")
        damage_parked_table(tmp_path)
        release.set()

        def letters() -> list[tuple[bytes | None, dict[str, str]]]:
            return [(k, h) for k, _, h in read_topic(kafka_bootstrap_servers, triage.topics.dlq)]

        await wait_for(lambda: len(letters()) == 1, 60, "the reply in the DLQ")
        exposition = parent.metrics.exposition().decode()
        # The worker keeps running: a new turn of the partition ends.
        later = await client.submit(triage.name, order_id="8")
        later_events = await asyncio.wait_for(_events(client, triage.name, later.turn_id), 90)
        still_parked = parent.parked_turns  # the first parent: its answer is in the DLQ

    ((key, letter),) = letters()
    assert key == handle.turn_id.encode()  # the parent's answer, not some other record
    assert letter["pyrula.dlq.code"] == "poison_quarantine", letter
    assert letter["pyrula.dlq.source"] == f"{triage.topics.replies}[0]@0", letter
    assert "ended 1 sessions" in letter["pyrula.dlq.reason"], letter
    assert metric(exposition, "pyrula_quarantined_records_total", triage.name, "replies") == 1
    assert later_events[-1].type == "run:complete"
    assert still_parked == 1, "the quarantined answer was neither taken nor lost"


def metric(exposition: str, name: str, agent: str, label: str) -> float:
    """The sum of the series of ``name`` for ``agent`` whose labels mention ``label``."""
    total = 0.0
    for line in exposition.splitlines():
        if line.startswith(name + "{") and f'agent="{agent}"' in line and label in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


async def _events(client: KafkaAgentClient, agent: str, turn_id: str) -> list[Event]:
    return [e async for e in client.stream(agent, turn_id)]


def damage_parked_table(state_dir: Path) -> None:
    damaged = list(state_dir.glob("*parked*"))
    assert damaged, sorted(p.name for p in state_dir.iterdir())
    for path in damaged:
        path.write_bytes(b"\xff" * max(path.stat().st_size, 4096))
