"""A child's reply is never lost to a failure after it was read: the worker that cannot
apply a reply it has taken restores the partition from its journal (where the reply is
durable) instead of logging the failure and moving on (issue 46)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from pyrula_stream import AgentContext, Event, KafkaAgentClient, WorkerOptions, kafka_agent
from pyrula_stream.llm import FakeLLM
from pyrula_stream.testing import running_worker, unique_name, wait_for

QUICK = WorkerOptions(shutdown_grace=0.2)


async def test_a_reply_the_parent_worker_fails_to_apply_still_wakes_the_parent(
    kafka_bootstrap_servers: str, client: KafkaAgentClient, tmp_path: Path
) -> None:
    release = asyncio.Event()

    @kafka_agent(name=unique_name("refunds"), llm=FakeLLM(["ok"]), partitions=1)
    async def refunds(ctx: AgentContext, order_id: str) -> dict[str, Any]:
        await release.wait()  # answers only once the parent's disk has failed
        return {"order_id": order_id, "refunded": 500}

    @kafka_agent(name=unique_name("triage"), llm=FakeLLM(["ok"]), partitions=1)
    async def triage(ctx: AgentContext, order_id: str) -> str:
        done = await ctx.call_agent(refunds, order_id=order_id)
        return f"refunded {done['refunded']}"

    parent_options = WorkerOptions(shutdown_grace=0.2, state_dir=tmp_path)
    async with (
        running_worker(refunds, kafka_bootstrap_servers, QUICK),
        running_worker(triage, kafka_bootstrap_servers, parent_options) as parent,
    ):
        handle = await client.submit(triage.name, order_id="7")
        await wait_for(lambda: parent.parked_turns == 1, 60, "the parent parked")
        # The parked turns' local table (a SQLite file the partition's journal rebuilds)
        # is damaged under the worker, as a failing disk would: applying the reply to
        # the parked parent now raises, after the reply was read and journaled.
        damage_parked_table(tmp_path)
        release.set()
        events = await asyncio.wait_for(_events(client, triage.name, handle.turn_id), 90)

    assert events[-1].type == "run:complete", [e.data for e in events]
    assert events[-1].data["result"] == "refunded 500"


async def _events(client: KafkaAgentClient, agent: str, turn_id: str) -> list[Event]:
    return [e async for e in client.stream(agent, turn_id)]


def damage_parked_table(state_dir: Path) -> None:
    damaged = list(state_dir.glob("*parked*"))
    assert damaged, sorted(p.name for p in state_dir.iterdir())
    for path in damaged:
        path.write_bytes(b"\xff" * max(path.stat().st_size, 4096))
