"""Signals: ``ctx.wait_for_signal`` parks the turn until a signal record of that name is
journaled for it; a signal sent before the wait waits in the journal; a timeout is a
durable timer; a signal for an unknown or ended turn is refused back to its sender."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest

from pyrula_stream import (
    AgentContext,
    KafkaAgentClient,
    SignalRefused,
    WaitTimeout,
    WorkerOptions,
    kafka_agent,
)
from pyrula_stream.llm import FakeLLM
from pyrula_stream.testing import read_topic, running_worker, unique_name, wait_for
from tests.approvals_kit import all_events

OPTIONS = WorkerOptions(shutdown_grace=0.2, max_concurrent_turns=4)


async def test_signals_before_during_and_after_the_wait_are_each_taken_once(
    kafka_bootstrap_servers: str, client: KafkaAgentClient
) -> None:
    @kafka_agent(name=unique_name("signals"), llm=FakeLLM(["ok"]), partitions=1)
    async def agent(ctx: AgentContext) -> dict[str, object]:
        first = await ctx.wait_for_signal("go")  # arrives while the turn is parked here
        await ctx.wait_for_signal("ready")  # held until "early" is in (see below)
        early = await ctx.wait_for_signal("early")  # sent before this wait: pending
        return {
            "first": first.payload,
            "sender": first.sender,
            "early": early.payload,
            "sent_ms": early.sent_ms,
        }

    async with running_worker(agent, kafka_bootstrap_servers, OPTIONS) as worker:
        handle = await client.submit(agent.name)
        await wait_for(lambda: worker.parked_turns == 1, 60, "the turn parked on 'go'")
        receipt = await client.signal(agent.name, handle.turn_id, "go", {"n": 1}, sender="ana")
        assert receipt.accepted and receipt.signal.name == "go"
        early = await client.signal(agent.name, handle.turn_id, "early", {"n": 2})
        assert early.accepted  # kept in the journal: no wait for it yet
        await client.signal(agent.name, handle.turn_id, "ready")
        events = await all_events(client, agent.name, handle.turn_id)
        assert events[-1].type == "run:complete", [(e.type, e.data) for e in events]
        result = events[-1].data["result"]
        assert result["first"] == {"n": 1} and result["sender"] == "ana"
        assert result["early"] == {"n": 2} and result["sent_ms"] == early.signal.sent_ms
        assert [e.type for e in events].count("run:start") == 1
        assert [e.seq for e in events] == list(range(len(events)))
        # After the end: refused, and told so.
        with pytest.raises(SignalRefused) as refused:
            await client.signal(agent.name, handle.turn_id, "go")
        assert refused.value.reason == "ended"
        with pytest.raises(SignalRefused) as unknown:
            await client.signal(agent.name, "no-such-turn", "go")
        assert unknown.value.reason == "unknown"
    letters = read_topic(kafka_bootstrap_servers, agent.topics.dlq)
    codes = [headers.get("pyrula.dlq.code") for _, _, headers in letters]
    assert codes == ["signal_refused", "signal_refused"]
    # The journal holds no signal of the ended turn: its end tombstoned them.
    journal = read_topic(kafka_bootstrap_servers, agent.topics.journal)
    latest = {key: value for key, value, _ in journal}
    assert [k for k in latest if k and b"/signal:" in k], "signals were journaled"
    assert not [k for k, v in latest.items() if k and b"/signal:" in k and v is not None]


async def test_two_signals_of_one_name_feed_two_waits_in_order(
    kafka_bootstrap_servers: str, client: KafkaAgentClient
) -> None:
    @kafka_agent(name=unique_name("signals"), llm=FakeLLM(["ok"]), partitions=1)
    async def agent(ctx: AgentContext) -> list[object]:
        await ctx.step("wait a moment", asyncio.sleep, 0)
        return [(await ctx.wait_for_signal("item")).payload for _ in range(2)]

    async with running_worker(agent, kafka_bootstrap_servers, OPTIONS) as worker:
        handle = await client.submit(agent.name)
        await wait_for(lambda: worker.parked_turns == 1, 60, "the turn parked")
        for n in (1, 2):
            assert (await client.signal(agent.name, handle.turn_id, "item", n)).accepted
        events = await all_events(client, agent.name, handle.turn_id)
    assert events[-1].data["result"] == [1, 2]


async def test_a_timeout_raises_wait_timeout_and_uncaught_ends_the_turn(
    kafka_bootstrap_servers: str, client: KafkaAgentClient
) -> None:
    @kafka_agent(name=unique_name("signals"), llm=FakeLLM(["ok"]), partitions=1)
    async def agent(ctx: AgentContext, catch: bool) -> str:
        try:
            await ctx.wait_for_signal("never", timeout=timedelta(seconds=1))
        except WaitTimeout as exc:
            if not catch:
                raise
            assert exc.wait_kind == "signal" and exc.name == "never"
            assert exc.deadline is not None and exc.deadline <= datetime.now(UTC)
            return "caught"
        return "signalled"

    async with running_worker(agent, kafka_bootstrap_servers, OPTIONS):
        caught, uncaught = await asyncio.gather(  # independent turns: wait out both at once
            client.run(agent.name, catch=True, timeout=60),
            client.run(agent.name, catch=False, timeout=60),
        )
    assert caught[-1].type == "run:complete" and caught[-1].data["result"] == "caught"
    assert uncaught[-1].type == "run:error"
    assert uncaught[-1].data["code"] == "wait_timeout"
