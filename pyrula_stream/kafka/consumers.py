"""The worker's consumers: the group consumer of turns, journal restore, and control.

Reading a topic or partition to its end is ``pyrula_stream.kafka.offsets.read_to_end``;
the two functions here are its shapes for restore and for ``read_topic``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

from pyrula_stream.kafka.config import base_config, reader_config
from pyrula_stream.kafka.offsets import ConsumedRecord, read_to_end

RebalanceCallback = Callable[[Consumer, list[TopicPartition]], None]


def group_consumer(
    bootstrap_servers: str,
    group_id: str,
    *,
    client_id: str,
    exactly_once: bool,
    extra: dict[str, Any] | None = None,
) -> Consumer:
    """The turns consumer: cooperative rebalancing, manual offsets, committed reads only."""
    conf = base_config(
        bootstrap_servers,
        **{
            "group.id": group_id,
            "client.id": client_id,
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "auto.offset.reset": "earliest",
            "isolation.level": "read_committed",
            "partition.assignment.strategy": "cooperative-sticky",
            "session.timeout.ms": 10_000,
            "heartbeat.interval.ms": 1_000,
            "max.poll.interval.ms": 300_000,
        },
    )
    conf.update(extra or {})
    return Consumer(conf)


def reader_consumer(bootstrap_servers: str, *, client_id: str) -> Consumer:
    """A group-less reader (restore, tables, control, clients): assigned partitions only."""
    return Consumer(reader_config(bootstrap_servers, client_id=client_id))


def assign_from_beginning(consumer: Consumer, topic: str) -> None:
    """Read every partition of ``topic`` from its first retained record (control topics)."""
    md = consumer.list_topics(topic, timeout=10).topics.get(topic)
    partitions = sorted(md.partitions) if md is not None and md.error is None else [0]
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])


def read_partition_to_end(
    consumer: Consumer, topic: str, partition: int, *, timeout_s: float = 120.0
) -> Iterator[ConsumedRecord]:
    """Every committed record of one partition, read to its end now (journal restore)."""
    yield from read_to_end(consumer, topic, [partition], timeout_s=timeout_s)


def read_topic(
    bootstrap_servers: str,
    topic: str,
    *,
    timeout_s: float = 60.0,
    client_id: str = "pyrula-read",
) -> list[ConsumedRecord]:
    """Every committed record of every partition of ``topic``, read to its end now."""
    consumer = reader_consumer(bootstrap_servers, client_id=client_id)
    try:
        return list(read_to_end(consumer, topic, timeout_s=timeout_s))
    finally:
        consumer.close()
