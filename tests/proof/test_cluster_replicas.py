"""On a three-broker cluster (replication 3, ``min.insync.replicas`` 2), a turn whose
commit meets two brokers down is refused with ``NOT_ENOUGH_REPLICAS``; once one broker
returns it completes once: nothing lost, nothing doubled, and the worker says what is
happening in a clear line, not a list of every record that timed out."""

from __future__ import annotations

import asyncio
import logging

import pytest
from confluent_kafka.admin import AdminClient

from pyrula_stream import AgentContext, KafkaAgentClient, ToolContext, WorkerOptions, kafka_agent
from pyrula_stream import tool as tool_
from pyrula_stream.kafka.local.cluster import LocalCluster
from pyrula_stream.llm import FakeLLM
from pyrula_stream.llm.fake import reply_tool_call
from pyrula_stream.testing import running_worker, unique_name, wait_for

pytestmark = pytest.mark.cluster


def replication(bootstrap: str, topic: str) -> tuple[list[int], str]:
    """A topic's replica count per partition and its ``min.insync.replicas``."""
    from confluent_kafka.admin import ConfigResource  # type: ignore[attr-defined]

    admin = AdminClient({"bootstrap.servers": bootstrap})
    meta = admin.list_topics(topic, timeout=10).topics[topic]
    res = ConfigResource(ConfigResource.Type.TOPIC, topic)
    config = admin.describe_configs([res])[res].result(timeout=10)
    return [len(p.replicas) for p in meta.partitions.values()], config["min.insync.replicas"].value


def isr_of(bootstrap: str, topic: str) -> list[list[int]]:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    meta = admin.list_topics(topic, timeout=10).topics[topic]
    return [list(p.isrs) for p in meta.partitions.values()]


@pytest.mark.timeout(900)
async def test_a_commit_refused_for_want_of_replicas_completes_once_a_broker_returns(
    kafka_cluster: LocalCluster, caplog: pytest.LogCaptureFixture
) -> None:
    gate = asyncio.Event()

    @tool_
    async def hold(ctx: ToolContext) -> str:
        """Waits until two brokers are down."""
        await gate.wait()
        return "held"

    @kafka_agent(
        name=unique_name("replicas"),
        llm=FakeLLM([reply_tool_call("hold"), "done"]),
        tools=[hold],
        partitions=1,
    )
    async def agent(ctx: AgentContext) -> str:
        return await ctx.llm.run([{"role": "user", "content": "go"}])

    bootstrap = kafka_cluster.bootstrap_servers
    async with (
        KafkaAgentClient(bootstrap) as client,
        running_worker(agent, bootstrap, WorkerOptions(shutdown_grace=0.2)) as worker,
    ):
        # The project's topics take the cluster's replication: 3 copies, 2 in sync.
        assert replication(bootstrap, agent.topics.journal) == ([3], "2")
        handle = await client.submit(agent.name)
        await wait_for(lambda: worker.running_turns == 1, 60, "the turn is running")
        down = [n for n in kafka_cluster.running()][:2]
        # From the first kill on: a commit in flight may already be refused (a record of
        # the running turn) before the in-sync replicas are seen to shrink.
        caplog.clear()
        for node in down:
            await asyncio.to_thread(kafka_cluster.kill, node)
        survivor = kafka_cluster.running()[0]
        await wait_for(
            lambda: isr_of(bootstrap, agent.topics.journal) == [[survivor]],
            60,
            "the in-sync replicas shrank to the one broker left",
        )
        gate.set()
        # Commits are refused meanwhile (NOT_ENOUGH_REPLICAS) until their records time out.
        await wait_for(
            lambda: any("replicas in sync" in r.getMessage() for r in caplog.records),
            240,  # a transaction times out first (10 s), longer on a loaded machine
            "the worker said why its commit failed",
        )
        await asyncio.to_thread(kafka_cluster.restart, down[0])
        events = [e async for e in client.stream(agent.name, handle.turn_id)]
        refused_lines = [r for r in caplog.records if r.levelno >= logging.WARNING]
    try:
        types = [e.type for e in events]
        assert types.count("run:complete") == 1 and types[-1] == "run:complete"
        assert [e.seq for e in events] == list(range(len(events)))
        aborts = [r.getMessage() for r in refused_lines if r.name.endswith(".transactions")]
        said = "\n".join(aborts)
        assert "NOT_ENOUGH_REPLICAS" in said and "replicas in sync" in said, said
        # Said as the shortfall, not as a list of every record that timed out.
        assert not any("failed delivery" in line for line in aborts), said
    finally:
        await asyncio.to_thread(kafka_cluster.restart, down[1])


async def test_topics_apply_warns_of_cluster_settings_that_weaken_exactly_once(
    kafka_cluster: LocalCluster,
) -> None:
    from confluent_kafka.admin import (  # type: ignore[attr-defined]
        AlterConfigOpType,
        ConfigEntry,
        ConfigResource,
    )

    from pyrula_stream.kafka.admin import weak_exactly_once

    bootstrap = kafka_cluster.bootstrap_servers
    assert await asyncio.to_thread(weak_exactly_once, bootstrap) == []  # 3 copies, 2 in sync
    admin = AdminClient({"bootstrap.servers": bootstrap})

    def unclean(op: AlterConfigOpType) -> None:
        """Unclean leader election on (SET true) or back to the default (DELETE), per broker."""
        entry = ConfigEntry("unclean.leader.election.enable", "true", incremental_operation=op)
        for node in kafka_cluster.running():  # one broker resource per call
            resource = ConfigResource(
                ConfigResource.Type.BROKER, str(node), incremental_configs=[entry]
            )
            admin.incremental_alter_configs([resource])[resource].result(timeout=30)

    await asyncio.to_thread(unclean, AlterConfigOpType.SET)
    try:
        said = await asyncio.to_thread(weak_exactly_once, bootstrap)
        assert any("unclean.leader.election.enable is true" in line for line in said), said
    finally:
        await asyncio.to_thread(unclean, AlterConfigOpType.DELETE)
