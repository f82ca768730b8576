"""The worker's membership of its agent's consumer group, behind one class.

``TurnConsumer`` subscribes to the turns topic with assign/revoke hooks that receive
partition numbers, and ``poll`` returns what the worker acts on: decoded turn requests,
or bad records (with the bytes and the reason) for the dead-letter topic. The worker
never sees a raw Kafka message. Pausing, resuming and the group metadata that fences a
worker which lost its partitions (EOS v2) live here too. How a consumer is configured,
and the reads outside the group, are ``consumers.py``'s.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from confluent_kafka import Consumer, KafkaException, TopicPartition

from pyrula_stream.errors import MalformedRecordError
from pyrula_stream.kafka.config import resolve
from pyrula_stream.kafka.consumers import group_consumer, raise_if_denied
from pyrula_stream.kafka.offsets import watermarks
from pyrula_stream.kafka.partitioner import partition_for
from pyrula_stream.observability.tracing import carrier_from_headers
from pyrula_stream.wire.caps import check_headers
from pyrula_stream.wire.guard import DEFAULT_LIMITS, DecodeLimits, bad_record_reason
from pyrula_stream.wire.records import SourceRecord
from pyrula_stream.wire.serde import TurnRequest, ValueCodec, decode_turn_request, headers_dict

log = logging.getLogger(__name__)

PartitionsHook = Callable[[list[int]], None]
LagHook = Callable[[str, dict[int, int]], None]
"""Receives ``(topic, {partition: lag})`` for the partitions assigned now."""

FIRST_RECORD_WAIT_S = 0.05
MAX_BATCH = 256


RECORD_TURN_NAMESPACE = uuid.UUID("3c1f6a2e-9d4b-4f0a-8e57-1b2d6c9a7e44")


def record_turn_id(topic: str, partition: int, offset: int) -> str:
    """The turn id of a request that names none: derived from where the record sits, so a
    replay of the same record is the same turn (and a finished one runs nothing)."""
    return uuid.uuid5(RECORD_TURN_NAMESPACE, f"{topic}/{partition}/{offset}").hex


class ConsumerFenced(Exception):
    """The consumer hit a fatal error (fenced by a newer group generation): rejoin."""


@dataclass(frozen=True, slots=True)
class TurnRecord:
    """A turn request read from ``partition`` at ``offset``."""

    partition: int
    offset: int
    request: TurnRequest
    trace: dict[str, str] | None = None
    """The W3C trace context (``traceparent``, ``tracestate``) of the request's headers."""
    headers: Mapping[str, str] = field(default_factory=dict, repr=False)
    """The record's headers (a tenant may come from one); never in a repr or a log line,
    since a producer may put a credential there."""


@dataclass(frozen=True, slots=True)
class BadRecord:
    """A record that is not a readable turn request: dead-letter it with ``reason``."""

    partition: int
    offset: int
    reason: str
    source: SourceRecord


Intake = TurnRecord | BadRecord


class TurnConsumer:
    """The turns topic's group consumer (cooperative rebalancing, committed reads).

    A request that names another agent is a bad record too: the topic belongs to one.
    """

    def __init__(
        self,
        bootstrap_servers: str,
        *,
        topic: str,
        agent: str,
        group_id: str,
        client_id: str,
        exactly_once: bool,
        group_instance_id: str | None = None,
        group_protocol: str = "classic",
        extra: Mapping[str, Any] | None = None,
        on_lag: LagHook | None = None,
        kafka_config: Mapping[str, Any] | None = None,
        codec: ValueCodec | None = None,
        limits: DecodeLimits = DEFAULT_LIMITS,
    ) -> None:
        self.topic = topic
        self.agent = agent
        self._codec = codec
        self._limits = limits
        # Only what a denial message names (never a secret).
        self._who = {
            "bootstrap.servers": bootstrap_servers,
            "group.id": group_id,
            "sasl.username": resolve(kafka_config).get("sasl.username"),
        }
        self._on_lag = on_lag
        self._assigned: set[int] = set()
        self._committed: dict[int, int] = {}
        self._delivered: dict[int, int] = {}
        self._consumer: Consumer = group_consumer(
            bootstrap_servers,
            group_id,
            client_id=client_id,
            exactly_once=exactly_once,
            group_instance_id=group_instance_id,
            group_protocol=group_protocol,
            extra=extra,
            stats_cb=self._on_stats if on_lag is not None else None,
            kafka_config=kafka_config,
        )
        self._paused = False
        self._metadata: Any = self._consumer.consumer_group_metadata()
        self._partitions: int | None = None

    def subscribe(self, on_assign: PartitionsHook, on_revoke: PartitionsHook) -> None:
        """Join the group; the hooks run on the polling thread during a rebalance.

        Each hook first reads the group metadata anew: a cooperative rebalance has
        already moved the group to its next generation when a hook runs, so a commit the
        hook waits for (an intake mark, a clean handover) fails with ILLEGAL_GENERATION
        on the metadata of the poll before, and would keep failing until the hook gave
        up. Read on the polling thread, where it answers at once (from any other thread
        it blocks until the hook returns). A partition assigned while fetching is paused
        starts paused, so the pause holds.
        """

        def assigned(consumer: Consumer, partitions: list[TopicPartition]) -> None:
            self._metadata = consumer.consumer_group_metadata()
            self._assigned |= {tp.partition for tp in partitions}
            on_assign([tp.partition for tp in partitions])
            if self._paused and partitions:
                consumer.pause(partitions)

        def revoked(consumer: Consumer, partitions: list[TopicPartition]) -> None:
            self._metadata = consumer.consumer_group_metadata()
            self._assigned -= {tp.partition for tp in partitions}
            for tp in partitions:
                self._committed.pop(tp.partition, None)
                self._delivered.pop(tp.partition, None)
            on_revoke([tp.partition for tp in partitions])

        self._consumer.subscribe(
            [self.topic], on_assign=assigned, on_revoke=revoked, on_lost=revoked
        )

    def poll(self) -> list[Intake]:
        """Wait up to 50 ms for the first record, then take what is already buffered.

        ``consume(n, timeout)`` alone waits for a full batch or the whole timeout, which
        added ~25 ms to every turn on an idle worker. Blocking: call it in a thread.
        """
        first = self._consumer.poll(FIRST_RECORD_WAIT_S)
        msgs = [] if first is None else [first, *self._consumer.consume(MAX_BATCH - 1, 0)]
        self._metadata = self._consumer.consumer_group_metadata()
        out: list[Intake] = []
        for msg in msgs:
            err = msg.error()
            if err is not None:
                if err.fatal():
                    raise ConsumerFenced(f"consumer fatal error: {err.str()}")
                # A denied group or topic fails the worker naming it, not a warning loop.
                raise_if_denied(self._who, err, self.topic, group_operation="READ")
                log.warning("consumer error: %s", err.str())
                continue
            out.append(self._intake(msg))
        if self._on_lag is not None:
            for item in out:
                if item.offset >= self._delivered.get(item.partition, -1):
                    self._delivered[item.partition] = item.offset + 1
        return out

    def _intake(self, msg: Any) -> Intake:
        partition, offset = msg.partition(), msg.offset()
        raw_headers = [(k, v or b"") for k, v in (msg.headers() or [])]
        try:
            check_headers(raw_headers, "turn request")
            headers = headers_dict(raw_headers)
            request = decode_turn_request(
                msg.value(),
                headers,
                self._codec,
                default_turn_id=record_turn_id(msg.topic(), partition, offset),
                default_agent=self.agent,
                limits=self._limits,
            )
            key = msg.key()
            if key:
                request = replace(request, record_key=key.decode("utf-8", "replace"))
            if request.agent != self.agent:
                raise MalformedRecordError(
                    f"turn is for agent {request.agent!r}, this topic belongs to {self.agent!r}"
                )
            if request.lineage is not None:
                self._check_placement(request, key, partition)
            trace = carrier_from_headers(headers)
        except Exception as exc:  # any flaw of outside bytes: dead-letter, never crash
            source = SourceRecord(
                msg.topic(), partition, offset, msg.key(), msg.value(), raw_headers
            )
            return BadRecord(partition, offset, bad_record_reason(exc), source)
        return TurnRecord(partition, offset, request, trace, headers)

    def _check_placement(self, request: TurnRequest, key: bytes | None, partition: int) -> None:
        """A sub-agent request sits where its caller put it: keyed by its turn id, on that
        key's partition. One placed anywhere else was produced by hand with lineage
        headers, e.g. a child turn id read from the parent's events submitted again on
        another partition, where no turn of that id runs, to answer the parent's call."""
        expected = request.turn_id.encode()
        if key != expected or request.thread_id is not None:
            raise MalformedRecordError(
                "a sub-agent request (one with lineage headers) must be keyed by its turn "
                "id and belong to no thread, as call_agent writes it"
            )
        wanted = None
        for refresh in (False, True):  # the topic may have grown partitions since
            count = self._partition_count(refresh)
            wanted = None if count is None else partition_for(expected, count)
            if wanted is None or wanted == partition:
                return
        raise MalformedRecordError(
            f"a sub-agent request for turn {request.turn_id} must be on partition "
            f"{wanted} of {self.topic} (its key's), not {partition}"
        )

    def _partition_count(self, refresh: bool) -> int | None:
        """The turns topic's partition count, looked up once (again on ``refresh``)."""
        if self._partitions is None or refresh:
            try:
                meta = self._consumer.list_topics(self.topic, timeout=10.0).topics.get(self.topic)
            except KafkaException as exc:
                log.warning("cannot read the partitions of %s: %s", self.topic, exc)
                return self._partitions
            if meta is not None and meta.partitions:
                self._partitions = len(meta.partitions)
        return self._partitions

    def note_committed(self, offsets: dict[int, int]) -> None:
        """Input offsets a transaction just committed (the consumer's own statistics do
        not see offsets committed through the producer's transaction)."""
        for partition, offset in offsets.items():
            if partition in self._assigned:
                self._committed[partition] = max(offset, self._committed.get(partition, -1))

    def _on_stats(self, raw: str) -> None:
        """Lag per assigned partition: the last stable offset minus the committed one.

        Transaction markers occupy offsets that are never delivered, so the committed
        offset can stop one short of the end for good. Once every record delivered is
        committed, the application's position (which librdkafka moves past markers)
        counts as committed.
        """
        assert self._on_lag is not None
        try:
            stats = json.loads(raw)
            partitions = stats["topics"][self.topic]["partitions"]
        except (ValueError, KeyError, TypeError):
            return  # no statistics for the topic yet (nothing assigned)
        lag: dict[int, int] = {}
        for key, p in partitions.items():
            partition = int(key)
            if partition not in self._assigned:
                continue
            end = int(p.get("ls_offset", -1))
            if end < 0:
                end = int(p.get("hi_offset", -1))
            committed = max(self._committed.get(partition, -1), int(p.get("committed_offset", -1)))
            if committed >= self._delivered.get(partition, -1):
                committed = max(committed, int(p.get("app_offset", -1)))
            if committed < 0:
                committed = max(0, int(p.get("lo_offset", 0)))
            if end >= 0:
                lag[partition] = max(0, end - committed)
        self._on_lag(self.topic, lag)

    @property
    def group_metadata(self) -> Any:
        """The group generation as of the last poll or rebalance hook: what transactions
        commit offsets with."""
        return self._metadata

    @property
    def client(self) -> Consumer:
        """The underlying consumer, for the transactional writer's offset commits."""
        return self._consumer

    def position(self, partition: int) -> int:
        """Where reading the partition has got to (librdkafka moves it past transaction
        markers); -1 before the first fetch."""
        (tp,) = self._consumer.position([TopicPartition(self.topic, partition)])
        return int(tp.offset)

    def end_offset(self, partition: int) -> int:
        """The partition's last stable offset, asked of the broker (blocking: a thread)."""
        return watermarks(self._consumer, self.topic, partition, timeout_s=10.0)[1]

    def set_paused(self, paused: bool) -> None:
        """Stop (or restart) fetching every assigned partition; the group keeps them."""
        if paused == self._paused:
            return
        assignment = self._consumer.assignment()
        if paused:
            self._consumer.pause(assignment)
        else:
            self._consumer.resume(assignment)
        self._paused = paused

    def close(self) -> None:
        """Leave the group (revoking what is assigned) and close the client."""
        self._consumer.close()
