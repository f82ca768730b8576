"""Sub-agents and durable timers across worker processes: parent and child in their own
processes, and a timer that fires after its worker was SIGKILLed."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from pyrula_stream import Event, KafkaAgentClient
from pyrula_stream.chaos.processes import Managed, child_env
from pyrula_stream.kafka.admin import agent_topic_specs, apply_topics, group_member_count
from pyrula_stream.testing import agent_topics_ready, read_topic, unique_name, wait_for

ROOT = Path(__file__).parents[2]


@contextmanager
def worker(
    tmp_path: Path, bootstrap: str, env: dict[str, str], worker_id: str, *specs: str
) -> Iterator[Managed]:
    argv = [sys.executable, "-m", "pyrula_stream.cli", "worker", *specs]
    argv += ["--bootstrap-servers", bootstrap, "--worker-id", worker_id, "--shutdown-grace", "1"]
    proc = Managed(
        worker_id, argv, child_env({"PYTHONPATH": str(ROOT), **env}), tmp_path / f"{worker_id}.log"
    )
    proc.start()
    try:
        yield proc
    finally:
        proc.stop(10.0)


async def stream(client: KafkaAgentClient, agent: str, turn_id: str) -> list[Event]:
    async def read() -> list[Event]:
        return [e async for e in client.stream(agent, turn_id)]

    return await asyncio.wait_for(read(), 120)


async def test_parent_and_child_run_in_their_own_worker_processes(
    kafka_bootstrap_servers: str, client: KafkaAgentClient, tmp_path: Path
) -> None:
    env = {"MESH_TRIAGE": unique_name("triage"), "MESH_REFUNDS": unique_name("refunds")}
    # Deployed first, as in production: a call to an agent without topics fails the call.
    apply_topics(kafka_bootstrap_servers, agent_topic_specs(env["MESH_REFUNDS"], partitions=2))
    with (
        worker(tmp_path, kafka_bootstrap_servers, env, "refunds-1", "tests.agents.mesh:refunds"),
        worker(tmp_path, kafka_bootstrap_servers, env, "triage-1", "tests.agents.mesh:triage"),
    ):
        await agent_topics_ready(kafka_bootstrap_servers, env["MESH_TRIAGE"])
        handles = [
            await client.submit(env["MESH_TRIAGE"], order_id=str(i), cents=100 * i)
            for i in range(3)
        ]
        results = [await stream(client, env["MESH_TRIAGE"], h.turn_id) for h in handles]
    assert [r[-1].data["result"] for r in results] == [f"refunded {100 * i}" for i in range(3)]
    children = [
        r for r in read_topic(kafka_bootstrap_servers, f"pyrula.{env['MESH_REFUNDS']}.turns")
    ]
    assert len(children) == 3
    headers = children[0][2]
    assert headers["pyrula-parent-agent"] == env["MESH_TRIAGE"]
    assert headers["pyrula-depth"] == "1"
    assert headers["pyrula-parent-turn-id"] in {h.turn_id for h in handles}


async def test_one_worker_process_runs_the_whole_mesh(
    kafka_bootstrap_servers: str, client: KafkaAgentClient, tmp_path: Path
) -> None:
    env = {"MESH_TRIAGE": unique_name("triage"), "MESH_REFUNDS": unique_name("refunds")}
    specs = ("tests.agents.mesh:triage", "tests.agents.mesh:refunds")
    with worker(tmp_path, kafka_bootstrap_servers, env, "mesh-1", *specs):
        for agent in env.values():
            await agent_topics_ready(kafka_bootstrap_servers, agent)
        handles = [
            await client.submit(env["MESH_TRIAGE"], order_id=str(i), cents=10 * i) for i in range(2)
        ]
        results = [await stream(client, env["MESH_TRIAGE"], h.turn_id) for h in handles]
    assert [r[-1].data["result"] for r in results] == [f"refunded {10 * i}" for i in range(2)]
    log = (tmp_path / "mesh-1.log").read_text()
    children = read_topic(kafka_bootstrap_servers, f"pyrula.{env['MESH_REFUNDS']}.turns")
    assert len(children) == 2, log


async def test_a_durable_timer_fires_after_its_worker_was_killed(
    kafka_bootstrap_servers: str, client: KafkaAgentClient, tmp_path: Path
) -> None:
    agent = unique_name("timer")
    env = {"MESH_TIMER": agent}
    journal = f"pyrula.{agent}.journal"
    spec = "tests.agents.mesh:timer"
    with worker(tmp_path, kafka_bootstrap_servers, env, "timer-1", spec) as first:
        await agent_topics_ready(kafka_bootstrap_servers, agent)
        handle = await client.submit(agent, seconds=6.0)
        park_key = f"{handle.turn_id}/park".encode()

        def parked() -> bool:
            return any(
                k == park_key and v for k, v, _ in read_topic(kafka_bootstrap_servers, journal)
            )

        await wait_for(parked, 60, "the turn parked on its timer")
        first.kill()
    with worker(tmp_path, kafka_bootstrap_servers, env, "timer-2", spec):
        events = await stream(client, agent, handle.turn_id)
    assert events[-1].type == "run:complete"
    assert events[-1].data["result"] == "woke after 6.0"
    assert [e.type for e in events].count("run:start") == 1
    assert events[-1].ts_ms - events[0].data["started_ms"] >= 6000, "woke before its time"
    assert events[-1].attempt >= 2
    assert [e.seq for e in events] == list(range(len(events)))


async def test_a_cancel_read_before_the_new_owner_restored_a_parked_parent_flows_down(
    kafka_bootstrap_servers: str, client: KafkaAgentClient, tmp_path: Path
) -> None:
    env = {"MESH_WAITER": unique_name("waiter"), "MESH_PATIENT": unique_name("patient")}
    waiter, patient = env["MESH_WAITER"], env["MESH_PATIENT"]
    spec = "tests.agents.mesh:waiter"
    journal = f"pyrula.{waiter}.journal"
    with worker(tmp_path, kafka_bootstrap_servers, env, "patient-1", "tests.agents.mesh:patient"):
        await agent_topics_ready(kafka_bootstrap_servers, patient)
        with worker(tmp_path, kafka_bootstrap_servers, env, "waiter-1", spec) as owner:
            await agent_topics_ready(kafka_bootstrap_servers, waiter)
            handle = await client.submit(waiter)
            park_key = f"{handle.turn_id}/park".encode()

            def parked() -> bool:
                records = read_topic(kafka_bootstrap_servers, journal)
                return any(k == park_key and v for k, v, _ in records)

            await wait_for(parked, 60, "the parent parked on its child")
            # A second worker joins (one partition: it gets none), then the owner dies.
            with worker(tmp_path, kafka_bootstrap_servers, env, "waiter-2", spec):
                group = f"pyrula.{waiter}.workers"
                await wait_for(
                    lambda: group_member_count(kafka_bootstrap_servers, group) == 2,
                    60,
                    "both waiter workers in the group",
                )
                owner.kill()
                # waiter-2 reads this cancel now, before it owns the parent's partition;
                # when it takes the partition over it must end the parent, not re-arm it.
                await client.cancel(waiter, handle.turn_id, reason="order withdrawn")
                parent = await stream(client, waiter, handle.turn_id)
        start = next(e for e in parent if e.type == "subagent:start")
        child = await stream(client, patient, start.data["child_turn_id"])
    assert (parent[-1].type, parent[-1].data["code"]) == ("run:error", "cancelled")
    assert child[-1].type == "run:error", [(e.type, e.data) for e in child]
    assert (child[-1].data["code"], "order withdrawn" in child[-1].data["message"]) == (
        "cancelled",
        True,
    )
