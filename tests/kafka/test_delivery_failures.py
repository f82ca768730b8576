"""Records the broker refuses: the log names them, the producer is replaced, and a record
that keeps failing ends its turn (or goes to the DLQ) so its partition moves on."""

from __future__ import annotations

import asyncio
import logging
import os
from functools import partial

import pytest
from confluent_kafka import Consumer
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewTopic,
    ResourceType,
)

from pyrula_stream import AgentContext, KafkaAgentClient, WorkerOptions, kafka_agent
from pyrula_stream.kafka.io import RecordProducer
from pyrula_stream.kafka.transactions import (
    BatchWriter,
    FailedDelivery,
    Offsets,
    TransactionAborted,
    writer_record_room,
)
from pyrula_stream.llm import FakeLLM
from pyrula_stream.observability.telemetry import WorkerTelemetry
from pyrula_stream.runtime.committer import GroupCommitter
from pyrula_stream.testing import read_topic, running_worker, unique_name
from pyrula_stream.wire.records import OutRecord, undeliverable_letter

LIMIT = 2_000
"""``max.message.bytes`` of the topics here: a random (incompressible) 8 KB value fails."""


def _limit_record_size(bootstrap: str, topic: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    entry = ConfigEntry(
        "max.message.bytes", str(LIMIT), incremental_operation=AlterConfigOpType.SET
    )
    resource = ConfigResource(ResourceType.TOPIC, topic, incremental_configs=[entry])
    for future in admin.incremental_alter_configs([resource]).values():
        future.result(timeout=30)


def _new_topic(bootstrap: str, topic: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(topic, 1, 1)]).values():
        future.result(timeout=30)


def test_a_refused_record_is_named_and_the_next_batch_commits(
    kafka_bootstrap_servers: str, caplog: pytest.LogCaptureFixture
) -> None:
    small, other = unique_name("small"), unique_name("other")
    _new_topic(kafka_bootstrap_servers, small)
    _new_topic(kafka_bootstrap_servers, other)
    _limit_record_size(kafka_bootstrap_servers, small)
    writer = BatchWriter(kafka_bootstrap_servers, transactional_id=unique_name("refused"))
    writer.start()
    consumer = Consumer({"bootstrap.servers": kafka_bootstrap_servers, "group.id": "unused"})
    caplog.set_level(logging.WARNING, logger="pyrula_stream.kafka.transactions")
    try:
        with pytest.raises(TransactionAborted) as aborted:
            writer.write(
                [
                    OutRecord(other, b"k", b"lost with its batch", []),
                    OutRecord(small, b"k", os.urandom(4 * LIMIT), []),
                ],
                {},
                consumer,
                None,
            )
        # The next batch commits at once: the producer that failed is not reused (reused,
        # its next transaction aborts too, with OUT_OF_ORDER_SEQUENCE_NUMBER).
        writer.write([OutRecord(small, b"k", b"fits", [])], {}, consumer, None)
    finally:
        writer.close()
        consumer.close()
    assert aborted.value.failed == (
        FailedDelivery(1, small, 0, "MSG_SIZE_TOO_LARGE", "Broker: Message size too large"),
    )
    lines = [r.getMessage() for r in caplog.records]
    assert any(
        f"1 record(s) failed delivery: {small} [0]: MSG_SIZE_TOO_LARGE" in line for line in lines
    ), lines
    assert [v for _, v, _ in read_topic(kafka_bootstrap_servers, small)] == [b"fits"]
    assert read_topic(kafka_bootstrap_servers, other) == []


async def test_a_turn_whose_record_keeps_failing_ends_and_its_partition_moves_on(
    kafka_bootstrap_servers: str, client: KafkaAgentClient
) -> None:
    @kafka_agent(name=unique_name("refused"), llm=FakeLLM(["unused"]), partitions=1)
    async def agent(ctx: AgentContext, size: int) -> str:
        return os.urandom(size).hex()

    options = WorkerOptions(max_delivery_attempts=3)
    async with running_worker(agent, kafka_bootstrap_servers, options) as worker:
        _limit_record_size(kafka_bootstrap_servers, agent.topics.events)
        refused = await client.run(agent.name, size=4 * LIMIT, timeout=120)
        after = await client.run(agent.name, size=10, timeout=60)
        aborts = worker.committer.stats.aborts
    assert refused[-1].type == "run:error"
    assert refused[-1].data["code"] == "record_undeliverable"
    assert f"{agent.topics.events} [0]: MSG_SIZE_TOO_LARGE" in refused[-1].data["message"]
    assert after[-1].type == "run:complete"
    assert aborts == 3


async def test_a_dead_letter_the_dlq_refuses_is_dropped_and_the_partition_moves_on(
    kafka_bootstrap_servers: str, client: KafkaAgentClient, caplog: pytest.LogCaptureFixture
) -> None:
    @kafka_agent(name=unique_name("refusedlq"), llm=FakeLLM(["fine"]), partitions=1)
    async def agent(ctx: AgentContext) -> str:
        return await ctx.llm.run([{"role": "user", "content": "hello"}])

    caplog.set_level(logging.ERROR, logger="pyrula_stream.runtime.committer")
    producer = RecordProducer(kafka_bootstrap_servers)
    options = WorkerOptions(max_delivery_attempts=3)
    async with running_worker(agent, kafka_bootstrap_servers, options) as worker:
        _limit_record_size(kafka_bootstrap_servers, agent.topics.dlq)
        # Unreadable, so it is dead-lettered as received: too large for the DLQ.
        await producer.send(agent.topics.turns, b"k", os.urandom(4 * LIMIT))
        events = await client.run(agent.name, timeout=120)
        aborts = worker.committer.stats.aborts
    producer.close()
    assert events[-1].type == "run:complete"
    assert aborts == 3
    assert read_topic(kafka_bootstrap_servers, agent.topics.dlq) == []
    dropped = [r for r in caplog.records if r.name == "pyrula_stream.runtime.committer"]
    assert [r.getMessage() for r in dropped] == [
        f"dropped a record of no turn for {agent.topics.dlq}: 3 commits in a row failed to "
        f"deliver this record to {agent.topics.dlq} (partition None)"
    ]


@pytest.mark.parametrize("exactly_once", [True, False])
def test_a_record_produce_refuses_is_charged_to_it_not_read_as_fencing(
    kafka_bootstrap_servers: str, exactly_once: bool
) -> None:
    topic = unique_name("atproduce")
    _new_topic(kafka_bootstrap_servers, topic)
    writer = BatchWriter(
        kafka_bootstrap_servers,
        transactional_id=unique_name("atproduce"),
        exactly_once=exactly_once,
        extra={"message.max.bytes": 10_000},
    )
    writer.start()
    consumer = Consumer({"bootstrap.servers": kafka_bootstrap_servers, "group.id": "unused"})
    try:
        with pytest.raises(TransactionAborted) as aborted:
            writer.write(
                [
                    OutRecord(topic, b"k", b"lost with its batch", []),
                    OutRecord(topic, b"big", b"x" * 20_000, []),
                ],
                {},
                consumer,
                None,
            )
        writer.write([OutRecord(topic, b"k", b"fits", [])], {}, consumer, None)
    finally:
        writer.close()
        consumer.close()
    [failure] = aborted.value.failed
    assert (failure.index, failure.topic, failure.code, failure.at_produce) == (
        1,
        topic,
        "MSG_SIZE_TOO_LARGE",
        True,
    )
    assert "b'big'" in failure.reason  # the record is named
    # Without transactions what went before is sent (its input is read again, as after
    # any failed batch of that mode); with them, nothing of the batch is visible.
    before = [] if exactly_once else [b"lost with its batch"]
    assert [v for _, v, _ in read_topic(kafka_bootstrap_servers, topic)] == [*before, b"fits"]


async def test_a_turn_whose_record_produce_refuses_ends_at_once(
    kafka_bootstrap_servers: str, client: KafkaAgentClient
) -> None:
    @kafka_agent(name=unique_name("atproduce"), llm=FakeLLM(["unused"]), partitions=1)
    async def agent(ctx: AgentContext, size: int) -> str:
        return "x" * size

    options = WorkerOptions(producer_config={"message.max.bytes": 50_000})
    async with running_worker(agent, kafka_bootstrap_servers, options) as worker:
        refused = await client.run(agent.name, size=80_000, timeout=60)
        after = await client.run(agent.name, size=10, timeout=60)
        aborts, sessions = worker.committer.stats.aborts, worker.sessions
    assert refused[-1].type == "run:error"
    assert refused[-1].data["code"] == "record_undeliverable"
    assert "produce() refused a record of the turn" in refused[-1].data["message"]
    assert "MSG_SIZE_TOO_LARGE" in refused[-1].data["message"]
    assert after[-1].type == "run:complete"
    assert (aborts, sessions) == (1, 1)  # one abort, and never read as fencing


async def test_a_record_of_no_turn_produce_refuses_is_replaced_by_its_dead_letter_at_once(
    kafka_bootstrap_servers: str,
) -> None:
    @kafka_agent(name=unique_name("norefuse"), llm=FakeLLM(["unused"]), partitions=1)
    async def agent(ctx: AgentContext) -> str:
        return "unused"

    topic, dlq = unique_name("refusedhere"), agent.topics.dlq
    _new_topic(kafka_bootstrap_servers, topic)
    _new_topic(kafka_bootstrap_servers, dlq)
    limits = {"message.max.bytes": 10_000}
    writer = BatchWriter(
        kafka_bootstrap_servers, transactional_id=unique_name("norefuse"), extra=limits
    )
    writer.start()
    consumer = Consumer({"bootstrap.servers": kafka_bootstrap_servers, "group.id": "unused"})

    async def write(records: list[OutRecord], offsets: Offsets) -> None:
        await asyncio.to_thread(writer.write, records, offsets, consumer, None)

    committer = GroupCommitter(
        write,
        dict,
        lambda _: None,
        telemetry=WorkerTelemetry(agent.name, topics=agent.topics, worker_id="w1", enabled=False),
        dead_letter=partial(
            undeliverable_letter, dlq, worker="w1", max_bytes=writer_record_room(None, limits)
        ),
    )
    loop = asyncio.create_task(committer.run())
    try:
        committer.add_records([OutRecord(topic, b"big", b"x" * 20_000, [("h", b"1")])])
        await asyncio.wait_for(committer.flush(), 60)  # the abort
        await asyncio.wait_for(committer.flush(), 60)  # its dead letter
    finally:
        loop.cancel()
        writer.close()
        consumer.close()
    assert committer.stats.aborts == 1  # its only strike: every try would fail alike
    assert read_topic(kafka_bootstrap_servers, topic) == []
    [(key, value, meta)] = read_topic(kafka_bootstrap_servers, dlq)
    assert (key, value) == (b"big", None)
    assert meta["pyrula.dlq.code"] == "record_undeliverable"
    assert meta["pyrula.dlq.reason"].startswith(f"produce() refused this record for {topic}")
    assert meta["pyrula.original.h"] == "1"
