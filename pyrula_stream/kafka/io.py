"""Plain producing and reading for clients: submit records, read a partition from a time."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
    TopicPartition,
)

from pyrula_stream.errors import KafkaAuthenticationError
from pyrula_stream.kafka.config import (
    authorization_error,
    client_config,
    is_authorization_failure,
    new_consumer,
    new_producer,
)
from pyrula_stream.kafka.consumers import raise_if_denied, reader_config
from pyrula_stream.kafka.partitioner import PARTITIONER, partition_for
from pyrula_stream.serde import headers_dict


@dataclass(frozen=True)
class Delivered:
    topic: str
    partition: int
    offset: int


class RecordProducer:
    """An idempotent producer whose ``send`` returns once the broker acknowledged."""

    def __init__(
        self,
        bootstrap_servers: str,
        *,
        kafka_config: Mapping[str, Any] | None = None,
        **extra: Any,
    ) -> None:
        self._conf = client_config(
            bootstrap_servers,
            kafka_config,
            **{
                "enable.idempotence": True,
                "acks": "all",
                "linger.ms": 1,
                "partitioner": PARTITIONER,
            },
            **extra,
        )
        self._producer = new_producer(self._conf)

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

        try:
            self._producer.produce(
                topic, key=key, value=value, headers=headers or [], on_delivery=on_delivery
            )
        except KafkaException as exc:  # a topic already known to be denied fails at once
            result.append(exc.args[0] if exc.args else exc)
        else:
            deadline = time.monotonic() + timeout_s
            try:  # short polls: refused credentials surface from the error callback at once
                while not result and time.monotonic() < deadline:
                    self._producer.poll(0.05)
            except KafkaAuthenticationError:
                self._producer.purge()  # never delivered later: the caller has its error
                raise
        if not result:
            raise TimeoutError(f"no acknowledgement from {topic} within {timeout_s}s")
        if isinstance(result[0], KafkaError):
            if is_authorization_failure(result[0]):
                raise authorization_error(self._conf, "WRITE", f"topic {topic}", result[0])
            raise KafkaException(result[0])
        if isinstance(result[0], Exception):
            raise result[0]
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
        with contextlib.suppress(KafkaAuthenticationError):  # already raised by send
            self._producer.flush(10)


class PartitionReader:
    """Reads committed records of the partition that holds ``key``, from a timestamp."""

    def __init__(
        self,
        bootstrap_servers: str,
        topic: str,
        *,
        client_id: str,
        kafka_config: Mapping[str, Any] | None = None,
        group_id: str | None = None,
    ) -> None:
        self.topic = topic
        self._conf = reader_config(
            bootstrap_servers, client_id=client_id, kafka_config=kafka_config, group_id=group_id
        )
        self._consumer: Consumer = new_consumer(self._conf)

    def partitions(self) -> int:
        md = self._consumer.list_topics(self.topic, timeout=10)
        topic = md.topics.get(self.topic)
        if topic is not None and topic.error is not None:
            raise_if_denied(self._conf, topic.error, self.topic)
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
                offset = self._offset_at(p, since_ms)
            start.append(TopicPartition(self.topic, p, offset))
        self._consumer.assign(start)

    def _offset_at(self, partition: int, since_ms: int) -> int:
        # The end is read first: a record written after it has a later timestamp,
        # so when no record is as new as since_ms, starting there misses nothing.
        try:
            _, end = self._consumer.get_watermark_offsets(
                TopicPartition(self.topic, partition), timeout=10, cached=False
            )
            found = self._consumer.offsets_for_times(
                [TopicPartition(self.topic, partition, since_ms)], timeout=10
            )[0]
        except KafkaException as exc:
            if exc.args and isinstance(exc.args[0], KafkaError):
                raise_if_denied(self._conf, exc.args[0], self.topic)
            raise
        return int(found.offset) if found.offset >= 0 else int(end)

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
                raise_if_denied(self._conf, err, self.topic)
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
