"""The records of one turn, read from the one partition its key maps to.

A turn's request, journal records and result share the partition of the request's key:
the journal is written to the request's partition (the topics are co-partitioned) and
the result is keyed as the request was. So what ``KafkaAgentClient.status`` needs is a
few single-partition reads, never a whole topic: the journal partition, the results
partition when the journal no longer holds the end, and the turns partition past the
workers' committed offset for a request no worker has started.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import TracebackType
from typing import Any

from confluent_kafka import KafkaException

from pyrula_stream.kafka.config import new_consumer, reader_config
from pyrula_stream.kafka.consumers import raise_if_denied
from pyrula_stream.kafka.offsets import (
    ConsumedRecord,
    committed_offset,
    kafka_error,
    read_to_end,
    watermarks,
)
from pyrula_stream.kafka.partitioner import partition_for


class TurnLookup:
    """One group-less ``read_committed`` consumer for a few one-partition reads (blocking:
    run it in a thread). ``group_id`` is the readers' group (for ACLs, never joined)."""

    def __init__(
        self,
        bootstrap_servers: str,
        *,
        client_id: str,
        group_id: str,
        kafka_config: Mapping[str, Any] | None = None,
        timeout_s: float = 30.0,
    ) -> None:
        self._bootstrap = bootstrap_servers
        self._kafka_config = kafka_config
        self._client_id = client_id
        self._conf = reader_config(
            bootstrap_servers, kafka_config=kafka_config, client_id=client_id, group_id=group_id
        )
        self._consumer = new_consumer(self._conf)
        self.timeout_s = timeout_s

    def close(self) -> None:
        self._consumer.close()

    def __enter__(self) -> TurnLookup:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def partition_of(self, topic: str, key: str) -> int | None:
        """The (murmur2) partition of ``key`` in ``topic``; ``None`` if there is no topic."""
        timeout = min(self.timeout_s, 10.0)
        meta = self._consumer.list_topics(topic, timeout=timeout).topics.get(topic)
        if meta is not None and meta.error is not None:
            raise_if_denied(self._conf, meta.error, topic)
        if meta is None or meta.error is not None or not meta.partitions:
            return None
        return partition_for(key.encode(), len(meta.partitions))

    def end_offset(self, topic: str, partition: int) -> int:
        """The partition's end now (where a reader of what comes next starts)."""
        return int(watermarks(self._consumer, topic, partition, timeout_s=self.timeout_s)[1])

    def read(
        self,
        topic: str,
        partition: int,
        keep: Callable[[ConsumedRecord], bool],
        *,
        start: int | None = None,
    ) -> list[ConsumedRecord]:
        """The committed records of one partition that ``keep`` accepts, from ``start``
        (default: the first retained record) to the end the partition has now."""
        try:
            if start is not None:
                _, end = watermarks(self._consumer, topic, partition, timeout_s=self.timeout_s)
                if start >= end:
                    return []
            records = read_to_end(
                self._consumer,
                topic,
                [partition],
                timeout_s=self.timeout_s,
                start=None if start is None else {partition: start},
            )
            return [r for r in records if keep(r)]
        except KafkaException as exc:
            err = kafka_error(exc)
            if err is not None:
                raise_if_denied(self._conf, err, topic)
            raise

    def committed(self, group_id: str, topic: str, partition: int) -> int | None:
        """The offset ``group_id`` committed on one partition (``None``: nothing yet).

        Asked with a consumer configured for that group that never joins it nor commits
        (an OffsetFetch), so it needs DESCRIBE on the group and nothing more."""
        conf = reader_config(
            self._bootstrap,
            kafka_config=self._kafka_config,
            client_id=self._client_id,
            group_id=group_id,
        )
        consumer = new_consumer(conf)
        try:
            return committed_offset(consumer, topic, partition, timeout_s=self.timeout_s)
        except KafkaException as exc:
            err = kafka_error(exc)
            if err is not None:
                raise_if_denied(conf, err, topic)
            raise
        finally:
            consumer.close()
