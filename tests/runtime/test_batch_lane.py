"""The batch lane on the real broker: a model call that may wait is queued, its turn
parks, the worker's collector submits it in a batch, and the turn resumes with the call's
outcome journaled once and priced at the batch price. The provider here is ``FakeBatch``
(a batch API over ``FakeLLM`` in this process); the provider servers' own wire formats
are tested in tests/llm/."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import httpx

from pyrula_stream import (
    AgentContext,
    Event,
    KafkaAgentClient,
    ToolContext,
    WorkerOptions,
    kafka_agent,
    tool,
)
from pyrula_stream.agent.batch import BatchLane
from pyrula_stream.agent.definition import KafkaAgent
from pyrula_stream.agent.limits import AgentLimits
from pyrula_stream.gateway import AppOptions, create_app
from pyrula_stream.llm import FakeLLM, reply_tool_call
from pyrula_stream.llm.fake_batch import FakeBatch
from pyrula_stream.llm.pricing import ModelPrice
from pyrula_stream.runtime.replay import replay_turn
from pyrula_stream.state.history import load_recording
from pyrula_stream.testing import running_worker, unique_name, wait_for
from pyrula_stream.wire.batches import call_id

OPTIONS = WorkerOptions(shutdown_grace=0.2)
MODEL = "fake-batch-model"
PRICE = ModelPrice(input=1000.0, output=2000.0, cache_write=1000.0, cache_read=100.0)


@tool(read_only=True)
async def lookup(ctx: ToolContext, order: int) -> str:
    """Look an order up."""
    return f"order {order}: shipped"


def lane_agent(batch: FakeBatch, **lane: Any) -> KafkaAgent:
    options = {"max_age_s": 0.2, "poll_interval_s": 0.2, **lane}

    @kafka_agent(
        name=unique_name("lane"),
        llm=batch.llm,
        tools=[lookup],
        partitions=1,
        keep_history=True,
        limits=AgentLimits(prices={MODEL: PRICE}),
        batch=BatchLane(batch, **options),
    )
    async def orders(ctx: AgentContext, question: str) -> str:
        return await ctx.llm.run([{"role": "user", "content": question}])

    return orders


def model() -> FakeLLM:
    return FakeLLM([reply_tool_call("lookup", order=42), "order 42 shipped"], model=MODEL)


async def events_of(client: KafkaAgentClient, agent: str, turn_id: str) -> list[Event]:
    async def read() -> list[Event]:
        return [e async for e in client.stream(agent, turn_id)]

    return await asyncio.wait_for(read(), 60)


def live_cost(usage: dict[str, Any]) -> float:
    return (usage["input_tokens"] * PRICE.input + usage["output_tokens"] * PRICE.output) / 1e6


async def test_a_turn_on_the_lane_parks_resumes_and_pays_the_batch_price_once(
    kafka_bootstrap_servers: str, client: KafkaAgentClient
) -> None:
    batch = FakeBatch(model())
    agent = lane_agent(batch)
    async with running_worker(agent, kafka_bootstrap_servers, OPTIONS) as worker:
        handle = await client.submit(agent.name, question="Where is order 42?")
        events = await events_of(client, agent.name, handle.turn_id)
        assert worker.batches is not None and worker.batches.open_batches == 0
        metrics = worker.metrics.exposition().decode()
    assert events[-1].type == "run:complete", [(e.type, e.data) for e in events]
    assert events[-1].data["result"] == "order 42 shipped"
    # The lane's series: two one-call batches, two calls resumed, dollars saved.
    assert f'pyrula_batch_size_calls_count{{agent="{agent.name}"}} 2.0' in metrics
    assert f'pyrula_batch_calls_total{{agent="{agent.name}",event="resumed"}} 2.0' in metrics
    saved = [ln for ln in metrics.splitlines() if ln.startswith("pyrula_batch_savings_usd_total")]
    assert saved and float(saved[0].split()[-1]) > 0, saved
    # Each of the two model calls waited for its batch (the stream says so), went by
    # batch once, and its llm:complete says so.
    waiting = [e for e in events if e.type == "status" and e.data.get("waiting") == "batch"]
    completes = [e for e in events if e.type == "llm:complete"]
    assert len(waiting) == 2
    assert [e.data["call"] for e in completes] == [0, 1]
    assert all(e.data["batch"]["batch_id"] for e in completes)
    calls = [call_id(c) for c in batch.submitted]
    assert sorted(Counter(calls).values()) == [1, 1]
    assert {e.data["batch"]["custom_id"] for e in completes} == set(calls)
    # Priced at half the live price, in the turn's total and its result.
    expected = sum(live_cost(e.data["usage"]) for e in completes) * 0.5
    assert expected > 0
    total = events[-1].data["usage"]["cost_usd"]
    assert abs(total - expected) < 1e-6, (total, expected)


async def test_a_takeover_between_the_batch_tag_and_its_id_finds_the_batch(
    kafka_bootstrap_servers: str, client: KafkaAgentClient
) -> None:
    # The provider creates the batch but the answer never reaches the collector (as if
    # the worker died after the submit, before journaling the batch's id): the next try
    # looks the tag up instead of submitting the calls again. A submit slower than the
    # poll interval is not looked up (and submitted again) while it is on its way.
    batch = FakeBatch(model(), fail_after_submit=1, submit_delay_s=0.6)
    agent = lane_agent(batch)
    async with running_worker(agent, kafka_bootstrap_servers, OPTIONS):
        handle = await client.submit(agent.name, question="Where is order 42?")
        events = await events_of(client, agent.name, handle.turn_id)
    assert events[-1].type == "run:complete", [(e.type, e.data) for e in events]
    assert len(batch.submitted) == 2
    assert sorted(Counter(map(call_id, batch.submitted)).values()) == [1, 1], batch.submitted


async def test_a_turn_waiting_in_a_batch_is_cancelled_and_its_batch_with_it(
    kafka_bootstrap_servers: str, client: KafkaAgentClient
) -> None:
    batch = FakeBatch(model(), delay_s=3600)
    agent = lane_agent(batch)
    async with running_worker(agent, kafka_bootstrap_servers, OPTIONS) as worker:
        handle = await client.submit(agent.name, question="Where is order 42?")
        await wait_for(lambda: len(batch.submitted) == 1, 60, "the call was submitted")
        assert worker.parked_turns == 1
        await client.cancel(agent.name, handle.turn_id, reason="not needed")
        events = await events_of(client, agent.name, handle.turn_id)
        await wait_for(lambda: len(batch.cancelled) == 1, 60, "the batch was cancelled")
    assert events[-1].type == "run:error"
    assert events[-1].data["code"] == "cancelled"
    assert not [e for e in events if e.type == "llm:complete"]


async def test_a_lane_turn_replays_and_branches_from_its_journaled_batch_calls(
    kafka_bootstrap_servers: str, client: KafkaAgentClient
) -> None:
    batch = FakeBatch(model())
    agent = lane_agent(batch)
    async with running_worker(agent, kafka_bootstrap_servers, OPTIONS):
        original = await client.submit(agent.name, question="Where is order 42?")
        done = await events_of(client, agent.name, original.turn_id)
        assert done[-1].type == "run:complete"
        recording = await asyncio.to_thread(
            load_recording, kafka_bootstrap_servers, agent.topics.history, original.turn_id
        )
        report = await replay_turn(agent, recording)
        assert report.clean, str(report)
        # From step 2 (after the first model call and the lookup), a new question: the
        # recorded batch call replays at its batch price, the next call goes by batch.
        branched = await client.branch(
            agent.name, original.turn_id, from_step=2, question="Where is order 43?"
        )
        events = await events_of(client, agent.name, branched.turn_id)
    assert events[-1].type == "run:complete", [(e.type, e.data) for e in events]
    assert len(batch.submitted) == 3  # the original's two calls and the branch's new one


async def test_the_gateway_keeps_a_streamed_turn_live_unless_its_body_defers_it(
    kafka_bootstrap_servers: str, client: KafkaAgentClient
) -> None:
    batch = FakeBatch(model())
    agent = lane_agent(batch)
    app = create_app(agents=[agent], options=AppOptions(bootstrap_servers=kafka_bootstrap_servers))
    transport = httpx.ASGITransport(app=app)
    async with (
        running_worker(agent, kafka_bootstrap_servers, OPTIONS),
        httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as http,
    ):
        url = f"/agents/{agent.name}/turns"
        live = await http.post(url, json={"question": "Where is order 42?"})
        deferred = await http.post(url, json={"question": "Where is 42?", "deferrable": True})
        bad = await http.post(url, json={"question": "?", "deadline": "next tuesday"})
        assert live.status_code == deferred.status_code == 202, (live.text, deferred.text)
        live_events = await events_of(client, agent.name, live.json()["turn_id"])
        deferred_events = await events_of(client, agent.name, deferred.json()["turn_id"])
    assert bad.status_code == 422 and "next tuesday" in bad.text, bad.text
    for events in (live_events, deferred_events):
        assert events[-1].type == "run:complete", [(e.type, e.data) for e in events]
    assert not [e for e in live_events if e.type == "llm:complete" and e.data.get("batch")]
    assert all(e.data.get("batch") for e in deferred_events if e.type == "llm:complete")
    assert len(batch.submitted) == 2  # the deferred turn's two calls only


async def test_an_expired_batch_sends_its_calls_live_and_counts_them(
    kafka_bootstrap_servers: str, client: KafkaAgentClient
) -> None:
    batch = FakeBatch(model(), expire=True)
    agent = lane_agent(batch)  # on_failure="live", the default
    async with running_worker(agent, kafka_bootstrap_servers, OPTIONS) as worker:
        handle = await client.submit(agent.name, question="Where is order 42?")
        events = await events_of(client, agent.name, handle.turn_id)
        metrics = worker.metrics.exposition().decode()
    assert events[-1].type == "run:complete", [(e.type, e.data) for e in events]
    completes = [e for e in events if e.type == "llm:complete"]
    assert len(completes) == 2 and not any(e.data.get("batch") for e in completes)
    assert len(batch.submitted) == 2  # each call tried once by batch, then live
    assert f'pyrula_batch_calls_total{{agent="{agent.name}",event="failed"}} 2.0' in metrics
    assert any("sent live" in str(e.data.get("text")) for e in events if e.type == "status")


async def test_on_failure_fail_fails_the_turn_when_its_batch_expires(
    kafka_bootstrap_servers: str, client: KafkaAgentClient
) -> None:
    batch = FakeBatch(model(), expire=True)
    agent = lane_agent(batch, on_failure="fail")
    async with running_worker(agent, kafka_bootstrap_servers, OPTIONS):
        handle = await client.submit(agent.name, question="Where is order 42?")
        events = await events_of(client, agent.name, handle.turn_id)
    assert events[-1].type == "run:error", [(e.type, e.data) for e in events]
    assert "batch call" in events[-1].data["message"] and "expired" in events[-1].data["message"]
    assert len(batch.submitted) == 1 and not [e for e in events if e.type == "llm:complete"]
