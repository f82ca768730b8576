"""Durable timers: ``ctx.sleep_until`` past ``durable_timer_after_s`` parks the turn (no
task, no slot) and whichever worker owns its partition at the wake time resumes it."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime

from pyrula_stream import AgentContext, Event, KafkaAgentClient, WorkerOptions, kafka_agent
from pyrula_stream.llm import FakeLLM
from pyrula_stream.testing import running_worker, unique_name, wait_for

TIMERS = WorkerOptions(shutdown_grace=0.2, durable_timer_after_s=0.5, max_concurrent_turns=1)


async def test_sleep_until_parks_the_turn_and_another_worker_wakes_it_at_its_time(
    kafka_bootstrap_servers: str, client: KafkaAgentClient
) -> None:
    @kafka_agent(name=unique_name("alarm"), llm=FakeLLM(["ok"]), partitions=1)
    async def alarm(ctx: AgentContext, wake_at_ms: int) -> str:
        await ctx.sleep_until(datetime.fromtimestamp(wake_at_ms / 1000, UTC))
        return f"rang at {wake_at_ms}"

    wake_at_ms = int((time.time() + 8) * 1000)
    async with running_worker(alarm, kafka_bootstrap_servers, TIMERS) as first:
        handles = [await client.submit(alarm.name, wake_at_ms=wake_at_ms + i) for i in range(3)]
        # Three sleeping turns on a worker with one slot: parked, they hold none.
        await wait_for(lambda: first.parked_turns == 3, 60, "every turn parked on its timer")
        assert first.running_turns == 0
    # The first worker left before the wake time; a new one re-arms the timers from the
    # journal and fires each at its time, not before.
    async with running_worker(alarm, kafka_bootstrap_servers, TIMERS):
        runs = [await _events(client, alarm.name, h.turn_id) for h in handles]
    for i, events in enumerate(runs):
        assert events[-1].type == "run:complete", [(e.type, e.data) for e in events]
        assert events[-1].data["result"] == f"rang at {wake_at_ms + i}"
        assert events[-1].ts_ms >= wake_at_ms + i, "woke before its time"
        assert events[-1].attempt >= 2  # parked, then resumed by replay
        assert [e.type for e in events].count("run:start") == 1
        assert [e.seq for e in events] == list(range(len(events)))


async def test_a_turn_that_parks_later_but_wakes_earlier_is_not_held_by_the_first_timer(
    kafka_bootstrap_servers: str, client: KafkaAgentClient
) -> None:
    @kafka_agent(name=unique_name("alarm"), llm=FakeLLM(["ok"]), partitions=1)
    async def alarm(ctx: AgentContext, wake_at_ms: int) -> str:
        await ctx.sleep_until(datetime.fromtimestamp(wake_at_ms / 1000, UTC))
        return f"rang at {wake_at_ms}"

    options = WorkerOptions(shutdown_grace=0.2, durable_timer_after_s=0.5, max_concurrent_turns=4)
    late = int((time.time() + 10) * 1000)
    async with running_worker(alarm, kafka_bootstrap_servers, options) as worker:
        first = await client.submit(alarm.name, wake_at_ms=late)
        await wait_for(lambda: worker.parked_turns == 1, 60, "the late turn parked")
        early = int((time.time() + 3) * 1000)
        second = await client.submit(alarm.name, wake_at_ms=early)
        woke_early = await _events(client, alarm.name, second.turn_id)
        woke_late = await _events(client, alarm.name, first.turn_id)
    # The partition's one timer was set for the late turn; the early one moved it up.
    assert woke_early[-1].type == "run:complete"
    assert early <= woke_early[-1].ts_ms < late, (early, woke_early[-1].ts_ms, late)
    assert woke_late[-1].type == "run:complete"
    assert woke_late[-1].ts_ms >= late


async def _events(client: KafkaAgentClient, agent: str, turn_id: str) -> list[Event]:
    async def read() -> list[Event]:
        return [e async for e in client.stream(agent, turn_id)]

    return await asyncio.wait_for(read(), 60)
