"""A child's reply can reach the parent's worker before that worker has heard that the
call committed: the child reads its request as soon as the broker has the commit. Such a
reply waits for the call's commit and is then taken, never dead-lettered as unsolicited
(chaos --subagents lost parents that way).

The parent's worker commits at most every few seconds (``commit_interval_s``), so its
call step stays uncommitted long enough for the test to write the child's reply first;
no child worker runs, the test answers for it.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from pyrula_stream import AgentContext, Event, KafkaAgentClient, WorkerOptions, kafka_agent
from pyrula_stream.kafka.admin import apply_topics
from pyrula_stream.kafka.io import RecordProducer
from pyrula_stream.llm import FakeLLM
from pyrula_stream.testing import read_topic, running_worker, unique_name, wait_for
from pyrula_stream.wire.serde import JournalEntry
from pyrula_stream.wire.subagents import CALL_KIND, CHILD_TURN_HEADER


async def test_a_reply_read_before_its_call_is_confirmed_waits_and_is_taken(
    kafka_bootstrap_servers: str, client: KafkaAgentClient
) -> None:
    @kafka_agent(name=unique_name("refunds"), llm=FakeLLM(["unused"]), partitions=1)
    async def refunds(ctx: AgentContext, order_id: str, cents: int) -> dict[str, Any]:
        return {"order_id": order_id, "refunded": cents}

    @kafka_agent(name=unique_name("triage"), llm=FakeLLM(["unused"]), partitions=1)
    async def triage(ctx: AgentContext, order_id: str) -> str:
        done = await ctx.call_agent(refunds, order_id=order_id, cents=500)
        return f"refunded {done['refunded']}"

    apply_topics(kafka_bootstrap_servers, refunds.topic_specs())  # deployed, no worker up
    slow_commits = WorkerOptions(shutdown_grace=0.2, commit_interval_s=6.0)
    producer = RecordProducer(kafka_bootstrap_servers)
    async with running_worker(triage, kafka_bootstrap_servers, slow_commits) as worker:
        handle = await client.submit(triage.name, order_id="7")
        events = asyncio.create_task(_events(client, triage.name, handle.turn_id))

        def call_in_flight() -> JournalEntry | None:
            runtime = worker._scheduler.runtime_of(handle.turn_id)
            steps = runtime.committing_steps() if runtime is not None else []
            return next((e for e, f in steps if e.kind == CALL_KIND and not f.done()), None)

        await wait_for(lambda: call_in_flight() is not None, 60, "the call written, uncommitted")
        call = call_in_flight()
        assert call is not None
        child = str(call.data["child_turn_id"])
        reply = {
            "parent_turn_id": handle.turn_id,
            "child_turn_id": child,
            "agent": refunds.name,
            "status": "completed",
            "result": {"order_id": "7", "refunded": 500},
            "usage": {},
        }
        await producer.send(
            triage.topics.replies,
            handle.turn_id.encode(),
            json.dumps(reply).encode(),
            [("content-type", b"application/json"), (CHILD_TURN_HEADER, child.encode())],
        )
        # Read while the call still waits for its commit: the reply waits too.
        await wait_for(lambda: bool(worker._parked._deciding), 30, "the reply read and waiting")
        assert call_in_flight() is not None
        result = await asyncio.wait_for(events, 120)
    producer.close()

    assert result[-1].type == "run:complete", result[-1]
    assert result[-1].data["result"] == "refunded 500"
    assert read_topic(kafka_bootstrap_servers, triage.topics.dlq) == []


async def _events(client: KafkaAgentClient, agent: str, turn_id: str) -> list[Event]:
    return [e async for e in client.stream(agent, turn_id)]
