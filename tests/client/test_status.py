"""The client: a turn's status, resuming a stream, many streams on one shared reader."""

from __future__ import annotations

import asyncio
import time

from confluent_kafka import KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ResourceType,
)

from pyrula_stream import AgentContext, KafkaAgentClient, ToolContext, kafka_agent, tool
from pyrula_stream.client.kafka_client import TurnHandle
from pyrula_stream.client.turn_status import TurnStatus
from pyrula_stream.kafka.admin import apply_topics
from pyrula_stream.llm import FakeLLM, reply_tool_call
from pyrula_stream.testing import running_worker, unique_name


async def status_after(
    client: KafkaAgentClient, agent: str, turn_id: str, leaving: str, key: str | None = None
) -> TurnStatus:
    """The turn's status once it is no longer ``leaving``: a read_committed reader sees a
    commit once its markers land, a moment after the worker moved on."""
    async with asyncio.timeout(30):
        while True:
            status = await client.status(agent, turn_id, key=key)
            if status.state != leaving:
                return status
            await asyncio.sleep(0.05)


def forget_journal(bootstrap: str, topic: str, partitions: int) -> None:
    """Delete every journal record, as compaction eventually does with ended turns (the
    broker deletes records only from a topic that allows deletion, so allow it first)."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    policy = ConfigEntry(
        "cleanup.policy", "compact,delete", incremental_operation=AlterConfigOpType.SET
    )
    resource = ConfigResource(ResourceType.TOPIC, topic, incremental_configs=[policy])
    for future in admin.incremental_alter_configs([resource]).values():
        future.result(timeout=30)
    # The new policy reaches the partition leaders a moment after the call returns: until
    # then the broker refuses the deletion (POLICY_VIOLATION).
    deadline = time.monotonic() + 30
    while True:
        futures = admin.delete_records(
            [TopicPartition(topic, p, -1) for p in range(partitions)]  # -1: up to the end
        )
        try:
            for future in futures.values():
                future.result(timeout=30)
            return
        except KafkaException as exc:
            policy = exc.args[0].code() == KafkaError.POLICY_VIOLATION
            if not policy or time.monotonic() > deadline:
                raise
            time.sleep(0.2)


async def test_status_of_turns_another_client_submitted_reads_their_partition(
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
        name=unique_name("status2"),
        llm=FakeLLM([reply_tool_call("wait_here"), "finished"]),
        tools=[wait_here],
        partitions=3,
    )
    async def agent(ctx: AgentContext, fail: bool = False) -> str:
        if fail:
            raise ValueError("this order cannot be triaged")
        return await ctx.llm.run([{"role": "user", "content": "go"}])

    apply_topics(kafka_bootstrap_servers, agent.topic_specs())
    async with KafkaAgentClient(kafka_bootstrap_servers) as submitter:
        plain = await submitter.submit(agent.name)
        threaded = await submitter.submit(agent.name, thread_id="order-7")
    # This client never saw these submits: what it says comes from Kafka alone.
    assert (await client.status(agent.name, plain.turn_id)).state == "queued"
    queued = await client.status(agent.name, threaded.turn_id, key="order-7")
    assert queued == TurnStatus(threaded.turn_id, "queued")
    assert (await client.status(agent.name, "no-such-turn")).state == "unknown"

    async with running_worker(agent, kafka_bootstrap_servers, all_partitions=True):
        await asyncio.wait_for(started.wait(), 30)
        running = await status_after(client, agent.name, plain.turn_id, "queued")
        assert (running.state, running.attempt, running.last_step) == ("running", 1, "llm")
        release.set()
        events = [e async for e in client.stream(agent.name, plain.turn_id)]
        async with KafkaAgentClient(kafka_bootstrap_servers) as submitter:
            failing = await submitter.submit(agent.name, fail=True)
        await asyncio.wait_for(
            asyncio.gather(*(_drain(client, agent.name, t) for t in (threaded, failing))), 60
        )
    done = await client.status(agent.name, plain.turn_id)
    assert (done.state, done.attempt, done.code, done.events) == ("completed", 1, None, len(events))
    in_thread = await client.status(agent.name, threaded.turn_id, key="order-7")
    assert (in_thread.state, in_thread.code) == ("completed", None)
    failed = await client.status(agent.name, failing.turn_id)
    assert (failed.state, failed.code) == ("failed", "agent_error")

    # Once the journal no longer holds the turns, their results record still says how
    # they ended.
    forget_journal(kafka_bootstrap_servers, agent.topics.journal, 3)
    assert await client.status(agent.name, plain.turn_id) == TurnStatus(
        plain.turn_id, "completed", attempt=1
    )
    failed = await client.status(agent.name, failing.turn_id)
    assert (failed.state, failed.code, failed.events) == ("failed", "agent_error", 0)
    in_thread = await client.status(agent.name, threaded.turn_id, key="order-7")
    assert in_thread.state == "completed"


async def _drain(client: KafkaAgentClient, agent: str, handle: TurnHandle) -> None:
    async for _ in client.stream(agent, handle.turn_id):
        pass


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
