"""Failure handling on the real broker: poison quarantine and producer fencing."""

from __future__ import annotations

import asyncio

from pyrula_stream import (
    AgentContext,
    KafkaAgentClient,
    Poison,
    PoisonOptions,
    ToolContext,
    WorkerOptions,
    kafka_agent,
    tool,
)
from pyrula_stream.kafka.transactions import BatchWriter
from pyrula_stream.llm import FakeLLM, reply_tool_call
from pyrula_stream.testing import read_topic, running_worker, unique_name, wait_for


async def test_a_turn_that_keeps_stalling_is_quarantined(
    kafka_bootstrap_servers: str, client: KafkaAgentClient
) -> None:
    attempts: list[str] = []

    @tool
    async def hang(ctx: ToolContext) -> str:
        """Never finishes, like a call that crashes its worker every time."""
        attempts.append(ctx.idempotency_key or "")
        await asyncio.sleep(3600)
        return "never"

    @kafka_agent(
        name=unique_name("poison"),
        llm=FakeLLM([reply_tool_call("hang")]),
        tools=[hang],
        partitions=1,
    )
    async def agent(ctx: AgentContext) -> str:
        return await ctx.llm.run([{"role": "user", "content": "go"}])

    options = WorkerOptions(shutdown_grace=0.2, poison=PoisonOptions(max_retries=2))
    handle = None
    for attempt in (1, 2, 3):
        async with running_worker(agent, kafka_bootstrap_servers, options):
            if handle is None:
                handle = await client.submit(agent.name)
            await wait_for(lambda n=attempt: len(attempts) == n, 30, f"attempt {attempt}")
    assert handle is not None
    async with running_worker(agent, kafka_bootstrap_servers, options):
        events = [e async for e in client.stream(agent.name, handle.turn_id)]
    # Attempt 1 journaled the model call (progress); attempts 2 and 3 added nothing, so the
    # fourth is quarantined without running the tool again.
    assert len(attempts) == 3
    assert events[-1].type == "run:error"
    assert events[-1].data["code"] == "poison_quarantine"
    assert "2 attempts made no progress" in events[-1].data["message"]
    dead = read_topic(kafka_bootstrap_servers, agent.topics.dlq)
    assert [h["pyrula.dlq.code"] for _, _, h in dead] == ["poison_quarantine"]


async def test_a_tool_raising_poison_quarantines_the_turn(
    kafka_bootstrap_servers: str, client: KafkaAgentClient
) -> None:
    @tool(retry=3)
    async def bad_input(ctx: ToolContext) -> str:
        """Input this system can never process."""
        raise Poison("record refers to a deleted tenant")

    @kafka_agent(
        name=unique_name("poisontool"),
        llm=FakeLLM([reply_tool_call("bad_input")]),
        tools=[bad_input],
        partitions=1,
    )
    async def agent(ctx: AgentContext) -> str:
        return await ctx.llm.run([{"role": "user", "content": "go"}])

    async with running_worker(agent, kafka_bootstrap_servers):
        events = await client.run(agent.name, timeout=60)
    result = next(e for e in events if e.type == "tool:result")
    assert result.data["attempts"] == 1  # Poison is never retried
    assert events[-1].data["code"] == "poison_quarantine"
    assert "deleted tenant" in events[-1].data["message"]


async def test_a_fenced_worker_rejoins_and_finishes_its_turns(
    kafka_bootstrap_servers: str, client: KafkaAgentClient
) -> None:
    gate = asyncio.Event()
    runs: list[str] = []

    @tool
    async def wait_gate(ctx: ToolContext) -> str:
        """Blocks until the test fences the worker."""
        runs.append(ctx.idempotency_key or "")
        await gate.wait()
        return "through"

    @kafka_agent(
        name=unique_name("fence"),
        llm=FakeLLM([reply_tool_call("wait_gate"), "ok"]),
        tools=[wait_gate],
        partitions=1,
    )
    async def agent(ctx: AgentContext) -> str:
        return await ctx.llm.run([{"role": "user", "content": "go"}])

    options = WorkerOptions(worker_id="fenced-1")
    async with running_worker(agent, kafka_bootstrap_servers, options) as worker:
        handle = await client.submit(agent.name)
        await wait_for(lambda: len(runs) == 1, 30, "tool started")
        # Another producer with the same transactional id takes over: ours is now a zombie.
        usurper = BatchWriter(
            kafka_bootstrap_servers, transactional_id=f"pyrula.{agent.name}.fenced-1"
        )
        await asyncio.to_thread(usurper.start)
        usurper.close()
        gate.set()
        events = await asyncio.wait_for(
            asyncio.gather(*[_collect(client, agent.name, handle.turn_id)]), 90
        )
        assert worker.sessions >= 2, "the worker recreated its clients after being fenced"
        metric = worker.metrics.registry.get_sample_value
        assert (metric("pyrula_fenced_total", {"agent": agent.name}) or 0) >= 1
        completed = {"agent": agent.name, "outcome": "completed"}
        await wait_for(lambda: metric("pyrula_turns_total", completed) == 1, 30, "turn counted")
    turn_events = events[0]
    assert [e.type for e in turn_events].count("run:complete") == 1
    assert [e.seq for e in turn_events] == list(range(len(turn_events)))


async def _collect(client: KafkaAgentClient, agent: str, turn_id: str) -> list[object]:
    return [e async for e in client.stream(agent, turn_id)]


async def test_a_rebalance_under_load_loses_and_doubles_nothing(
    kafka_bootstrap_servers: str, client: KafkaAgentClient
) -> None:
    @tool
    async def work(ctx: ToolContext, n: int) -> int:
        """Takes a moment, so turns are mid-flight when partitions move."""
        await asyncio.sleep(0.2)
        return n * 2

    @kafka_agent(
        name=unique_name("rebalance"),
        tools=[work],
        partitions=4,
        llm=FakeLLM([reply_tool_call("work", n=1), "done"], latency_s=0.05),
    )
    async def agent(ctx: AgentContext, i: int) -> str:
        return await ctx.llm.run([{"role": "user", "content": str(i)}])

    async with running_worker(
        agent, kafka_bootstrap_servers, WorkerOptions(worker_id="rb-1", max_concurrent_turns=4)
    ) as first:
        handles = [await client.submit(agent.name, i=i) for i in range(100)]
        await wait_for(lambda: first.turns_finished >= 5, 60, "first turns done")
        # A second worker joins while commits are in flight: partitions move mid-turn.
        async with running_worker(
            agent, kafka_bootstrap_servers, WorkerOptions(worker_id="rb-2", max_concurrent_turns=4)
        ) as second:
            results = await asyncio.wait_for(
                asyncio.gather(*(_collect(client, agent.name, h.turn_id) for h in handles)), 120
            )
            assert second.turns_finished > 0, "the joining worker took over some turns"
    for events in results:
        types = [e.type for e in events]  # type: ignore[attr-defined]
        assert types.count("run:complete") == 1
        assert [e.seq for e in events] == list(range(len(events)))  # type: ignore[attr-defined]
