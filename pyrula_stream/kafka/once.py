"""Operator writes done once: a raw read of a small topic, and a transactional write
under a fixed transactional id.

A command that must not repeat itself (``pyrula-stream dlq redrive``) starts
``OnceWriter`` first: ``init_transactions`` fences any earlier run of the same id and
aborts whatever it left open, so what the command then reads (``read_raw``,
``read_committed``) is every write that will ever count. It checks that, and writes
its records and the note that they were written in one transaction: a crash between
the two cannot leave one without the other, and a second run that overlaps the first
fences it.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message, TopicPartition

from pyrula_stream.errors import PyrulaError, UnknownTopicError
from pyrula_stream.kafka.config import (
    authorization_error,
    is_authorization_failure,
    new_consumer,
    new_producer,
    producer_config,
    reader_config,
)
from pyrula_stream.kafka.consumers import raise_if_denied
from pyrula_stream.kafka.offsets import CatchUp, kafka_error, next_batch, partitions_of
from pyrula_stream.wire.records import OutRecord

UNASSIGNED_PARTITION = -1
CALL_TIMEOUT_S = 30.0


class WriteNotDone(PyrulaError):
    """The transaction was aborted or fenced: nothing of it is visible; run again."""

    retriable = True


@dataclass(frozen=True, slots=True)
class RawRecord:
    """One committed record with its headers as bytes, in order (what a copy needs)."""

    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...] = field(repr=False)
    """Never in a repr or a log line: a producer may put a credential there."""
    ts_ms: int = 0


def read_raw(
    bootstrap_servers: str,
    topic: str,
    *,
    timeout_s: float = 30.0,
    kafka_config: Mapping[str, Any] | None = None,
    group_id: str | None = None,
) -> list[RawRecord]:
    """Every committed record of ``topic`` now, headers untouched (a small topic: the
    DLQ, a command's notes); ``UnknownTopicError`` when there is no such topic."""
    conf = reader_config(
        bootstrap_servers, kafka_config=kafka_config, client_id="pyrula-once", group_id=group_id
    )
    consumer = new_consumer(conf)
    out: list[RawRecord] = []
    try:
        try:
            parts = partitions_of(consumer, topic, timeout_s=timeout_s)
        except KafkaException as exc:
            err = kafka_error(exc)
            if err is not None:
                raise_if_denied(conf, err, topic)
                if err.code() in (KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC):
                    raise UnknownTopicError(f"no topic {topic}", topic=topic) from None
            raise
        catch_up = CatchUp.measure(consumer, topic, parts, timeout_s=timeout_s)
        if catch_up.done:
            return out
        consumer.assign([TopicPartition(topic, p, -2) for p in parts])  # -2: the beginning
        deadline = time.monotonic() + timeout_s
        while not catch_up.done:
            for msg in next_batch(consumer):
                err = msg.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        catch_up.reached_eof(msg.partition() or 0)
                    elif not err.retriable():
                        raise_if_denied(conf, err, topic)
                        raise KafkaException(err)
                    continue
                out.append(
                    RawRecord(
                        msg.partition() or 0,
                        msg.offset() or 0,
                        msg.key(),
                        msg.value(),
                        tuple((k, v or b"") for k, v in (msg.headers() or [])),
                        int(msg.timestamp()[1]),
                    )
                )
            if catch_up.check(consumer):
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"reading {topic} took over {timeout_s:g}s")
    finally:
        consumer.close()
    return out


class OnceWriter:
    """A transactional producer under one fixed id, for a command's few records."""

    def __init__(
        self,
        bootstrap_servers: str,
        transactional_id: str,
        *,
        kafka_config: Mapping[str, Any] | None = None,
    ) -> None:
        self._conf = producer_config(
            bootstrap_servers, kafka_config, transactional_id=transactional_id
        )
        self._producer = new_producer(self._conf)

    def start(self, timeout_s: float = CALL_TIMEOUT_S) -> None:
        """Fence earlier writers of this id and abort what they left open."""
        try:
            self._producer.init_transactions(timeout_s)
        except KafkaException as exc:
            self._raise(exc, "start")

    def write(self, records: Sequence[OutRecord]) -> None:
        """All of ``records`` or none of them (``WriteNotDone``). The commit flushes and
        fails when any record failed, so no delivery report is needed."""
        denied: dict[str, KafkaError] = {}

        def on_delivery(err: KafkaError | None, msg: Message) -> None:
            if err is not None and err.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED:
                denied.setdefault(str(msg.topic()), err)

        try:
            self._producer.begin_transaction()
            for rec in records:
                partition = UNASSIGNED_PARTITION if rec.partition is None else rec.partition
                self._producer.produce(
                    rec.topic,
                    rec.value,
                    rec.key,
                    partition,
                    headers=rec.headers,  # type: ignore[arg-type]  # list is invariant
                    on_delivery=on_delivery,
                )
            self._producer.commit_transaction(CALL_TIMEOUT_S)
        except KafkaException as exc:
            self._producer.poll(0)  # serves the delivery reports that say which topic
            self._raise(exc, "write", denied)

    def _raise(
        self, exc: KafkaException, what: str, denied: Mapping[str, KafkaError] | None = None
    ) -> None:
        err = kafka_error(exc)
        if denied:  # a topic the principal may not write: the transaction is aborted below
            topic, cause = sorted(denied.items())[0]
            with contextlib.suppress(KafkaException):
                self._producer.abort_transaction(CALL_TIMEOUT_S)
            raise authorization_error(
                self._conf, "WRITE", f"topic {topic} (nothing was written)", cause
            ) from None
        if err is not None and is_authorization_failure(err):
            tid = self._conf.get("transactional.id")
            raise authorization_error(self._conf, "WRITE", f"transactional id {tid}", err) from None
        if what == "write" and err is not None and err.txn_requires_abort():
            with contextlib.suppress(KafkaException):
                self._producer.abort_transaction(CALL_TIMEOUT_S)
        reason = err.str() if err is not None else str(exc)
        raise WriteNotDone(
            f"nothing written ({what}: {reason}); another run of the same command may have "
            "taken over: run it again to see what it did"
        ) from None

    def close(self) -> None:
        self._producer.flush(5)
