"""The committed input offset behind a long-running turn, on the real broker: it never
passes the unfinished turn's request while the turns after it finish and commit, and it
jumps past all of them once that turn ends (the finished turns behind it are then
forgotten, each exactly once)."""

from __future__ import annotations

import asyncio

from pyrula_stream import AgentContext, KafkaAgentClient, kafka_agent
from pyrula_stream.kafka.consumers import reader_consumer
from pyrula_stream.kafka.offsets import committed_offset, watermarks
from pyrula_stream.llm import FakeLLM
from pyrula_stream.testing import running_worker, unique_name, wait_for

FAST_TURNS = 20
"""Finished turns behind each long-running one."""


async def test_long_turns_hold_the_offset_and_each_end_releases_the_turns_behind_it(
    kafka_bootstrap_servers: str, client: KafkaAgentClient
) -> None:
    gates = {"slow a": asyncio.Event(), "slow b": asyncio.Event()}

    @kafka_agent(name=unique_name("held"), llm=FakeLLM(["ok"]), partitions=1)
    async def agent(ctx: AgentContext, name: str) -> str:
        if name in gates:
            await gates[name].wait()
        return name

    async with running_worker(agent, kafka_bootstrap_servers) as worker:
        reader = reader_consumer(
            kafka_bootstrap_servers, client_id="held-offsets", group_id=worker.group_id
        )
        topic = agent.topics.turns

        def committed() -> int | None:
            return committed_offset(reader, topic, 0)

        async def end() -> int:
            return (await asyncio.to_thread(watermarks, reader, topic, 0))[1]

        async def fast_turns(held_at: int) -> None:
            for n in range(FAST_TURNS):
                await client.run(agent.name, name=f"fast {n}", timeout=60)
                if n % 5 == 4:  # committed again and again, never past the held turn
                    await worker.committer.flush()
                    held = await asyncio.to_thread(committed)
                    assert held is None or held <= held_at, (held, held_at)

        try:
            a_offset = await end()
            slow_a = await client.submit(agent.name, name="slow a")
            await fast_turns(a_offset)
            b_offset = await end()
            slow_b = await client.submit(agent.name, name="slow b")
            await fast_turns(a_offset)
            await worker.committer.flush()
            assert await asyncio.to_thread(committed) == a_offset
            assert worker.remembered_turns == 2 * FAST_TURNS
            last = await end()
            assert last == a_offset + 2 * (1 + FAST_TURNS)

            gates["slow a"].set()
            events = [e async for e in client.stream(agent.name, slow_a.turn_id)]
            assert events[-1].type == "run:complete"
            await wait_for(
                lambda: worker.remembered_turns == FAST_TURNS,
                30,
                "the turns between the two slow ones forgotten, those after b kept",
            )
            await worker.committer.flush()
            assert await asyncio.to_thread(committed) == b_offset
            assert worker.remembered_turns == FAST_TURNS

            gates["slow b"].set()
            events = [e async for e in client.stream(agent.name, slow_b.turn_id)]
            assert events[-1].type == "run:complete"
            await wait_for(lambda: worker.remembered_turns == 0, 30, "every turn forgotten")
            await worker.committer.flush()
            assert await asyncio.to_thread(committed) == last
        finally:
            reader.close()
    assert worker.turns_finished == 2 * (1 + FAST_TURNS)
