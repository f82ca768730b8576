"""Plain producing and reading for clients: submit records, read a partition from a time.

Both answer within a timeout with one of our errors: ``UnknownTopicError`` for a topic
that does not exist (asked up front, instead of librdkafka's 30 s wait for it to appear)
and ``BrokerUnavailableError`` when no broker answers.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)

from pyrula_stream.errors import BrokerUnavailableError, UnknownTopicError
from pyrula_stream.kafka.config import base_config, unreachable_reason
from pyrula_stream.kafka.consumers import reader_consumer
from pyrula_stream.kafka.partitioner import PARTITIONER, partition_for
from pyrula_stream.serde import headers_dict


@dataclass(frozen=True)
class Delivered:
    topic: str
    partition: int
    offset: int


def broker_unavailable(
    bootstrap_servers: str, timeout_s: float, what: str
) -> BrokerUnavailableError:
    """The error for "no broker answered": says where, how long, why, and what to check."""
    reason = unreachable_reason(bootstrap_servers) or "no answer"
    return BrokerUnavailableError(
        f"cannot reach Kafka at {bootstrap_servers} within {timeout_s:g}s to {what} "
        f"({reason}): check the bootstrap servers and that the broker is running"
    )


def _is_transport(exc: KafkaException) -> bool:
    err = exc.args[0] if exc.args else None
    return isinstance(err, KafkaError) and err.code() in (
        KafkaError._TRANSPORT,
        KafkaError._TIMED_OUT,
        KafkaError._ALL_BROKERS_DOWN,
        KafkaError._RESOLVE,
    )


def _topic_partitions(
    client: Producer | Consumer, bootstrap: str, topic: str, timeout_s: float
) -> int:
    """How many partitions ``topic`` has; ``UnknownTopicError`` when it has none."""
    try:
        md = client.list_topics(topic, timeout=timeout_s)
    except KafkaException as exc:
        if _is_transport(exc):
            if isinstance(client, Producer) or not client.assignment():
                client.poll(0)  # serves the queued error callbacks that say why
            raise broker_unavailable(bootstrap, timeout_s, f"read metadata of {topic}") from None
        raise
    found = md.topics.get(topic)
    if found is None or found.error is not None or not found.partitions:
        raise UnknownTopicError(f"no topic {topic}", topic=topic)
    return len(found.partitions)


class RecordProducer:
    """An idempotent producer whose ``send`` returns once the broker acknowledged.

    ``timeout_s`` bounds each send, including the first look at a topic's metadata.
    """

    def __init__(self, bootstrap_servers: str, *, timeout_s: float = 30.0, **extra: Any) -> None:
        self.bootstrap_servers = bootstrap_servers
        self.timeout_s = timeout_s
        self._known_topics: set[str] = set()
        self._producer = Producer(
            base_config(
                bootstrap_servers,
                **{
                    "enable.idempotence": True,
                    "acks": "all",
                    "linger.ms": 1,
                    "partitioner": PARTITIONER,
                },
                **extra,
            )
        )

    def send_sync(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        headers: list[tuple[str, str | bytes | None]] | None = None,
        timeout_s: float | None = None,
    ) -> Delivered:
        timeout_s = self.timeout_s if timeout_s is None else timeout_s
        if topic not in self._known_topics:
            _topic_partitions(self._producer, self.bootstrap_servers, topic, timeout_s)
            self._known_topics.add(topic)
        result: list[Any] = []

        def on_delivery(err: KafkaError | None, msg: Any) -> None:
            result.append(err if err is not None else msg)

        self._producer.produce(
            topic, key=key, value=value, headers=headers or [], on_delivery=on_delivery
        )
        self._producer.flush(timeout_s)
        if not result:
            # Not sent yet: take it back, so a send reported as failed does not land later.
            self._producer.purge(in_queue=True, in_flight=False)
            self._producer.poll(0)
            raise broker_unavailable(self.bootstrap_servers, timeout_s, f"write to {topic}")
        if isinstance(result[0], KafkaError):
            if result[0].code() in (KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC):
                self._known_topics.discard(topic)
                raise UnknownTopicError(f"no topic {topic}", topic=topic)
            raise KafkaException(result[0])
        msg = result[0]
        return Delivered(msg.topic(), msg.partition(), msg.offset())

    async def send(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        headers: list[tuple[str, str | bytes | None]] | None = None,
    ) -> Delivered:
        return await asyncio.to_thread(self.send_sync, topic, key, value, headers)

    def close(self) -> None:
        self._producer.flush(10)


class PartitionReader:
    """Reads committed records of the partition that holds ``key``, from a timestamp."""

    def __init__(
        self, bootstrap_servers: str, topic: str, *, client_id: str, timeout_s: float = 10.0
    ) -> None:
        self.topic = topic
        self.bootstrap_servers = bootstrap_servers
        self.timeout_s = timeout_s
        self._consumer: Consumer = reader_consumer(bootstrap_servers, client_id=client_id)

    def partitions(self) -> int:
        return _topic_partitions(self._consumer, self.bootstrap_servers, self.topic, self.timeout_s)

    def seek_key(self, key: bytes, since_ms: int | None) -> int:
        partition = partition_for(key, self.partitions())
        self.seek_partitions([partition], since_ms)
        return partition

    def seek_partitions(self, partitions: list[int] | None, since_ms: int | None) -> None:
        parts = partitions if partitions is not None else list(range(self.partitions()))
        start = []
        for p in parts:
            offset = OFFSET_BEGINNING
            if since_ms is not None:
                # The end is read first: a record written after it has a later timestamp,
                # so when no record is as new as since_ms, starting there misses nothing.
                try:
                    _, end = self._consumer.get_watermark_offsets(
                        TopicPartition(self.topic, p), timeout=self.timeout_s, cached=False
                    )
                    found = self._consumer.offsets_for_times(
                        [TopicPartition(self.topic, p, since_ms)], timeout=self.timeout_s
                    )[0]
                except KafkaException as exc:
                    if _is_transport(exc):
                        raise broker_unavailable(
                            self.bootstrap_servers, self.timeout_s, f"read {self.topic}"
                        ) from None
                    raise
                offset = found.offset if found.offset >= 0 else end
            start.append(TopicPartition(self.topic, p, offset))
        self._consumer.assign(start)

    def poll(
        self, timeout_s: float
    ) -> Iterator[tuple[bytes | None, bytes | None, dict[str, str], int, int]]:
        """Yield ``(key, value, headers, partition, offset)``; partition-EOF is skipped.

        Returns as soon as a record is there (``consume`` alone waits for a full batch or
        the whole timeout).
        """
        first = self._consumer.poll(timeout_s)
        batch = [] if first is None else [first, *self._consumer.consume(499, 0)]
        for msg in batch:
            err = msg.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    continue
                raise KafkaException(err)
            key = msg.key()
            yield (
                key.encode() if isinstance(key, str) else key,
                msg.value(),
                headers_dict(msg.headers()),
                msg.partition() or 0,
                msg.offset() or 0,
            )

    def close(self) -> None:
        self._consumer.close()
