"""``KafkaMemory``: agent memory in the compacted ``<prefix>.memory`` topic.

A global table (``GlobalTable``): every worker reads the whole topic at start into a
``SqliteMemory`` (FTS5 for ``search``) and then follows it, so a write committed on one
worker is visible on every other once its reader catches up. Inside a turn, writes ride
the turn's transaction (``record``); ``put``/``delete`` called outside a turn write one
record each, idempotently, and wait for the broker.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from confluent_kafka import KafkaError

from pyrula_stream.errors import BrokerUnavailableError, MalformedRecordError
from pyrula_stream.kafka.admin import DEFAULT_PREFIX, TopicSpec, apply_topics, topic_specs
from pyrula_stream.kafka.offsets import ConsumedRecord
from pyrula_stream.kafka.table import GlobalTable, TableWriter
from pyrula_stream.state.memory import (
    DEFAULT_MAX_MEMORY_VALUE_BYTES,
    MemoryItem,
    MemoryItems,
    MemorySource,
    SqliteMemory,
    check_namespace,
    encode_item,
    record_key,
)
from pyrula_stream.wire import guard
from pyrula_stream.wire.records import JSON_CONTENT_TYPE, OutRecord

__all__ = ["KafkaMemory", "memory_topic_spec"]

DEFAULT_MEMORY_PARTITIONS = 3


def memory_topic_spec(
    *, prefix: str = DEFAULT_PREFIX, partitions: int = DEFAULT_MEMORY_PARTITIONS
) -> TopicSpec:
    """The memory topic, from ``topics/memory.yaml``."""
    (spec,) = topic_specs("memory.yaml", {"prefix": prefix, "partitions": str(partitions)})
    return spec


class KafkaMemory:
    """A ``MemoryBackend`` over ``<prefix>.memory``, materialized in a local SQLite file."""

    def __init__(
        self,
        bootstrap_servers: str,
        *,
        state_dir: Path,
        client_id: str,
        prefix: str = DEFAULT_PREFIX,
        max_value_bytes: int = DEFAULT_MAX_MEMORY_VALUE_BYTES,
        timeout_s: float = 60.0,
        kafka_config: Mapping[str, Any] | None = None,
    ) -> None:
        self.bootstrap_servers = bootstrap_servers
        self.kafka_config = kafka_config
        self.spec = memory_topic_spec(prefix=prefix)
        self.topic = self.spec.name
        self.client_id = client_id
        self.max_value_bytes = max_value_bytes
        self._timeout_s = timeout_s
        self.view = SqliteMemory(state_dir / f"{client_id}.memory.sqlite")
        self._table = GlobalTable(
            bootstrap_servers,
            self.topic,
            client_id=client_id,
            apply=self._apply,
            kafka_config=kafka_config,
            group_id=f"{self.topic}.readers",
        )
        self._writer: TableWriter | None = None

    def start(self) -> None:
        """Create the topic if missing, read it to its end, then follow it (blocking)."""
        apply_topics(
            self.bootstrap_servers, [self.spec], self._timeout_s, kafka_config=self.kafka_config
        )
        self._table.start(timeout_s=self._timeout_s)

    @property
    def skipped_records(self) -> int:
        """Records of the topic that could not be read and were skipped (logged)."""
        return self._table.skipped_records

    def close(self) -> None:
        self._table.stop()
        if self._writer is not None:
            self._writer.close()
        self.view.close()

    def record(self, namespace: tuple[str, ...], key: str, item: MemoryItem | None) -> OutRecord:
        """The write of one item (``None``: a tombstone), for the turn's transaction."""
        value = None if item is None else encode_item(item, self.max_value_bytes)
        rec = self._table.record(record_key(namespace, key), value)
        rec.headers.append(JSON_CONTENT_TYPE)
        return rec

    def _apply(self, record: ConsumedRecord) -> None:
        """Fold one record; the table reader skips (and counts) one that is not readable."""
        decoded = decode_memory_record(record.key, record.value)
        if decoded is not None:
            self.view.apply(*decoded)

    # -- MemoryBackend --------------------------------------------------------------------

    def get(self, namespace: tuple[str, ...], key: str) -> MemoryItem | None:
        self._check_reader()
        return self.view.get(namespace, key)

    def list(
        self, namespace_prefix: tuple[str, ...], *, key_prefix: str = "", limit: int = 100
    ) -> MemoryItems:
        self._check_reader()
        return self.view.list(namespace_prefix, key_prefix=key_prefix, limit=limit)

    def search(
        self, namespace_prefix: tuple[str, ...], query: str, *, limit: int = 10
    ) -> MemoryItems:
        self._check_reader()
        return self.view.search(namespace_prefix, query, limit=limit)

    def put(
        self,
        namespace: tuple[str, ...],
        key: str,
        value: dict[str, Any],
        *,
        source: MemorySource,
        written_by_run_id: str | None,
    ) -> None:
        check_namespace(namespace, key)
        item = MemoryItem(namespace, key, value, source, written_by_run_id)
        self._send(self.record(namespace, key, item))

    def delete(self, namespace: tuple[str, ...], key: str) -> None:
        check_namespace(namespace, key)
        self._send(self.record(namespace, key, None))

    def _check_reader(self) -> None:
        if self._table.failure is not None:
            raise BrokerUnavailableError(
                f"the reader of {self.topic} stopped ({self._table.failure}); restart the worker"
            )

    def _send(self, record: OutRecord) -> None:
        """One write outside a turn: produce it and wait for the broker's acknowledgement."""
        if self._writer is None:
            self._writer = TableWriter(
                self.bootstrap_servers,
                client_id=f"{self.client_id}-writer",
                timeout_s=self._timeout_s,
                max_record_bytes=self.max_value_bytes + 64 * 1024,
                kafka_config=self.kafka_config,
            )
        done = threading.Event()
        failure: list[KafkaError] = []

        def on_delivery(err: KafkaError | None, _msg: Any) -> None:
            if err is not None:
                failure.append(err)
            done.set()

        self._writer.produce_nowait(record, on_delivery)
        if not done.wait(self._timeout_s) or failure:
            raise BrokerUnavailableError(
                f"writing {record.key.decode()} to {self.topic} failed: "
                f"{failure[0].str() if failure else 'no answer'}"
            )


def decode_memory_record(
    key: str, value: bytes | None
) -> tuple[tuple[str, ...], str, MemoryItem | None] | None:
    """``(namespace, key, item or None for a tombstone)`` of one memory record; ``None``
    for a key that is not ours; ``MalformedRecordError`` for a value that is unreadable."""
    what = f"memory record {key!r:.100}"
    try:
        parsed = guard.loads(key, f"{what} key")
    except MalformedRecordError:
        return None  # not ours: ignored like any foreign record
    if not (
        isinstance(parsed, list)
        and len(parsed) == 2
        and isinstance(parsed[0], list)
        and all(isinstance(part, str) for part in parsed[0])
        and isinstance(parsed[1], str)
    ):
        return None
    namespace, name = parsed
    if value is None:
        return tuple(namespace), name, None
    return tuple(namespace), name, MemoryItem.from_json(guard.loads_object(value, what))
