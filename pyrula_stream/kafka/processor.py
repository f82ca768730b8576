"""A stream processor's membership of its group: several topics, committed reads, and
the offsets and group metadata its transactions carry (EOS v2, as the worker's).

The evaluators use it (``evals.stream``): they read an agent's results, judges' results,
business topics and their own state topic, and write what they derive with the input
offsets in one transaction. Hooks receive ``(topic, partition)`` pairs.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from confluent_kafka import Consumer, TopicPartition

from pyrula_stream.kafka.config import resolve
from pyrula_stream.kafka.consumers import group_consumer, raise_if_denied, reader_consumer
from pyrula_stream.kafka.group import ConsumerFenced
from pyrula_stream.kafka.offsets import ConsumedRecord, read_to_end, to_record

log = logging.getLogger(__name__)

TopicPartitions = list[tuple[str, int]]
TopicHook = Callable[[TopicPartitions], None]

MAX_BATCH = 500
EAGER = {"partition.assignment.strategy": "range"}
"""Processors rebalance eagerly. Cooperative rebalancing moves partitions in two rounds,
and a static member replaced between them (a crash, or a new session after an aborted
batch) never learns that it gave partitions up, so the second round that hands them to
the other members never comes: they stay with nobody until the next rebalance."""


class GroupReader:
    """One member of a processor's consumer group over ``topics`` (read committed)."""

    def __init__(
        self,
        bootstrap_servers: str,
        *,
        topics: Sequence[str],
        group_id: str,
        client_id: str,
        kafka_config: Mapping[str, Any] | None = None,
        group_instance_id: str | None = None,
    ) -> None:
        """``group_instance_id`` makes the member static (KIP-345): restarted under the
        same id, it gets its partitions back at once instead of after the session
        timeout and a rebalance."""
        self.topics = list(topics)
        self._who = {
            "bootstrap.servers": bootstrap_servers,
            "group.id": group_id,
            "sasl.username": resolve(kafka_config).get("sasl.username"),
        }
        self._consumer: Consumer = group_consumer(
            bootstrap_servers,
            group_id,
            client_id=client_id,
            exactly_once=True,
            group_instance_id=group_instance_id,
            kafka_config=kafka_config,
            extra=EAGER,
        )
        self._metadata: Any = self._consumer.consumer_group_metadata()

    def subscribe(self, on_assign: TopicHook, on_revoke: TopicHook) -> None:
        """Join the group; the hooks run on the polling thread, during ``poll``."""

        # The group metadata is taken after each poll, not here: during close() the
        # consumer revokes with no metadata to give, and asking for it would raise.
        def assigned(consumer: Consumer, partitions: list[TopicPartition]) -> None:
            on_assign([(str(tp.topic), tp.partition) for tp in partitions])

        def revoked(consumer: Consumer, partitions: list[TopicPartition]) -> None:
            on_revoke([(str(tp.topic), tp.partition) for tp in partitions])

        self._consumer.subscribe(
            self.topics, on_assign=assigned, on_revoke=revoked, on_lost=revoked
        )

    def poll(self, wait_s: float = 0.2) -> list[ConsumedRecord]:
        """The first record within ``wait_s``, then what is already buffered."""
        first = self._consumer.poll(wait_s)
        msgs = [] if first is None else [first, *self._consumer.consume(MAX_BATCH - 1, 0)]
        self._metadata = self._consumer.consumer_group_metadata()
        out: list[ConsumedRecord] = []
        for msg in msgs:
            err = msg.error()
            if err is not None:
                if err.fatal():
                    raise ConsumerFenced(f"consumer fatal error: {err.str()}")
                raise_if_denied(self._who, err, str(msg.topic()), group_operation="READ")
                log.debug("consumer error: %s", err.str())
                continue
            out.append(to_record(msg))
        return out

    def committed(self, topic: str, partition: int, timeout_s: float = 10.0) -> int:
        """The group's committed offset of one partition (0 when none)."""
        (tp,) = self._consumer.committed([TopicPartition(topic, partition)], timeout=timeout_s)
        return max(int(tp.offset), 0)

    def seek_committed(self, partitions: TopicPartitions) -> None:
        """Go back to the committed offsets (after a transaction was aborted)."""
        tps = self._consumer.committed([TopicPartition(t, p) for t, p in partitions], timeout=10.0)
        for tp in tps:
            tp.offset = max(int(tp.offset), 0)
            self._consumer.seek(tp)

    @property
    def group_metadata(self) -> Any:
        return self._metadata

    @property
    def client(self) -> Consumer:
        """The underlying consumer, for the transactional writer."""
        return self._consumer

    def close(self) -> None:
        self._consumer.close()


def read_partition(
    bootstrap_servers: str,
    topic: str,
    partition: int,
    *,
    client_id: str,
    kafka_config: Mapping[str, Any] | None = None,
) -> list[ConsumedRecord]:
    """Every committed record of one partition now (a state topic's restore)."""
    consumer = reader_consumer(bootstrap_servers, client_id=client_id, kafka_config=kafka_config)
    try:
        return list(read_to_end(consumer, topic, [partition]))
    finally:
        consumer.close()
