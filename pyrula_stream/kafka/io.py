"""Plain producing and reading for clients: submit records, read a partition from a time."""

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

from pyrula_stream.kafka.config import producer_config
from pyrula_stream.kafka.consumers import reader_consumer
from pyrula_stream.kafka.offsets import watermarks
from pyrula_stream.kafka.partitioner import partition_for
from pyrula_stream.serde import headers_dict


@dataclass(frozen=True)
class Delivered:
    topic: str
    partition: int
    offset: int


class RecordProducer:
    """An idempotent producer whose ``send`` returns once the broker acknowledged."""

    def __init__(self, bootstrap_servers: str, **extra: Any) -> None:
        self._producer = Producer(producer_config(bootstrap_servers, **extra))

    def send_sync(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        headers: list[tuple[str, str | bytes | None]] | None = None,
        timeout_s: float = 30.0,
    ) -> Delivered:
        result: list[Any] = []

        def on_delivery(err: KafkaError | None, msg: Any) -> None:
            result.append(err if err is not None else msg)

        self._producer.produce(
            topic, key=key, value=value, headers=headers or [], on_delivery=on_delivery
        )
        self._producer.flush(timeout_s)
        if not result:
            raise TimeoutError(f"no acknowledgement from {topic} within {timeout_s}s")
        if isinstance(result[0], KafkaError):
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

    def __init__(self, bootstrap_servers: str, topic: str, *, client_id: str) -> None:
        self.topic = topic
        self._consumer: Consumer = reader_consumer(bootstrap_servers, client_id=client_id)

    def partitions(self) -> int:
        md = self._consumer.list_topics(self.topic, timeout=10)
        topic = md.topics.get(self.topic)
        if topic is None or topic.error is not None:
            raise KafkaException(f"topic {self.topic} not found")
        return len(topic.partitions)

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
                _, end = watermarks(self._consumer, self.topic, p, timeout_s=10)
                found = self._consumer.offsets_for_times(
                    [TopicPartition(self.topic, p, since_ms)], timeout=10
                )[0]
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
