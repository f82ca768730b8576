"""A stream that asks for old events (``since_ms``, the log start) gets them from a read of
its own: the client's shared event reader never moves back for it, so the other streams
of the partition are not handed the partition's history again (issue 46). Real broker."""

from __future__ import annotations

import asyncio

from confluent_kafka import Producer

from pyrula_stream.client.event_reader import SharedEventReader, Subscription
from pyrula_stream.kafka.admin import agent_topic_specs, apply_topics
from pyrula_stream.testing import unique_name, wait_for


def produce(bootstrap: str, topic: str, key: bytes, values: list[bytes]) -> None:
    producer = Producer({"bootstrap.servers": bootstrap})
    for value in values:
        producer.produce(topic, value, key)
    assert producer.flush(30) == 0


def drained(sub: Subscription) -> list[bytes]:
    assert sub.error is None, sub.error
    out = [item.value or b"" for item in sub.records]
    sub.records.clear()
    return out


async def test_an_old_read_does_not_rewind_the_shared_reader(kafka_bootstrap_servers: str) -> None:
    name = unique_name("rewind")
    specs = [s for s in agent_topic_specs(name, partitions=1) if s.name.endswith(".events")]
    await asyncio.to_thread(apply_topics, kafka_bootstrap_servers, specs)
    topic = specs[0].name
    old = [f"old-{i}".encode() for i in range(20)]
    await asyncio.to_thread(produce, kafka_bootstrap_servers, topic, b"victim", [b"v0", b"v1"])
    await asyncio.to_thread(produce, kafka_bootstrap_servers, topic, b"asker", old)

    reader = SharedEventReader(kafka_bootstrap_servers)
    try:
        victim = await reader.subscribe(topic, b"victim", None)
        await wait_for(lambda: len(victim.records) >= 2, 30, "the victim's two records")
        seen_by_victim = drained(victim)
        # another caller asks for its key's history from the log start
        asker = await reader.subscribe(topic, b"asker", None)
        await asyncio.to_thread(produce, kafka_bootstrap_servers, topic, b"asker", [b"new"])
        await asyncio.to_thread(produce, kafka_bootstrap_servers, topic, b"victim", [b"v2"])
        await wait_for(lambda: len(asker.records) >= 21, 30, "the asker's history and news")
        await wait_for(lambda: len(victim.records) >= 1, 30, "the victim's new record")
        got_by_asker = drained(asker)
        seen_by_victim += drained(victim)
    finally:
        await reader.close()
    assert got_by_asker == [*old, b"new"], "the history first, in order, then the news"
    assert seen_by_victim == [b"v0", b"v1", b"v2"], "the victim read nothing twice"
