"""Consumer factories and the short-lived readers: how every consumer is configured, and
the reads that are not group membership (a whole topic, one key, control and replies).

The worker's membership of its group (assign/revoke hooks, decoding polled turn requests,
fencing) is ``group.py``'s ``TurnConsumer``; this module only builds the consumer it uses
(``group_consumer``).

Reading a topic or partition to its end is ``pyrula_stream.kafka.offsets.read_to_end``;
the two functions here are its shapes for restore and for ``read_topic``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, TopicPartition

from pyrula_stream.kafka.config import (
    authorization_error,
    client_config,
    is_authorization_failure,
    new_consumer,
    reader_config,
)
from pyrula_stream.kafka.offsets import ConsumedRecord, kafka_error, read_to_end, to_record

STATS_INTERVAL_MS = 5000
"""How often librdkafka reports statistics (consumer lag) when a worker exports metrics."""


def group_consumer(
    bootstrap_servers: str,
    group_id: str,
    *,
    client_id: str,
    exactly_once: bool,
    group_instance_id: str | None = None,
    group_protocol: str = "classic",
    extra: Mapping[str, Any] | None = None,
    stats_cb: Callable[[str], None] | None = None,
    kafka_config: Mapping[str, Any] | None = None,
) -> Consumer:
    """The turns consumer: manual offsets, committed reads only.

    The classic protocol rebalances cooperatively (``cooperative-sticky``); with
    ``group_protocol="consumer"`` (KIP-848) the broker assigns and owns the session and
    heartbeat settings, so they are not set here. ``group_instance_id`` makes the member
    static (KIP-345). With ``stats_cb``, librdkafka hands it its statistics JSON every
    ``statistics.interval.ms`` (5 s here), from inside ``poll``. ``kafka_config`` is the
    user's client settings; ``extra`` (``WorkerOptions.consumer_config``) applies last.
    """
    conf: dict[str, Any] = {
        "group.id": group_id,
        "client.id": client_id,
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "auto.offset.reset": "earliest",
        "isolation.level": "read_committed",
        "max.poll.interval.ms": 300_000,
    }
    if group_protocol == "consumer":
        conf["group.protocol"] = "consumer"
    else:
        conf["partition.assignment.strategy"] = "cooperative-sticky"
        conf["session.timeout.ms"] = 10_000
        conf["heartbeat.interval.ms"] = 1_000
    if group_instance_id is not None:
        conf["group.instance.id"] = group_instance_id
    if stats_cb is not None:
        conf["statistics.interval.ms"] = STATS_INTERVAL_MS
        conf["stats_cb"] = stats_cb
    conf = client_config(bootstrap_servers, kafka_config, **conf)
    conf.update(extra or {})
    return new_consumer(conf)


def reader_group_id(prefix: str, agent: str) -> str:
    """The group id of an agent's readers (restore, control, replies, tables, client streams).

    They never join it or commit to it, but librdkafka still looks up its coordinator,
    so a secured cluster needs DESCRIBE on it (``pyrula-stream acls`` grants it).
    """
    return f"{prefix}.{agent}.readers"


def reader_consumer(
    bootstrap_servers: str,
    *,
    client_id: str,
    kafka_config: Mapping[str, Any] | None = None,
    group_id: str | None = None,
) -> Consumer:
    """A group-less reader (restore, tables, control, clients): assigned partitions only."""
    return new_consumer(
        reader_config(
            bootstrap_servers, kafka_config=kafka_config, client_id=client_id, group_id=group_id
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
    kafka_config: Mapping[str, Any] | None = None,
    group_id: str | None = None,
) -> list[ConsumedRecord]:
    """Every committed record of every partition of ``topic``, read to its end now."""
    conf = reader_config(
        bootstrap_servers, kafka_config=kafka_config, client_id=client_id, group_id=group_id
    )
    consumer = new_consumer(conf)
    try:
        md = consumer.list_topics(topic, timeout=10).topics.get(topic)
        if md is not None and md.error is not None:
            raise_if_denied(conf, md.error, topic)
        try:
            return list(read_to_end(consumer, topic, timeout_s=timeout_s))
        except KafkaException as exc:
            err = kafka_error(exc)
            if err is not None:
                raise_if_denied(conf, err, topic)
            raise
    finally:
        consumer.close()


class ControlReader:
    """Follows every partition of an agent's control topic from its first retained record:
    a cancel may arrive before its turn does, so the whole topic is read."""

    def __init__(
        self,
        bootstrap_servers: str,
        topic: str,
        *,
        client_id: str,
        kafka_config: Mapping[str, Any] | None = None,
        group_id: str | None = None,
    ) -> None:
        self._consumer = reader_consumer(
            bootstrap_servers, client_id=client_id, kafka_config=kafka_config, group_id=group_id
        )
        assign_from_beginning(self._consumer, topic)

    def poll(self) -> list[bytes | None]:
        """The values that arrived since the last call (never waits)."""
        return [m.value() for m in self._consumer.consume(100, 0) if m.error() is None]

    def close(self) -> None:
        self._consumer.close()


def read_key_partition(
    bootstrap_servers: str,
    topic: str,
    key: str,
    *,
    client_id: str,
    timeout_s: float = 120.0,
    kafka_config: Mapping[str, Any] | None = None,
    group_id: str | None = None,
) -> list[ConsumedRecord]:
    """Every committed record of the (murmur2) partition of ``key``, in order, tombstones
    and other keys included (a thread's records share its turns' partition). A topic that
    does not exist holds none; a refused read raises ``KafkaAuthorizationError``."""
    from pyrula_stream.kafka.partitioner import partition_for

    conf = reader_config(
        bootstrap_servers, kafka_config=kafka_config, client_id=client_id, group_id=group_id
    )
    consumer = new_consumer(conf)
    try:
        md = consumer.list_topics(topic, timeout=10).topics.get(topic)
        if md is not None and md.error is not None:
            raise_if_denied(conf, md.error, topic)
        if md is None or md.error is not None or not md.partitions:
            return []
        partition = partition_for(key.encode(), len(md.partitions))
        return list(read_partition_to_end(consumer, topic, partition, timeout_s=timeout_s))
    finally:
        consumer.close()


def read_key(
    bootstrap_servers: str,
    topic: str,
    key: str,
    *,
    client_id: str,
    timeout_s: float = 120.0,
    kafka_config: Mapping[str, Any] | None = None,
    group_id: str | None = None,
) -> list[ConsumedRecord]:
    """The committed records of ``key`` in ``topic``, tombstones left out."""
    return [
        record
        for record in read_key_partition(
            bootstrap_servers,
            topic,
            key,
            client_id=client_id,
            timeout_s=timeout_s,
            kafka_config=kafka_config,
            group_id=group_id,
        )
        if record.key == key and record.value is not None
    ]


class RepliesReader:
    """Follows the replies, signals and answers partitions whose turns partitions this
    worker owns, each from the position journaled with the last record taken from it (so
    each is taken exactly once).

    Not a group member: the group's cooperative assignor would not give one member
    partition p of two topics, so the owner of turns partition p assigns partition p of
    each followed topic here.
    """

    def __init__(
        self,
        bootstrap_servers: str,
        topics: Sequence[str],
        *,
        client_id: str,
        kafka_config: Mapping[str, Any] | None = None,
        group_id: str | None = None,
    ) -> None:
        self.topics = tuple(topics)
        self._consumer = reader_consumer(
            bootstrap_servers, client_id=client_id, kafka_config=kafka_config, group_id=group_id
        )

    def assign(self, positions: Mapping[int, Mapping[str, int | None]]) -> None:
        """Start reading partition p of each topic at its position (``None`` or absent:
        from the beginning)."""
        if positions:
            self._consumer.incremental_assign(
                [
                    TopicPartition(topic, p, OFFSET_BEGINNING if pos is None else pos)
                    for p, by_topic in positions.items()
                    for topic in self.topics
                    for pos in [by_topic.get(topic)]
                ]
            )

    def unassign(self, partitions: set[int]) -> None:
        owned = {(tp.topic, tp.partition) for tp in self._consumer.assignment()}
        gone = sorted(tp for tp in owned if tp[1] in partitions)
        if gone:
            self._consumer.incremental_unassign([TopicPartition(t, p) for t, p in gone])

    def poll(self) -> list[ConsumedRecord]:
        """The replies that arrived since the last call (never waits)."""
        return [to_record(m) for m in self._consumer.consume(100, 0) if m.error() is None]

    def close(self) -> None:
        self._consumer.close()
