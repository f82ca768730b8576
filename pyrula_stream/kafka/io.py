"""Plain producing and reading for clients: submit records, read a partition from a time,
follow whole topics (the web UI's one shared consumer), read one key's records.

Producing and reading a partition answer within a timeout with one of our errors:
``UnknownTopicError`` for a topic that does not exist (asked up front, instead of
librdkafka's 30 s wait for it to appear) and ``BrokerUnavailableError`` when no broker
answers.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterator, Mapping
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

from pyrula_stream.errors import (
    BrokerUnavailableError,
    KafkaAuthenticationError,
    UnknownTopicError,
)
from pyrula_stream.kafka.admin import cluster_metadata
from pyrula_stream.kafka.config import (
    authorization_error,
    is_authorization_failure,
    new_consumer,
    new_producer,
    producer_config,
    reader_config,
)
from pyrula_stream.kafka.connection_log import unreachable_reason
from pyrula_stream.kafka.consumers import raise_if_denied
from pyrula_stream.kafka.offsets import kafka_error, offset_at, watermarks
from pyrula_stream.kafka.partitioner import partition_for
from pyrula_stream.wire.serde import headers_dict


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
    err = kafka_error(exc)
    return err is not None and err.code() in (
        KafkaError._TRANSPORT,
        KafkaError._TIMED_OUT,
        KafkaError._ALL_BROKERS_DOWN,
        KafkaError._RESOLVE,
    )


def _topic_partitions(
    client: Producer | Consumer,
    bootstrap: str,
    topic: str,
    timeout_s: float,
    denied: Callable[[KafkaError], None],
) -> int:
    """How many partitions ``topic`` has; ``UnknownTopicError`` when it has none.

    ``denied`` raises the authorization error for a topic the ACLs hide or refuse (a hidden
    topic would otherwise look missing)."""
    assignment = getattr(client, "assignment", None)  # a consumer's
    serve_errors = assignment is None or not assignment()
    try:
        md = cluster_metadata(client, timeout_s, topic, serve_errors=serve_errors)
    except KafkaException as exc:
        if _is_transport(exc):
            if serve_errors:
                client.poll(0)  # serves the queued error callbacks that say why
            raise broker_unavailable(bootstrap, timeout_s, f"read metadata of {topic}") from None
        raise
    found = md.topics.get(topic)
    if found is not None and found.error is not None and is_authorization_failure(found.error):
        denied(found.error)
    if found is None or found.error is not None or not found.partitions:
        raise UnknownTopicError(f"no topic {topic}", topic=topic)
    return len(found.partitions)


class RecordProducer:
    """An idempotent producer whose ``send`` returns once the broker acknowledged.

    ``timeout_s`` bounds each send, including the first look at a topic's metadata.
    ``kafka_config`` is the user's client settings (security, ``client.id``, ...).
    """

    def __init__(
        self,
        bootstrap_servers: str,
        *,
        timeout_s: float = 30.0,
        kafka_config: Mapping[str, Any] | None = None,
        **extra: Any,
    ) -> None:
        self.bootstrap_servers = bootstrap_servers
        self.timeout_s = timeout_s
        self._known_topics: set[str] = set()
        self._conf = producer_config(bootstrap_servers, kafka_config, **extra)
        self._producer = new_producer(self._conf)

    def _denied(self, topic: str, err: KafkaError) -> None:
        raise authorization_error(self._conf, "WRITE", f"topic {topic}", err)

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
            _topic_partitions(
                self._producer,
                self.bootstrap_servers,
                topic,
                timeout_s,
                lambda err: self._denied(topic, err),
            )
            self._known_topics.add(topic)
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
            # Not sent yet: take it back, so a send reported as failed does not land later.
            self._producer.purge(in_queue=True, in_flight=False)
            self._producer.poll(0)
            raise broker_unavailable(self.bootstrap_servers, timeout_s, f"write to {topic}")
        if isinstance(result[0], KafkaError):
            if is_authorization_failure(result[0]):
                raise authorization_error(self._conf, "WRITE", f"topic {topic}", result[0])
            if result[0].code() in (KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC):
                self._known_topics.discard(topic)
                raise UnknownTopicError(f"no topic {topic}", topic=topic)
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
        """Flush; a refused login or a fatal error (e.g. no right to an idempotent producer
        id) was already raised by the ``send`` it failed, and every send waited for its
        acknowledgement, so closing has nothing left to lose."""
        with contextlib.suppress(KafkaAuthenticationError, KafkaException):
            self._producer.flush(10)


class PartitionReader:
    """Reads committed records of the partition that holds ``key``, from a timestamp."""

    def __init__(
        self,
        bootstrap_servers: str,
        topic: str,
        *,
        client_id: str,
        timeout_s: float = 10.0,
        kafka_config: Mapping[str, Any] | None = None,
        group_id: str | None = None,
    ) -> None:
        self.topic = topic
        self.bootstrap_servers = bootstrap_servers
        self.timeout_s = timeout_s
        self._conf = reader_config(
            bootstrap_servers, kafka_config=kafka_config, client_id=client_id, group_id=group_id
        )
        self._consumer: Consumer = new_consumer(self._conf)

    def partitions(self) -> int:
        return _topic_partitions(
            self._consumer,
            self.bootstrap_servers,
            self.topic,
            self.timeout_s,
            lambda err: raise_if_denied(self._conf, err, self.topic),
        )

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
        try:
            return offset_at(
                self._consumer, self.topic, partition, since_ms, timeout_s=self.timeout_s
            )
        except KafkaException as exc:
            if _is_transport(exc):
                raise broker_unavailable(
                    self.bootstrap_servers, self.timeout_s, f"read {self.topic}"
                ) from None
            err = kafka_error(exc)
            if err is not None:
                raise_if_denied(self._conf, err, self.topic)
            raise

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


@dataclass(frozen=True, slots=True)
class TopicRecord:
    """One committed record of a followed topic."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: dict[str, str]
    ts_ms: int


class TopicFollower:
    """One ``read_committed`` consumer following every partition of a growing set of topics.

    Topics are added while it runs (an agent's topics may be created after the follower
    starts); each starts at the first record at or after ``since_ms`` (``None``: from
    the beginning). Not thread-safe: one thread calls ``follow``/``poll`` at a time.
    """

    def __init__(
        self,
        bootstrap_servers: str,
        *,
        client_id: str,
        kafka_config: Mapping[str, Any] | None = None,
        group_id: str | None = None,
    ) -> None:
        self.bootstrap_servers = bootstrap_servers
        self._conf = reader_config(
            bootstrap_servers, kafka_config=kafka_config, client_id=client_id, group_id=group_id
        )
        self._consumer: Consumer = new_consumer(self._conf)
        self.followed: set[str] = set()

    def topic_names(self) -> set[str]:
        """Every topic the cluster has now."""
        return set(self._consumer.list_topics(timeout=10).topics)

    def follow(
        self,
        topics: list[str],
        since_ms: int | None,
        resume: Mapping[tuple[str, int], int] | None = None,
    ) -> list[str]:
        """Start reading the topics not yet followed that exist; return those added.

        A partition in ``resume`` starts at that offset (where an earlier follower stopped).
        """
        metadata = self._consumer.list_topics(timeout=10).topics
        added: list[str] = []
        start: list[TopicPartition] = []
        for name in topics:
            md = metadata.get(name)
            if name in self.followed or md is None or md.error is not None or not md.partitions:
                continue
            partitions = sorted(md.partitions)
            if since_ms is None:
                start += [TopicPartition(name, p, OFFSET_BEGINNING) for p in partitions]
            else:
                start += [
                    TopicPartition(
                        name, p, offset_at(self._consumer, name, p, since_ms, timeout_s=10.0)
                    )
                    for p in partitions
                ]
            if resume:
                start = [
                    TopicPartition(tp.topic, tp.partition, resume[(tp.topic, tp.partition)])
                    if (tp.topic, tp.partition) in resume
                    else tp
                    for tp in start
                ]
            self.followed.add(name)
            added.append(name)
        if start:
            self._consumer.incremental_assign(start)
        return added

    def poll(self, timeout_s: float) -> list[TopicRecord]:
        """What is buffered now, else what arrives within ``timeout_s``."""
        first = self._consumer.poll(timeout_s)  # with nothing assigned yet it just waits
        batch = [] if first is None else [first, *self._consumer.consume(999, 0)]
        out: list[TopicRecord] = []
        for msg in batch:
            err = msg.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF or err.retriable():
                    continue
                raise KafkaException(err)
            out.append(_topic_record(msg))
        return out

    def close(self) -> None:
        self._consumer.close()


def _topic_record(msg: Any) -> TopicRecord:
    key = msg.key()
    return TopicRecord(
        msg.topic() or "",
        msg.partition() or 0,
        msg.offset() or 0,
        key.encode() if isinstance(key, str) else key,
        msg.value(),
        headers_dict(msg.headers()),
        int(msg.timestamp()[1]),
    )


class PartitionFollower(TopicFollower):
    """A ``TopicFollower`` that reads single partitions, each from an offset it is told,
    and can move one back (a client's one event consumer serving many streams)."""

    def partition_count(self, topic: str) -> int:
        """``UnknownTopicError`` for a topic that does not exist (asked once, at once)."""
        return _topic_partitions(
            self._consumer,
            self.bootstrap_servers,
            topic,
            10.0,
            lambda err: raise_if_denied(self._conf, err, topic),
        )

    def start_offset(self, topic: str, partition: int, since_ms: int | None) -> int:
        """The first offset at or after ``since_ms`` (the log start without it)."""
        if since_ms is None:
            return watermarks(self._consumer, topic, partition, timeout_s=10.0)[0]
        return offset_at(self._consumer, topic, partition, since_ms, timeout_s=10.0)

    def end_offset(self, topic: str, partition: int) -> int:
        """Where the next committed record of the partition will be (its last stable
        offset under ``read_committed``)."""
        return watermarks(self._consumer, topic, partition, timeout_s=10.0)[1]

    def reassign(
        self, added: list[tuple[str, int, int]], released: list[tuple[str, int]]
    ) -> set[tuple[str, int]] | None:
        """Start reading ``(topic, partition, offset)`` and stop reading ``released``
        (called between polls, by the polling thread: the consumer serves one call at a
        time); the partitions read now, when that changed."""
        if released:
            self._consumer.incremental_unassign([TopicPartition(t, p) for t, p in released])
        if added:
            self._consumer.incremental_assign([TopicPartition(t, p, o) for t, p, o in added])
        if not added and not released:
            return None
        return {(tp.topic, tp.partition) for tp in self._consumer.assignment()}

    def read_chunk(
        self,
        topic: str,
        partition: int,
        start: int | None,
        end: int,
        keys: frozenset[bytes],
        *,
        since_ms: int | None,
        look_up: bool,
        limit: int,
        timeout_s: float,
    ) -> tuple[list[TopicRecord], int]:
        """The committed records of ``keys`` from ``start`` up to ``end``, at most
        ``limit`` of them, and the offset the next chunk starts at (``end`` once it is
        reached). With ``look_up`` it starts no later than the first record at or after
        ``since_ms`` (the log start when that is ``None``)."""
        if look_up:
            found = self.start_offset(topic, partition, since_ms)
            start = found if start is None else min(start, found)
        if start is None or start >= end:
            return [], end
        self._consumer.assign([TopicPartition(topic, partition, start)])
        out: list[TopicRecord] = []
        deadline = time.monotonic() + timeout_s
        while True:
            if time.monotonic() > deadline:
                raise TimeoutError(f"reading {topic}[{partition}] {start}..{end} took too long")
            msg = self._consumer.poll(0.2)
            if msg is None:
                continue
            err = msg.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    return out, end
                if err.retriable():
                    continue
                raise KafkaException(err)
            offset = msg.offset() or 0
            if offset >= end:
                return out, end
            key = msg.key()
            if (key.encode() if isinstance(key, str) else key) in keys:
                out.append(_topic_record(msg))
                if len(out) >= limit:
                    return out, offset + 1
