"""An experiment on the real broker: each new turn starts on the variant its key hashes
to (a thread's turns on one side), runs that version's body and says so in its events."""

from __future__ import annotations

import asyncio

from pyrula_stream import AgentContext, Experiment, KafkaAgentClient, kafka_agent
from pyrula_stream.llm import FakeLLM
from pyrula_stream.testing import running_worker, unique_name
from pyrula_stream.wire.events import Event


async def test_turns_run_on_their_variant_and_threads_stay_on_one_side(
    kafka_bootstrap_servers: str, client: KafkaAgentClient
) -> None:
    name = unique_name("exp")
    experiment = Experiment("tone", {"1": 0.5, "2": 0.5})

    async def version_1(ctx: AgentContext, n: int) -> str:
        return "v1"

    @kafka_agent(
        name=name,
        llm=FakeLLM(["unused"]),
        partitions=2,
        version="2",
        versions={"1": version_1},
        experiment=experiment,
    )
    async def version_2(ctx: AgentContext, n: int) -> str:
        return "v2"

    threads = [f"thread-{i}" for i in range(4)]  # they hash to 2, 1, 1, 2
    async with running_worker(version_2, kafka_bootstrap_servers, all_partitions=True):
        handles = [(await client.submit(name, n=i), None) for i in range(6)]
        for thread in threads:
            for n in (1, 2):
                handles.append((await client.submit(name, thread_id=thread, n=n), thread))
        ends = await asyncio.gather(
            *(asyncio.wait_for(_events(client, name, h.turn_id), 60) for h, _ in handles)
        )
    seen: dict[str, set[str]] = {}
    for (handle, thread), events in zip(handles, ends, strict=True):
        key = thread or handle.turn_id
        variant = experiment.variant_for(key)
        assert events[-1].type == "run:complete", events[-1].data
        assert events[-1].data["result"] == f"v{variant}"
        assert {e.data.get("version") for e in events} == {variant}
        seen.setdefault(key, set()).add(variant)
    assert all(len(v) == 1 for v in seen.values())
    assert {v for vs in seen.values() for v in vs} == {"1", "2"}, "both sides ran turns"


async def _events(client: KafkaAgentClient, agent: str, turn_id: str) -> list[Event]:
    return [e async for e in client.stream(agent, turn_id)]
