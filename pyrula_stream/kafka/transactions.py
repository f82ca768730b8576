"""Writing a batch of records with its input offsets: one transaction (EOS v2) or, for
brokers without transactions, an idempotent producer followed by an offset commit.

librdkafka's error classes decide what happens next: retriable errors are retried here,
``txn_requires_abort`` aborts and raises ``TransactionAborted`` (the caller rebuilds the
affected turns from the journal), fatal errors raise ``ProducerFenced`` (the caller drops
its partitions, recreates the producer and rejoins). An abort names every record whose
delivery failed (``FailedDelivery``) and, after one, replaces the producer in place: its
sequence state is spent. Every blocking transactional call has a deadline that holds and
ends early once an outage that stalled it is over (``kafka/deadline.py``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from pyrula_stream.kafka.admin import broker_answers, unwritable_topics
from pyrula_stream.kafka.config import (
    authorization_error,
    is_authorization_failure,
    new_producer,
    principal,
    producer_config,
)
from pyrula_stream.kafka.deadline import CallAbandoned, call_with_deadline
from pyrula_stream.kafka.offsets import kafka_error
from pyrula_stream.wire.fitting import record_room
from pyrula_stream.wire.records import OutRecord

log = logging.getLogger(__name__)

UNASSIGNED_PARTITION = -1
"""librdkafka's ``RD_KAFKA_PARTITION_UA``: the configured partitioner picks one."""

Offsets = dict[tuple[str, int], int]

TRANSACTION_CALL_TIMEOUT_S = 15.0
"""Bound on each blocking transactional call (offsets, commit, abort); longer than the
10 s transaction timeout, after which the broker aborts the transaction anyway."""


@dataclass(frozen=True, slots=True)
class FailedDelivery:
    """One record of a batch that the broker did not take, from its delivery report."""

    index: int
    """Its position in the batch written (the committer maps it back to its owner)."""
    topic: str
    partition: int
    code: str
    reason: str
    at_produce: bool = False
    """Refused by ``produce()`` itself (too large, say): every later try fails the same."""
    denied: bool = False
    """The broker denies this principal WRITE on the record's topic
    (``TOPIC_AUTHORIZATION_FAILED``): every later try fails the same."""

    @property
    def final(self) -> bool:
        """Whether every later try of the record would fail alike (charge it at once)."""
        return self.at_produce or self.denied

    def __str__(self) -> str:
        return f"{self.topic} [{self.partition}]: {self.code} ({self.reason})"


class RefusedAtProduce(Exception):
    """``produce()`` refused a record of the batch at once: that record's failure, never a
    fencing (the transaction is aborted and the record charged, as a failed delivery is)."""

    def __init__(self, failure: FailedDelivery) -> None:
        super().__init__(str(failure))
        self.failure = failure


_PRODUCER_STATE = frozenset(
    {
        KafkaError._FATAL,
        KafkaError._STATE,
        KafkaError._FENCED,
        KafkaError.PRODUCER_FENCED,
        KafkaError.INVALID_PRODUCER_EPOCH,
    }
)
"""``produce()`` errors about the producer, not the record: handled as before (fencing)."""


def _producer_state(exc: KafkaException) -> bool:
    err = kafka_error(exc)
    return err is None or err.fatal() or err.code() in _PRODUCER_STATE


def _refused(index: int, rec: OutRecord, exc: KafkaException) -> FailedDelivery:
    """The failure of a record ``produce()`` refused, named by its place in the batch."""
    err = kafka_error(exc)
    return FailedDelivery(
        index,
        rec.topic,
        -1 if rec.partition is None else rec.partition,
        err.name() if err is not None else type(exc).__name__,
        f"{err.str() if err is not None else exc}; key {rec.key[:80]!r}, {rec.size} bytes",
        at_produce=True,
    )


def describe_failures(failed: Sequence[FailedDelivery], limit: int = 5) -> str:
    """``topic [partition]: CODE (reason)`` for the first ``limit`` records, for a log."""
    shown = "; ".join(str(f) for f in failed[:limit])
    more = len(failed) - limit
    return shown + (f"; and {more} more" if more > 0 else "")


def replica_shortfall(client: Any, failed: Sequence[FailedDelivery], timeout_s: float) -> str:
    """Why records time out when brokers are down: the partitions among ``failed`` whose
    in-sync replicas fell below their replicas, from a short metadata request (empty
    when none did, or the cluster did not answer). librdkafka retries a write refused with
    ``NOT_ENOUGH_REPLICAS`` until the record times out, and reports only the timeout."""
    out: list[str] = []
    for topic in sorted({f.topic for f in failed}):
        try:
            meta = client.list_topics(topic, timeout=timeout_s).topics.get(topic)
        except KafkaException:
            return ""
        if meta is None:
            continue
        partitions = sorted({f.partition for f in failed if f.topic == topic})
        for p in partitions:
            part = meta.partitions.get(p)
            if part is not None and len(part.isrs) < len(part.replicas):
                out.append(
                    f"{topic} [{p}] has {len(part.isrs)} of {len(part.replicas)} replicas in sync"
                )
    if not out:
        return ""
    return (
        "; ".join(out) + ": brokers are down, and writes below min.insync.replicas are refused "
        "(NOT_ENOUGH_REPLICAS) until enough of them return"
    )


REPLACE_AFTER = frozenset(
    {
        KafkaError._INCONSISTENT,
        KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER,
        KafkaError.UNKNOWN_PRODUCER_ID,
        KafkaError._MSG_TIMED_OUT,
        KafkaError._TIMED_OUT,
    }
)
"""Abort causes after which the producer is replaced even with no delivery report read."""


WRITER_MESSAGE_MAX_BYTES = 1_048_576
"""The writer's ``message.max.bytes`` unless the user's producer settings say otherwise."""


def writer_record_room(
    kafka_config: Mapping[str, Any] | None, extra: Mapping[str, Any] | None
) -> int:
    """The bytes one record of a worker's writer may take (``fitting.record_room`` of its
    ``message.max.bytes``): what a record built from outside bytes is fitted to."""
    conf = producer_config(
        "", kafka_config, extra=extra, message_max_bytes=WRITER_MESSAGE_MAX_BYTES
    )
    return record_room(int(conf["message.max.bytes"]))


ANSWER_TIMEOUT_S = 2.0
"""How long the metadata request that tells a stalled call from a slow one may take."""


class TransactionAborted(Exception):
    """The batch was aborted; none of its records or offsets are visible.

    ``failed`` names the records whose delivery failed (empty when the abort had another
    cause, such as a broker that did not answer in time).
    """

    def __init__(self, message: str, failed: Sequence[FailedDelivery] = ()) -> None:
        super().__init__(message)
        self.failed = tuple(failed)


class ProducerFenced(Exception):
    """A newer producer with our transactional id, or a newer group generation, took over."""


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
        conf = producer_config(
            bootstrap_servers,
            kafka_config,
            transactional_id=transactional_id if exactly_once else None,
            transaction_timeout_ms=transaction_timeout_ms,
            extra=extra,
            message_max_bytes=WRITER_MESSAGE_MAX_BYTES,
            compression_type="lz4",
            # Only a failed record calls back into Python; a delivered one costs nothing.
            delivery_report_only_error=True,
        )
        self._conf = conf
        self._kafka_config = kafka_config
        self._producer = new_producer(conf)
        self._failed: list[FailedDelivery] = []
        self._sending: Sequence[OutRecord] = ()
        """The records of the batch being written: what a failed report is matched to."""
        self._blamed: set[int] = set()
        self._report = self._on_delivery
        """One callback for every record (bound once): a callback per record per commit,
        each holding its index, was a fifth of the commit thread."""
        self.stuck = False
        """A call into this producer never returned; ``close`` must not wait on it."""

    def start(self, timeout_s: float = 60.0) -> None:
        """Fence any previous producer of our transactional id and abort its open txn."""
        if self.exactly_once:
            try:
                self._producer.init_transactions(timeout_s)
            except KafkaException as exc:
                err = kafka_error(exc)
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
        try:
            if self.exactly_once:
                self._write_transaction(records, offsets, group_metadata)
            else:
                self._write_then_commit(records, offsets, consumer)
        finally:
            self._sending = ()  # a written batch is not held until the next

    def _produce_all(self, records: Sequence[OutRecord]) -> None:
        self._failed.clear()
        self._blamed.clear()
        self._sending = records
        produce, report = self._producer.produce, self._report
        for index, rec in enumerate(records):
            partition = UNASSIGNED_PARTITION if rec.partition is None else rec.partition
            while True:
                try:
                    produce(
                        rec.topic,
                        rec.value,
                        rec.key,
                        partition,
                        on_delivery=report,
                        headers=rec.headers,  # type: ignore[arg-type]  # list is invariant
                    )
                    break
                except BufferError:
                    self._producer.poll(0.05)
                except KafkaException as exc:
                    if _producer_state(exc):
                        raise
                    raise RefusedAtProduce(_refused(index, rec, exc)) from exc

    def _on_delivery(self, err: KafkaError | None, msg: Any) -> None:
        """A failed record's report (``delivery.report.only.error``: no other calls)."""
        if err is not None:
            partition = msg.partition()
            self._failed.append(
                FailedDelivery(
                    self._index_of(msg),
                    str(msg.topic()),
                    -1 if partition is None else int(partition),
                    str(err.name()),
                    str(err.str()),
                    denied=err.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED,
                )
            )

    def _index_of(self, msg: Any) -> int:
        """Which record of the batch a report is about, by topic, key and value (the first
        not matched yet, should two be equal); -1 for none, as a late report of an
        earlier batch would be."""
        topic, key, value = msg.topic(), msg.key(), msg.value()
        for index, rec in enumerate(self._sending):
            if (
                index not in self._blamed
                and rec.topic == topic
                and rec.key == key
                and rec.value == value
            ):
                self._blamed.add(index)
                return index
        return -1

    def _write_transaction(
        self, records: Sequence[OutRecord], offsets: Offsets, group_metadata: Any
    ) -> None:
        try:
            self._producer.begin_transaction()
            self._produce_all(records)
            if offsets:
                self._send_offsets(
                    [TopicPartition(t, p, o) for (t, p), o in offsets.items()], group_metadata
                )
            self._commit_with_retry()
        except RefusedAtProduce as refused:
            self._abort_refused(refused.failure)
        except KafkaException as exc:
            self._handle(exc)

    def _abort_refused(self, failure: FailedDelivery) -> None:
        """Abort the batch of a record ``produce()`` refused, and charge that record. The
        producer's state is sound (the record was never queued): it stays."""
        log.warning("transaction must abort; produce() refused a record: %s", failure)
        producer = self._producer
        try:
            self._bounded(
                lambda: producer.abort_transaction(TRANSACTION_CALL_TIMEOUT_S),
                "abort_transaction",
            )
        except KafkaException as abort_exc:
            raise ProducerFenced(f"abort failed: {abort_exc}") from None
        raise TransactionAborted(f"produce() refused a record: {failure}", [failure])

    def _send_offsets(self, positions: list[TopicPartition], group_metadata: Any) -> None:
        producer = self._producer
        self._bounded(
            lambda: producer.send_offsets_to_transaction(
                positions, group_metadata, TRANSACTION_CALL_TIMEOUT_S
            ),
            "send_offsets_to_transaction",
        )

    def _commit_with_retry(self) -> None:
        """Commit, retrying retriable errors for at most ``TRANSACTION_CALL_TIMEOUT_S``
        (each said in the log); past that the caller aborts and replaces the producer."""
        producer = self._producer
        deadline = time.monotonic() + TRANSACTION_CALL_TIMEOUT_S
        for attempt in range(10):
            try:
                self._bounded(
                    lambda: producer.commit_transaction(TRANSACTION_CALL_TIMEOUT_S),
                    "commit_transaction",
                )
                return
            except KafkaException as exc:
                err = kafka_error(exc)
                if (
                    err is not None
                    and err.retriable()
                    and not err.txn_requires_abort()
                    and time.monotonic() < deadline
                ):
                    log.warning("commit_transaction failed (%s); retrying", err.str())
                    time.sleep(min(1.0, 0.05 * 2**attempt))
                    continue
                raise

    def _bounded(self, call: Callable[[], None], what: str) -> None:
        """A transactional call with a deadline that holds, given up a second after Kafka
        answers again when an outage stalled it (``kafka/deadline.py``). A call given up
        leaves this producer stuck in it: it counts as fenced, and the worker's next
        producer, with the same transactional id, aborts the open transaction.
        """
        try:
            call_with_deadline(
                call, what, timeout_s=TRANSACTION_CALL_TIMEOUT_S + 5, answers=self._answers
            )
        except CallAbandoned as exc:
            self.stuck = True
            raise ProducerFenced(f"{exc}; starting a new producer") from None

    def _answers(self) -> bool:
        return broker_answers(
            str(self._conf["bootstrap.servers"]), ANSWER_TIMEOUT_S, kafka_config=self._kafka_config
        )

    def _handle(self, exc: KafkaException) -> None:
        err = kafka_error(exc)
        if err is not None and not err.fatal() and (err.txn_requires_abort() or err.retriable()):
            # Retriable here means the broker did not answer in time (a restart, an
            # outage): abort rather than wait, and rerun the turns from their journal.
            self._producer.poll(0)  # serves delivery reports not yet served
            failed = sorted(self._failed, key=lambda f: f.index)
            if err.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED:
                failed = self._blame_denied(failed, err.str())
            timed_out = [f for f in failed if f.code == "_MSG_TIMED_OUT"]
            shortfall = replica_shortfall(self._producer, timed_out, ANSWER_TIMEOUT_S)
            if shortfall:
                log.warning("transaction must abort; rebuilding affected turns: %s", shortfall)
            elif failed:
                log.warning(
                    "transaction must abort (%s); rebuilding affected turns; "
                    "%d record(s) failed delivery: %s",
                    err.str(),
                    len(failed),
                    describe_failures(failed),
                )
            else:
                log.warning("transaction must abort (%s); rebuilding affected turns", err.str())
            producer = self._producer
            try:
                self._bounded(
                    lambda: producer.abort_transaction(TRANSACTION_CALL_TIMEOUT_S),
                    "abort_transaction",
                )
            except KafkaException as abort_exc:
                if not any(f.denied for f in failed):
                    raise ProducerFenced(f"abort failed: {abort_exc}") from exc
                # The broker sometimes refuses to end a transaction it failed for
                # authorization (INVALID_TXN_STATE, fatal). The failing record is known,
                # so charge it: a new producer's init_transactions aborts what is open,
                # where a rejoin would rerun the same record into the same refusal.
                log.warning("abort failed (%s); replacing the producer", abort_exc)
            if failed or err.code() in REPLACE_AFTER:
                # Records that timed out for want of replicas are the shortfall said above:
                # the replacement is part of waiting for the brokers, not news of its own.
                self._replace_producer(failed[0] if failed else err.name(), quiet=bool(shortfall))
            raise TransactionAborted(err.str(), failed) from exc
        if err is not None and (
            err.fatal()
            or err.code()
            in (KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH)
        ):
            raise ProducerFenced(err.str()) from exc
        raise ProducerFenced(f"unexpected transactional error: {exc}") from exc

    def _blame_denied(self, failed: list[FailedDelivery], why: str) -> list[FailedDelivery]:
        """A transaction the broker failed for a topic this principal may not write: its
        records are only reported purged, so ask the broker which topics of the batch are
        forbidden and name each record bound there as ``denied`` (its own, final failure)
        in place of its purge; the rest stay purged (not theirs). Unchanged when the
        broker does not say."""
        topics = sorted({rec.topic for rec in self._sending})
        denied = unwritable_topics(
            str(self._conf["bootstrap.servers"]),
            topics,
            ANSWER_TIMEOUT_S,
            kafka_config=self._kafka_config,
        )
        if not denied:
            return failed
        by_index = {f.index: f for f in failed}
        who = principal(self._conf)
        for index, rec in enumerate(self._sending):
            if rec.topic in denied:
                by_index[index] = FailedDelivery(
                    index,
                    rec.topic,
                    -1 if rec.partition is None else rec.partition,
                    "TOPIC_AUTHORIZATION_FAILED",
                    f"{who} may not write {rec.topic}: {denied[rec.topic]}; {why}",
                    denied=True,
                )
        return sorted(by_index.values(), key=lambda f: f.index)

    def _replace_producer(self, cause: object, *, quiet: bool = False) -> None:
        """A new producer with our transactional id in place of one whose records failed.

        After a failed delivery librdkafka must bump the producer's epoch before its
        sequence numbers line up again; reused at once, the next transaction aborts too
        (``OUT_OF_ORDER_SEQUENCE_NUMBER``), and a producer whose partition state went
        stale (a broker restarted under it) can fail the same record every transaction.
        ``init_transactions`` on a new one fences the old one and starts clean.
        """
        fresh = new_producer(self._conf)
        try:
            fresh.init_transactions(TRANSACTION_CALL_TIMEOUT_S)
        except KafkaException as exc:
            raise ProducerFenced(f"no new producer after a failed delivery: {exc}") from None
        self._producer = fresh
        if quiet:
            log.info("replaced the transactional producer while replicas are short (%s)", cause)
        else:
            log.warning("replaced the transactional producer after a failed delivery (%s)", cause)

    def _write_then_commit(
        self, records: Sequence[OutRecord], offsets: Offsets, consumer: Consumer
    ) -> None:
        try:
            self._produce_all(records)
        except RefusedAtProduce as refused:
            self._producer.flush(60)  # what went before is sent; its input is read again
            log.warning("batch not committed; produce() refused a record: %s", refused.failure)
            raise TransactionAborted(str(refused), [refused.failure]) from None
        remaining = self._producer.flush(60)
        if remaining or self._failed:
            failed = sorted(self._failed, key=lambda f: f.index)
            log.warning(
                "batch not committed: %d record(s) undelivered, %d failed delivery: %s",
                remaining,
                len(failed),
                describe_failures(failed) or "-",
            )
            raise TransactionAborted(f"{remaining} records undelivered", failed)
        if offsets:
            try:
                consumer.commit(
                    offsets=[TopicPartition(t, p, o) for (t, p), o in offsets.items()],
                    asynchronous=False,
                )
            except KafkaException as exc:
                raise TransactionAborted(f"offset commit failed: {exc}") from exc

    def close(self) -> None:
        """Flush what is left; a producer that failed fatally (fenced) has nothing to add.

        On a fenced producer confluent-kafka's ``flush`` can also raise ``SystemError``
        (a C call returning with a Python error set): closing must not fail the worker's
        next session for what is only the old producer's cleanup.
        """
        if self.stuck:
            return
        try:
            self._producer.flush(10)
        except (KafkaException, SystemError) as exc:
            log.debug("flushing the closed transactional producer failed: %r", exc)
