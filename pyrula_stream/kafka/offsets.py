"""Where a partition ends and reading up to it: the one read-to-end of the package.

Every reader that must hold a topic's whole committed content before it acts (journal
restore, tables, ``read_topic`` for tests and the chaos verifier) goes through
``read_to_end``. It reads under ``read_committed`` to the last stable offset, and catch-up
is ``position >= end`` (or the partition-EOF event), never ``==``: transaction markers
occupy offsets, so the position can pass the last data record (quix #1017 hung on ``==``).

``kafka_error`` is the one unwrap of a ``KafkaException``'s ``KafkaError``; ``watermarks``
the one end-offset query and ``offset_at`` the one offset-by-time query, both retrying the
errors of a topic created a moment ago or a leader elected a moment ago.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, TopicPartition

from pyrula_stream.wire.serde import headers_dict

__all__ = [
    "CatchUp",
    "ConsumedRecord",
    "committed_offset",
    "kafka_error",
    "next_batch",
    "offset_at",
    "partitions_of",
    "read_to_end",
    "to_record",
    "transient",
    "watermarks",
]

_LEADERSHIP_MOVING = frozenset(
    {
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.UNKNOWN_TOPIC_OR_PART,
        KafkaError._TIMED_OUT,
        # A new leader whose high watermark is not caught up yet (just after a broker
        # restart); Kafka's protocol marks it retriable, librdkafka's flag does not.
        KafkaError.OFFSET_NOT_AVAILABLE,
        # A group's coordinator being found or loading (a group nobody has used yet).
        KafkaError.NOT_COORDINATOR,
        KafkaError.COORDINATOR_NOT_AVAILABLE,
        KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
    }
)


def kafka_error(exc: BaseException) -> KafkaError | None:
    """The ``KafkaError`` a ``KafkaException`` carries, if it carries one."""
    err = exc.args[0] if isinstance(exc, KafkaException) and exc.args else None
    return err if isinstance(err, KafkaError) else None


def transient(exc: BaseException) -> bool:
    """Worth retrying: retriable, or a topic whose leaders are still being elected."""
    err = kafka_error(exc)
    return err is not None and (err.retriable() or err.code() in _LEADERSHIP_MOVING)


@dataclass(frozen=True, slots=True)
class ConsumedRecord:
    """One committed record, with where and when it was written."""

    partition: int
    offset: int
    key: str
    value: bytes | None
    headers: dict[str, str]
    ts_ms: int
    topic: str = ""
    """The topic it was read from (set by ``to_record``; a reader of one topic ignores it)."""


def _retrying(deadline: float, call: Any) -> Any:
    while True:
        try:
            return call()
        except KafkaException as exc:
            if not transient(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def partitions_of(consumer: Consumer, topic: str, *, timeout_s: float = 30.0) -> list[int]:
    """The topic's partition numbers; ``KafkaException`` when the topic does not exist."""

    def ask() -> list[int]:
        meta = consumer.list_topics(topic, timeout=min(timeout_s, 10.0)).topics.get(topic)
        if meta is None or meta.error is not None:
            raise KafkaException(
                meta.error if meta is not None else KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART)
            )
        return sorted(meta.partitions)

    result: list[int] = _retrying(time.monotonic() + timeout_s, ask)
    return result


def watermarks(
    consumer: Consumer, topic: str, partition: int, *, timeout_s: float = 30.0
) -> tuple[int, int]:
    """Low and high offsets; under ``read_committed`` the high one is the last stable offset."""
    tp = TopicPartition(topic, partition)

    def ask() -> tuple[int, int]:
        low, high = consumer.get_watermark_offsets(tp, timeout=min(timeout_s, 10.0), cached=False)
        return int(low), int(high)

    result: tuple[int, int] = _retrying(time.monotonic() + timeout_s, ask)
    return result


def offset_at(
    consumer: Consumer, topic: str, partition: int, since_ms: int, *, timeout_s: float = 30.0
) -> int:
    """The first offset whose record is at or after ``since_ms``, else the end.

    The end is read first: a record written after it has a later timestamp, so when no
    record is as new as ``since_ms``, starting at that end misses nothing.
    """
    _, end = watermarks(consumer, topic, partition, timeout_s=timeout_s)

    def ask() -> int:
        (found,) = consumer.offsets_for_times(
            [TopicPartition(topic, partition, since_ms)], timeout=min(timeout_s, 10.0)
        )
        return int(found.offset) if found.offset >= 0 else end

    result: int = _retrying(time.monotonic() + timeout_s, ask)
    return result


def committed_offset(
    consumer: Consumer, topic: str, partition: int, *, timeout_s: float = 30.0
) -> int | None:
    """The group's committed offset of one partition (the consumer's group), if any."""

    def ask() -> int | None:
        (tp,) = consumer.committed([TopicPartition(topic, partition)], timeout=timeout_s)
        return int(tp.offset) if tp.offset >= 0 else None

    result: int | None = _retrying(time.monotonic() + timeout_s, ask)
    return result


class CatchUp:
    """Which partitions are still short of the end they had when reading began."""

    def __init__(self, topic: str, ends: dict[int, int]) -> None:
        self.topic = topic
        self.remaining = dict(ends)

    @classmethod
    def measure(
        cls, consumer: Consumer, topic: str, partitions: Iterable[int], *, timeout_s: float
    ) -> CatchUp:
        """Record each partition's end now; empty partitions are caught up already."""
        ends: dict[int, int] = {}
        for p in partitions:
            low, high = watermarks(consumer, topic, p, timeout_s=timeout_s)
            if high > low:
                ends[p] = high
        return cls(topic, ends)

    @property
    def done(self) -> bool:
        return not self.remaining

    def reached_eof(self, partition: int) -> None:
        self.remaining.pop(partition, None)

    def check(self, consumer: Consumer) -> bool:
        """Drop partitions whose position is ``>=`` their end; True when none are left."""
        if self.remaining:
            tps = [TopicPartition(self.topic, p) for p in self.remaining]
            for tp in consumer.position(tps):
                end = self.remaining.get(tp.partition)
                if end is not None and tp.offset >= end:
                    del self.remaining[tp.partition]
        return not self.remaining

    def describe(self) -> str:
        return ", ".join(f"partition {p} end {end}" for p, end in sorted(self.remaining.items()))


def next_batch(consumer: Consumer, wait_s: float = 0.2) -> list[Any]:
    """What is buffered now, else the first record within ``wait_s`` (never a full wait).

    ``consume(n, timeout)`` alone waits for n records or the whole timeout.
    """
    batch = consumer.consume(1000, 0)
    if batch:
        return list(batch)
    first = consumer.poll(wait_s)
    return [] if first is None else [first]


def to_record(msg: Any) -> ConsumedRecord:
    """A consumed message as our record type (the one place a raw message is unpacked)."""
    key = msg.key()
    return ConsumedRecord(
        msg.partition() or 0,
        msg.offset() or 0,
        key.decode("utf-8", "replace") if isinstance(key, bytes) else (key or ""),
        msg.value(),
        headers_dict(msg.headers()),
        int(msg.timestamp()[1]),
        msg.topic() or "",
    )


def read_to_end(
    consumer: Consumer,
    topic: str,
    partitions: Iterable[int] | None = None,
    *,
    timeout_s: float = 120.0,
    keep_assigned: bool = False,
    start: dict[int, int] | None = None,
) -> Iterator[ConsumedRecord]:
    """Yield every committed record of ``partitions`` (all: ``None``), from the first
    (or from the offset ``start`` gives a partition).

    Ends when each partition's position reached the end it had when reading began.
    ``keep_assigned`` leaves the partitions assigned at that position, for a reader that
    goes on following them live; otherwise they are unassigned. ``TimeoutError`` names
    the partitions still short of their end after ``timeout_s``.
    """
    deadline = time.monotonic() + timeout_s
    parts = (
        sorted(partitions)
        if partitions is not None
        else partitions_of(consumer, topic, timeout_s=timeout_s)
    )
    catch_up = CatchUp.measure(consumer, topic, parts, timeout_s=timeout_s)
    if catch_up.done and not keep_assigned:
        return
    begin = start or {}
    consumer.assign([TopicPartition(topic, p, begin.get(p, OFFSET_BEGINNING)) for p in parts])
    finished = False
    try:
        while not catch_up.done:
            for msg in next_batch(consumer):
                err = msg.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        catch_up.reached_eof(msg.partition() or 0)
                        continue
                    if err.retriable():
                        continue
                    raise KafkaException(err)
                yield to_record(msg)
            if catch_up.check(consumer):
                break
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"reading {topic} to its end took over {timeout_s:g}s "
                    f"(still reading: {catch_up.describe()})"
                )
        finished = True
    finally:
        if not (keep_assigned and finished):
            consumer.unassign()
