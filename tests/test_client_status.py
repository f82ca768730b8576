"""The client: a turn's status, resuming a stream, many streams on one shared reader."""

from __future__ import annotations

import asyncio

from pyrula_stream import AgentContext, KafkaAgentClient, ToolContext, kafka_agent, tool
from pyrula_stream.kafka.admin import apply_topics
from pyrula_stream.llm import FakeLLM, reply_tool_call
from pyrula_stream.testing import running_worker, unique_name


async def test_status_follows_a_turn_from_queued_to_completed(
    kafka_bootstrap_servers: str, client: KafkaAgentClient
) -> None:
    started, release = asyncio.Event(), asyncio.Event()

    @tool
    async def wait_here(ctx: ToolContext) -> str:
        """Waits for the test."""
        started.set()
        await release.wait()
        return "done"

    @kafka_agent(
        name=unique_name("status"),
        llm=FakeLLM([reply_tool_call("wait_here"), "finished"]),
        tools=[wait_here],
        partitions=1,
    )
    async def agent(ctx: AgentContext) -> str:
        return await ctx.llm.run([{"role": "user", "content": "go"}])

    apply_topics(kafka_bootstrap_servers, agent.topic_specs())
    handle = await client.submit(agent.name)
    assert (await client.status(agent.name, handle.turn_id)).state == "queued"
    assert (await client.status(agent.name, "no-such-turn")).state == "unknown"
    async with running_worker(agent, kafka_bootstrap_servers):
        await asyncio.wait_for(started.wait(), 30)
        # A read_committed reader sees a commit once its markers land, a moment after.
        running = await client.status(agent.name, handle.turn_id)
        while running.state == "queued":
            await asyncio.sleep(0.05)
            running = await client.status(agent.name, handle.turn_id)
        assert (running.state, running.attempt, running.last_step) == ("running", 1, "llm")
        release.set()
        events = [e async for e in client.stream(agent.name, handle.turn_id)]
    done = await client.status(agent.name, handle.turn_id)
    assert (done.state, done.code, done.events) == ("completed", None, len(events))
    # A turn that already ended is returned as it ended; nothing is stopped.
    assert await client.terminate(agent.name, handle.turn_id) == done


async def test_streams_resume_after_a_seq_and_share_one_reader(
    kafka_bootstrap_servers: str, client: KafkaAgentClient
) -> None:
    @kafka_agent(name=unique_name("resume"), llm=FakeLLM(["a", "b"]), partitions=3)
    async def agent(ctx: AgentContext, n: int) -> int:
        await ctx.llm.run([{"role": "user", "content": str(n)}])
        return n

    async with running_worker(agent, kafka_bootstrap_servers, all_partitions=True):
        first = await client.run(agent.name, n=0, timeout=60)
        handles = [await client.submit(agent.name, n=n) for n in range(1, 9)]

        async def collect(turn_id: str) -> list[int]:
            return [e.seq async for e in client.stream(agent.name, turn_id)]

        # Eight live streams, and one that must move its partition back to the start.
        seqs = await asyncio.wait_for(
            asyncio.gather(collect(first[0].turn_id), *(collect(h.turn_id) for h in handles)),
            60,
        )
    for got in seqs:
        assert got == list(range(len(got))) and len(got) >= 4
    resumed = [e async for e in client.stream(agent.name, first[0].turn_id, after_seq=1)]
    assert [e.seq for e in resumed] == [e.seq for e in first[2:]]
    assert resumed[-1].is_terminal
