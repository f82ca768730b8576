"""Writing a batch of records with its input offsets: one transaction (EOS v2) or, for
brokers without transactions, an idempotent producer followed by an offset commit.

librdkafka's error classes decide what happens next: retriable errors are retried here,
``txn_requires_abort`` aborts and raises ``TransactionAborted`` (the caller rebuilds the
affected turns from the journal), fatal errors raise ``ProducerFenced`` (the caller drops
its partitions, recreates the producer and rejoins).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from pyrula_stream.kafka.config import (
    authorization_error,
    client_config,
    is_authorization_failure,
    new_producer,
)
from pyrula_stream.kafka.partitioner import PARTITIONER
from pyrula_stream.records import OutRecord

log = logging.getLogger(__name__)

Offsets = dict[tuple[str, int], int]


class TransactionAborted(Exception):
    """The batch was aborted; none of its records or offsets are visible."""


class ProducerFenced(Exception):
    """A newer producer with our transactional id, or a newer group generation, took over."""


def _kafka_error(exc: KafkaException) -> KafkaError | None:
    err = exc.args[0] if exc.args else None
    return err if isinstance(err, KafkaError) else None


class BatchWriter:
    """The worker's only producer. ``exactly_once`` selects transactions (EOS v2).

    A transaction here never spans a model or tool call, so it lasts milliseconds; the
    10 s ``transaction.timeout.ms`` (Kafka Streams' choice too) bounds how long a worker
    that died and is not restarted can hold back ``read_committed`` readers of its topics.
    """

    def __init__(
        self,
        bootstrap_servers: str,
        *,
        transactional_id: str,
        exactly_once: bool = True,
        transaction_timeout_ms: int = 10_000,
        extra: Mapping[str, Any] | None = None,
        kafka_config: Mapping[str, Any] | None = None,
    ) -> None:
        self.exactly_once = exactly_once
        conf = client_config(
            bootstrap_servers,
            kafka_config,
            **{
                "enable.idempotence": True,
                "linger.ms": 1,
                "acks": "all",
                "message.max.bytes": 1_048_576,
                "compression.type": "lz4",
                "partitioner": PARTITIONER,
            },
        )
        if exactly_once:
            conf["transactional.id"] = transactional_id
            conf["transaction.timeout.ms"] = transaction_timeout_ms
        conf.update(extra or {})
        self._conf = conf
        self._producer = new_producer(conf)
        self._delivery_errors: list[str] = []

    def start(self, timeout_s: float = 60.0) -> None:
        """Fence any previous producer of our transactional id and abort its open txn."""
        if self.exactly_once:
            try:
                self._producer.init_transactions(timeout_s)
            except KafkaException as exc:
                err = _kafka_error(exc)
                if err is not None and is_authorization_failure(err):
                    tid = self._conf.get("transactional.id")
                    raise authorization_error(
                        self._conf, "WRITE", f"transactional id {tid}", err
                    ) from None
                raise

    def write(
        self,
        records: Sequence[OutRecord],
        offsets: Offsets,
        consumer: Consumer,
        group_metadata: Any,
    ) -> None:
        """Make ``records`` and ``offsets`` durable together (blocking; run in a thread).

        ``group_metadata`` is the consumer's, read on the polling thread: it carries the
        group generation that fences a worker which lost its partitions.
        """
        if self.exactly_once:
            self._write_transaction(records, offsets, group_metadata)
        else:
            self._write_then_commit(records, offsets, consumer)

    def _produce_all(self, records: Sequence[OutRecord]) -> None:
        for rec in records:
            kwargs: dict[str, Any] = {"key": rec.key, "value": rec.value, "headers": rec.headers}
            if rec.partition is not None:
                kwargs["partition"] = rec.partition
            while True:
                try:
                    self._producer.produce(rec.topic, on_delivery=self._on_delivery, **kwargs)
                    break
                except BufferError:
                    self._producer.poll(0.05)

    def _on_delivery(self, err: KafkaError | None, msg: Any) -> None:
        if err is not None:
            self._delivery_errors.append(f"{msg.topic()}: {err.str()}")

    def _write_transaction(
        self, records: Sequence[OutRecord], offsets: Offsets, group_metadata: Any
    ) -> None:
        try:
            self._producer.begin_transaction()
            self._produce_all(records)
            if offsets:
                self._producer.send_offsets_to_transaction(
                    [TopicPartition(t, p, o) for (t, p), o in offsets.items()],
                    group_metadata,
                )
            self._commit_with_retry()
        except KafkaException as exc:
            self._handle(exc)

    def _commit_with_retry(self) -> None:
        for attempt in range(10):
            try:
                self._producer.commit_transaction(30)
                return
            except KafkaException as exc:
                err = _kafka_error(exc)
                if err is not None and err.retriable() and not err.txn_requires_abort():
                    time.sleep(min(1.0, 0.05 * 2**attempt))
                    continue
                raise

    def _handle(self, exc: KafkaException) -> None:
        err = _kafka_error(exc)
        if err is not None and err.txn_requires_abort():
            log.warning("transaction must abort (%s); rebuilding affected turns", err.str())
            try:
                self._producer.abort_transaction(30)
            except KafkaException as abort_exc:
                raise ProducerFenced(f"abort failed: {abort_exc}") from exc
            raise TransactionAborted(err.str()) from exc
        if err is not None and (
            err.fatal()
            or err.code()
            in (KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH)
        ):
            raise ProducerFenced(err.str()) from exc
        raise ProducerFenced(f"unexpected transactional error: {exc}") from exc

    def _write_then_commit(
        self, records: Sequence[OutRecord], offsets: Offsets, consumer: Consumer
    ) -> None:
        self._delivery_errors.clear()
        self._produce_all(records)
        remaining = self._producer.flush(60)
        if remaining or self._delivery_errors:
            raise TransactionAborted(
                f"{remaining} records undelivered; errors: {self._delivery_errors[:3]}"
            )
        if offsets:
            try:
                consumer.commit(
                    offsets=[TopicPartition(t, p, o) for (t, p), o in offsets.items()],
                    asynchronous=False,
                )
            except KafkaException as exc:
                raise TransactionAborted(f"offset commit failed: {exc}") from exc

    def close(self) -> None:
        self._producer.flush(10)
