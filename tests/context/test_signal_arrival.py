"""When a signal or an answer arrives, relative to its turn: before any worker has read the
turn's request, while the request waits for a slot, and after the question it answers
has expired. The first two are kept for the turn; the last is refused to its sender."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from pyrula_stream import (
    AgentContext,
    Event,
    KafkaAgentClient,
    SignalRefused,
    ToolCallRejected,
    ToolContext,
    WorkerOptions,
    kafka_agent,
    tool,
)
from pyrula_stream.llm import FakeLLM
from pyrula_stream.testing import read_topic, running_worker, unique_name, wait_for
from tests.approvals_kit import all_events

OPTIONS = WorkerOptions(shutdown_grace=0.2, max_concurrent_turns=1)


def _waiting_agent(gate: asyncio.Event | None = None) -> Any:
    @kafka_agent(name=unique_name("arrival"), llm=FakeLLM(["ok"]), partitions=1)
    async def agent(ctx: AgentContext, hold: bool = False) -> object:
        if hold and gate is not None:
            await ctx.step("hold the only slot", gate.wait)
            return "held"
        return (await ctx.wait_for_signal("go")).payload

    return agent


async def test_a_signal_sent_before_its_worker_read_the_turn_waits_for_the_read(
    kafka_bootstrap_servers: str, client: KafkaAgentClient
) -> None:
    gate = asyncio.Event()
    agent = _waiting_agent(gate)
    full = WorkerOptions(shutdown_grace=0.2, max_concurrent_turns=1, max_queued_turns=1)
    async with running_worker(agent, kafka_bootstrap_servers, full) as worker:
        blocker = await client.submit(agent.name, hold=True)
        await wait_for(lambda: worker.running_turns == 1, 60, "the first turn took the slot")
        await client.submit(agent.name, hold=True)
        await wait_for(lambda: worker.queued_turns == 1, 60, "the second turn queued")
        # The worker has read as far ahead as it may: it stops fetching turns, so it has
        # not read this request when the signal for it comes.
        unread = await client.submit(agent.name)
        sent = asyncio.create_task(client.signal(agent.name, unread.turn_id, "go", {"n": 1}))
        await wait_for(lambda: worker.held_signals == 1, 60, "the signal waits for the read")
        gate.set()  # the slot frees, the worker reads on and finds the turn
        assert (await sent).accepted
        events = await all_events(client, agent.name, unread.turn_id)
        await all_events(client, agent.name, blocker.turn_id)
    assert events[-1].type == "run:complete", [(e.type, e.data) for e in events]
    assert events[-1].data["result"] == {"n": 1}
    assert read_topic(kafka_bootstrap_servers, agent.topics.dlq) == []


async def test_a_signal_for_a_turn_waiting_for_a_slot_is_kept_for_it(
    kafka_bootstrap_servers: str, client: KafkaAgentClient
) -> None:
    gate = asyncio.Event()
    agent = _waiting_agent(gate)
    async with running_worker(agent, kafka_bootstrap_servers, OPTIONS) as worker:
        blocker = await client.submit(agent.name, hold=True)
        await wait_for(lambda: worker.running_turns == 1, 60, "the first turn took the slot")
        queued = await client.submit(agent.name)
        receipt = await client.signal(agent.name, queued.turn_id, "go", "early")
        assert receipt.accepted, "the turn is read and waits for a slot: the signal is kept"
        assert worker.running_turns == 1 and worker.parked_turns == 0
        gate.set()
        held = await all_events(client, agent.name, blocker.turn_id)
        events = await all_events(client, agent.name, queued.turn_id)
    assert held[-1].data["result"] == "held"
    assert events[-1].type == "run:complete" and events[-1].data["result"] == "early"
    assert [e.type for e in events].count("run:start") == 1


async def test_an_answer_after_its_question_expired_is_refused_as_expired(
    kafka_bootstrap_servers: str, client: KafkaAgentClient
) -> None:
    ran: list[int] = []

    @tool(requires_approval=True, approval_timeout=1.0)
    async def refund(ctx: ToolContext, cents: int) -> str:
        """Refund money."""
        ran.append(cents)
        return "refunded"

    @kafka_agent(
        name=unique_name("arrival"),
        llm=FakeLLM(["x"]),
        tools=[refund],
        partitions=1,
        human_in_the_loop=True,
    )
    async def agent(ctx: AgentContext) -> dict[str, Any]:
        try:
            await refund(ctx, cents=100)
        except ToolCallRejected as exc:
            expired = exc.expired
        finish = await ctx.wait_for_signal("finish")  # the turn lives on, parked
        return {"expired": expired, "finish": finish.payload}

    async with running_worker(agent, kafka_bootstrap_servers, OPTIONS) as worker:
        handle = await client.submit(agent.name)
        seen: list[Event] = []

        async def until_denied() -> None:
            async for event in client.stream(agent.name, handle.turn_id):
                seen.append(event)
                if event.type == "tool:result":
                    return

        await asyncio.wait_for(until_denied(), 60)
        (key,) = [e.data["key"] for e in seen if e.type == "run:interrupted"]
        assert seen[-1].data["approval"] == "expired"
        await wait_for(lambda: worker.parked_turns == 1, 60, "the turn parked on 'finish'")
        with pytest.raises(SignalRefused) as late:
            await client.approve(agent.name, handle.turn_id, key)
        assert late.value.reason == "expired"
        await client.signal(agent.name, handle.turn_id, "finish", "now")
        events = await all_events(client, agent.name, handle.turn_id)
    assert ran == [], "an answer after the expiry approves nothing"
    assert events[-1].data["result"] == {"expired": True, "finish": "now"}
