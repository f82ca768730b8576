"""Several agents in one worker process: each keeps its own group and producer."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from pyrula_stream import (
    AgentContext,
    ConfigurationError,
    KafkaAgent,
    KafkaAgentClient,
    KafkaWorker,
    MeshWorker,
    WorkerOptions,
    kafka_agent,
    registered_agents,
)
from pyrula_stream.kafka.local.broker import free_port
from pyrula_stream.llm import FakeLLM
from pyrula_stream.testing import unique_name, wait_for


def _agents() -> tuple[KafkaAgent, KafkaAgent]:
    @kafka_agent(name=unique_name("greet"), llm=FakeLLM(["hello"]), partitions=2)
    async def greet(ctx: AgentContext, who: str) -> str:
        return f"hello {who}"

    @kafka_agent(name=unique_name("shout"), llm=FakeLLM(["HEY"]), partitions=2)
    async def shout(ctx: AgentContext, who: str) -> str:
        return who.upper()

    return greet, shout


async def test_one_process_runs_two_agents_side_by_side(
    kafka_bootstrap_servers: str, client: KafkaAgentClient
) -> None:
    greet, shout = _agents()
    listed = registered_agents()
    assert any(a is greet for a in listed) and any(a is shout for a in listed)
    port = free_port()
    options = WorkerOptions(shutdown_grace=0.2, health_port=port)
    async with MeshWorker(
        [greet, shout], bootstrap_servers=kafka_bootstrap_servers, options=options
    ) as mesh:
        await wait_for(
            lambda: all(w.assigned_partitions == 2 for w in mesh.workers), 60, "both agents joined"
        )
        a, b = await asyncio.gather(
            client.run(greet.name, who="ann"),
            client.run(shout.name, who="bob"),
        )
        assert mesh.worker(shout.name).agent is shout
        async with httpx.AsyncClient() as http:
            page = (await http.get(f"http://127.0.0.1:{port}/metrics")).text
    # One page for the process: each family once, the samples of both agents.
    assert page.count("# TYPE pyrula_turns_total counter") == 1, page
    for agent in (greet.name, shout.name):
        assert f'pyrula_turns_total{{agent="{agent}",outcome="completed"}} 1.0' in page, page
    assert a[-1].data["result"] == "hello ann"
    assert b[-1].data["result"] == "BOB"


def test_a_mesh_refuses_one_group_id_for_several_agents() -> None:
    greet, shout = _agents()
    with pytest.raises(ConfigurationError, match="group_id"):
        MeshWorker(
            [greet, shout],
            bootstrap_servers="localhost:1",
            options=WorkerOptions(group_id="one"),
        )


def test_a_kafka_worker_given_a_list_names_the_mesh_worker() -> None:
    greet, shout = _agents()
    with pytest.raises(ConfigurationError, match=r"MeshWorker\(\[\.\.\.\]\)"):
        KafkaWorker([greet, shout], bootstrap_servers="localhost:1")  # type: ignore[arg-type]
