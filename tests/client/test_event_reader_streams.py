"""The shared event reader scales with streams (issue 47): a subscribe never waits for the
shared consumer's poll, a partition no stream needs is released, and a stream that is not
read holds a bounded queue yet still gets every record in order. Real broker."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

from confluent_kafka import Producer

from pyrula_stream.client.event_reader import QUEUE_RECORDS, SharedEventReader, Subscription
from pyrula_stream.kafka.admin import agent_topic_specs, apply_topics
from pyrula_stream.kafka.partitioner import partition_for
from pyrula_stream.testing import unique_name, wait_for


def produce(
    bootstrap: str, topic: str, key: bytes, values: list[bytes], partitions: int = 1
) -> None:
    """As the worker writes events: to the key's partition by ``partition_for``."""
    producer = Producer({"bootstrap.servers": bootstrap})
    for value in values:
        producer.produce(topic, value, key, partition=partition_for(key, partitions))
    assert producer.flush(30) == 0


async def events_topic(bootstrap: str, partitions: int) -> str:
    name = unique_name("reader")
    specs = [
        s for s in agent_topic_specs(name, partitions=partitions) if s.name.endswith(".events")
    ]
    await asyncio.to_thread(apply_topics, bootstrap, specs)
    return specs[0].name


def without_suspending(coro: Coroutine[Any, Any, Subscription]) -> Subscription:
    """Run ``coro`` to its end in one step: it may not wait for anything (a poll, a lock,
    a lookup in a thread) on the way."""
    try:
        coro.send(None)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
    coro.close()
    raise AssertionError("the subscribe waited for something")


async def take(reader: SharedEventReader, sub: Subscription, n: int) -> list[bytes]:
    return [(await reader.get(sub)).value or b"" for _ in range(n)]


async def test_a_subscribe_to_a_read_partition_waits_for_no_poll(
    kafka_bootstrap_servers: str,
) -> None:
    topic = await events_topic(kafka_bootstrap_servers, 1)
    reader = SharedEventReader(kafka_bootstrap_servers)
    try:
        first = await reader.subscribe(topic, b"first", None, new=True)
        await asyncio.to_thread(produce, kafka_bootstrap_servers, topic, b"first", [b"f0"])
        assert await asyncio.wait_for(take(reader, first, 1), 30) == [b"f0"]
        # the shared consumer is polling now; a new turn's stream does not queue behind it
        second = without_suspending(reader.subscribe(topic, b"second", None))
        also = reader.follow_new(topic, b"third")
        assert also is not None
        await asyncio.to_thread(produce, kafka_bootstrap_servers, topic, b"second", [b"s0", b"s1"])
        await asyncio.to_thread(produce, kafka_bootstrap_servers, topic, b"third", [b"t0"])
        assert await asyncio.wait_for(take(reader, second, 2), 30) == [b"s0", b"s1"]
        assert await asyncio.wait_for(take(reader, also, 1), 30) == [b"t0"]
        assert not first.records, "the first stream got only its own records"
    finally:
        await reader.close()


async def test_a_partition_no_stream_needs_is_released(kafka_bootstrap_servers: str) -> None:
    topic = await events_topic(kafka_bootstrap_servers, 4)
    keys = {partition_for(f"k{i}".encode(), 4): f"k{i}".encode() for i in range(64)}
    a, b = keys[0], keys[1]
    reader = SharedEventReader(kafka_bootstrap_servers, release_after_s=0.0)
    try:
        sub_a = await reader.subscribe(topic, a, None, new=True)
        sub_b = await reader.subscribe(topic, b, None, new=True)
        await wait_for(lambda: reader.fetched == {(topic, 0), (topic, 1)}, 30, "both read")
        reader.unsubscribe(sub_a)
        await wait_for(lambda: reader.fetched == {(topic, 1)}, 30, "partition 0 released")
        assert reader.assigned() == {(topic, 1)}
        # the other stream still gets its records, and a new stream reads partition 0 again
        again = await reader.subscribe(topic, a, None, new=True)
        await asyncio.to_thread(produce, kafka_bootstrap_servers, topic, a, [b"a1"], 4)
        await asyncio.to_thread(produce, kafka_bootstrap_servers, topic, b, [b"b1"], 4)
        assert await asyncio.wait_for(take(reader, again, 1), 30) == [b"a1"]
        assert await asyncio.wait_for(take(reader, sub_b, 1), 30) == [b"b1"]
        reader.unsubscribe(again)
        reader.unsubscribe(sub_b)
        await wait_for(lambda: not reader.fetched, 30, "every partition released")
    finally:
        await reader.close()


async def test_a_stream_that_is_not_read_holds_a_bounded_queue_and_misses_nothing(
    kafka_bootstrap_servers: str,
) -> None:
    topic = await events_topic(kafka_bootstrap_servers, 1)
    total = QUEUE_RECORDS * 8
    values = [f"v{i}".encode() for i in range(total)]
    reader = SharedEventReader(kafka_bootstrap_servers)
    try:
        slow = await reader.subscribe(topic, b"slow", None, new=True)
        marker = await reader.subscribe(topic, b"marker", None, new=True)
        await asyncio.to_thread(produce, kafka_bootstrap_servers, topic, b"slow", values)
        await asyncio.to_thread(produce, kafka_bootstrap_servers, topic, b"marker", [b"m"])
        # the shared consumer has read everything once the marker (written last) is in
        assert await asyncio.wait_for(take(reader, marker, 1), 30) == [b"m"]
        assert len(slow.records) <= QUEUE_RECORDS, "a stream not read does not buffer it all"
        got: list[bytes] = []
        halfway = total // 2
        while len(got) < total:
            got += await asyncio.wait_for(take(reader, slow, 1), 30)
            assert len(slow.records) <= QUEUE_RECORDS
            if len(got) == halfway:  # more while it catches up: also in order, once
                more = [f"w{i}".encode() for i in range(QUEUE_RECORDS)]
                await asyncio.to_thread(produce, kafka_bootstrap_servers, topic, b"slow", more)
                values += more
                total += len(more)
        assert got == values, "every record, in order, none twice"
    finally:
        await reader.close()
