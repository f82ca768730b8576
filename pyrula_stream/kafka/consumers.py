"""The worker's consumers: the group consumer of turns, journal restore, and control.

Restore reads a journal partition to its last stable offset under ``read_committed``.
Catch-up is ``position >= end`` (or the partition-EOF event), never ``==``: transaction
markers occupy offsets, so the position can pass the last data record.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, TopicPartition

from pyrula_stream.kafka.config import (
    authorization_error,
    client_config,
    is_authorization_failure,
    new_consumer,
)
from pyrula_stream.serde import headers_dict

RebalanceCallback = Callable[[Consumer, list[TopicPartition]], None]


def group_consumer(
    bootstrap_servers: str,
    group_id: str,
    *,
    client_id: str,
    exactly_once: bool,
    extra: Mapping[str, Any] | None = None,
    kafka_config: Mapping[str, Any] | None = None,
) -> Consumer:
    """The turns consumer: cooperative rebalancing, manual offsets, committed reads only."""
    conf = client_config(
        bootstrap_servers,
        kafka_config,
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
    return new_consumer(conf)


def reader_group_id(prefix: str, agent: str) -> str:
    """The group id of an agent's readers (restore, control, client streams).

    They never join it or commit to it, but librdkafka still looks up its coordinator,
    so a secured cluster needs DESCRIBE on it (``pyrula-stream acls`` grants it).
    """
    return f"{prefix}.{agent}.readers"


def reader_config(
    bootstrap_servers: str,
    *,
    client_id: str,
    kafka_config: Mapping[str, Any] | None = None,
    group_id: str | None = None,
) -> dict[str, Any]:
    """Settings of a reader: assigned partitions, committed records only, never commits."""
    return client_config(
        bootstrap_servers,
        kafka_config,
        **{
            "group.id": group_id or f"{client_id}-reader",
            "client.id": client_id,
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
            "auto.offset.reset": "earliest",
            "fetch.wait.max.ms": 10,
        },
    )


def reader_consumer(
    bootstrap_servers: str,
    *,
    client_id: str,
    kafka_config: Mapping[str, Any] | None = None,
    group_id: str | None = None,
) -> Consumer:
    """A group-less reader (restore, control, clients): assigned partitions, never commits."""
    return new_consumer(
        reader_config(
            bootstrap_servers, client_id=client_id, kafka_config=kafka_config, group_id=group_id
        )
    )


def raise_if_denied(
    conf: Mapping[str, Any], err: KafkaError, topic: str, *, group_operation: str = "DESCRIBE"
) -> None:
    """An authorization error as ``KafkaAuthorizationError`` naming what is missing (readers
    need DESCRIBE on their group, the group consumer READ)."""
    if err.code() == KafkaError.GROUP_AUTHORIZATION_FAILED:
        raise authorization_error(conf, group_operation, f"group {conf.get('group.id')}", err)
    if is_authorization_failure(err):
        raise authorization_error(conf, "READ", f"topic {topic}", err)


def assign_from_beginning(consumer: Consumer, topic: str) -> None:
    """Read every partition of ``topic`` from its first retained record (control topics)."""
    md = consumer.list_topics(topic, timeout=10).topics.get(topic)
    partitions = sorted(md.partitions) if md is not None and md.error is None else [0]
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])


def _next_batch(consumer: Consumer) -> list[Any]:
    """What is buffered now, else the first record within 200 ms (never a full wait)."""
    batch = consumer.consume(1000, 0)
    if batch:
        return list(batch)
    first = consumer.poll(0.2)
    return [] if first is None else [first]


def _watermarks(consumer: Consumer, tp: TopicPartition, deadline: float) -> tuple[int, int]:
    """Low and high (last stable, under read_committed) offsets; retries retriable errors,
    such as a leader not yet elected for a topic created a moment ago."""
    while True:
        try:
            low, high = consumer.get_watermark_offsets(tp, timeout=10, cached=False)
            return int(low), int(high)
        except KafkaException as exc:
            err = exc.args[0] if exc.args else None
            retriable = isinstance(err, KafkaError) and (
                err.retriable() or err.code() in _RETRIABLE_METADATA
            )
            if not retriable or time.monotonic() > deadline:
                raise
            time.sleep(0.2)


_RETRIABLE_METADATA = (
    KafkaError.NOT_LEADER_FOR_PARTITION,
    KafkaError.LEADER_NOT_AVAILABLE,
    KafkaError.UNKNOWN_TOPIC_OR_PART,
    KafkaError._TIMED_OUT,
)


def read_partition_to_end(
    consumer: Consumer, topic: str, partition: int, *, timeout_s: float = 120.0
) -> Iterator[tuple[str, bytes | None, int]]:
    """Yield ``(key, value, timestamp_ms)`` of every committed record of one partition."""
    tp = TopicPartition(topic, partition)
    deadline = time.monotonic() + timeout_s
    low, high = _watermarks(consumer, tp, deadline)
    if high <= low:
        return
    consumer.assign([TopicPartition(topic, partition, OFFSET_BEGINNING)])
    try:
        while True:
            reached_eof = False
            for msg in _next_batch(consumer):
                err = msg.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        reached_eof = True
                        continue
                    if err.retriable():
                        continue
                    raise KafkaException(err)
                key = msg.key()
                yield (key.decode() if key else "", msg.value(), msg.timestamp()[1])
            position = consumer.position([tp])[0].offset
            if reached_eof or position >= high:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"reading {topic}[{partition}] stopped at {position}, end is {high}"
                )
    finally:
        consumer.unassign()


@dataclass(frozen=True, slots=True)
class ConsumedRecord:
    """One committed record, with where and when it was written."""

    partition: int
    offset: int
    key: str
    value: bytes | None
    headers: dict[str, str]
    ts_ms: int


def read_topic(
    bootstrap_servers: str,
    topic: str,
    *,
    timeout_s: float = 60.0,
    client_id: str = "pyrula-read",
    kafka_config: Mapping[str, Any] | None = None,
) -> list[ConsumedRecord]:
    """Every committed record of every partition of ``topic``, read to its end now."""
    conf = reader_config(bootstrap_servers, client_id=client_id, kafka_config=kafka_config)
    consumer = new_consumer(conf)
    out: list[ConsumedRecord] = []
    try:
        md = consumer.list_topics(topic, timeout=10).topics.get(topic)
        if md is not None and md.error is not None:
            raise_if_denied(conf, md.error, topic)
        if md is None or md.error is not None:
            raise KafkaException(f"topic {topic} not found")
        partitions = sorted(md.partitions)
        ends = {
            p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10, cached=False)[1]
            for p in partitions
        }
        pending = {p for p, high in ends.items() if high > 0}
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
        deadline = time.monotonic() + timeout_s
        while pending:
            if time.monotonic() > deadline:
                raise TimeoutError(f"reading {topic}: partitions {sorted(pending)} not at end")
            for msg in _next_batch(consumer):
                err = msg.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        pending.discard(msg.partition() or 0)
                        continue
                    raise KafkaException(err)
                key = msg.key()
                out.append(
                    ConsumedRecord(
                        msg.partition() or 0,
                        msg.offset() or 0,
                        key.decode() if isinstance(key, bytes) else (key or ""),
                        msg.value(),
                        headers_dict(msg.headers()),
                        int(msg.timestamp()[1]),
                    )
                )
            for tp in consumer.position([TopicPartition(topic, p) for p in sorted(pending)]):
                if tp.offset >= ends[tp.partition]:
                    pending.discard(tp.partition)
    finally:
        consumer.close()
    return out
