"""A compacted topic materialized locally: the one shape of state a worker keeps.

Every piece of state lives in a compacted topic, and a worker holds a local view of it
(DESIGN.md, "Growing past one turn"). Two kinds, one reading path (``read_to_end``):

- ``PartitionedTable``: a topic co-partitioned with the turns topic. The worker that owns
  turns partition p restores partition p of the table when p is assigned and drops it on
  revoke, so a thread's state is always where its turns run. The journal's idempotency
  keys are one now; threads and replies come next.
- ``GlobalTable``: a topic every worker reads whole at start and then follows live on a
  thread (a Kafka Streams GlobalKTable). The shared tool cache is one now; ``memory``
  comes next.

Writes: a table builds its records (``put``/``tombstone`` give ``OutRecord``s); the
caller's producer writes them, inside its own transaction when it has one, and updates
its local view once the write committed, never before (an aborted write must not be
seen). ``TableWriter`` is the producer for tables whose writes belong to no transaction.

Local views: a plain dict for small tables; ``SqliteView`` when a table grows with
throughput (idempotency keys within their TTL): it keeps the keys on disk, so memory stays
flat. A view is a cache of the topic, rebuilt from it on every assignment, so it needs no
crash safety of its own (no journal, no fsync).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer

from pyrula_stream.kafka.config import new_consumer, new_producer, producer_config, reader_config
from pyrula_stream.kafka.offsets import ConsumedRecord, read_to_end, to_record
from pyrula_stream.wire.guard import bad_record_reason
from pyrula_stream.wire.records import OutRecord

__all__ = ["DeliveryCallback", "GlobalTable", "PartitionedTable", "SqliteView", "TableWriter"]

logger = logging.getLogger(__name__)

Headers = list[tuple[str, bytes]]
DeliveryCallback = Callable[[KafkaError | None, Any], None]


def _record(
    topic: str, key: str, value: bytes | None, headers: Headers | None, partition: int | None
) -> OutRecord:
    return OutRecord(topic, key.encode(), value, list(headers or []), partition)


class PartitionedTable:
    """A compacted topic co-partitioned with the turns topic (see the module docstring).

    ``restore`` reads one partition to its last stable offset; the caller folds the
    records into its view for that partition. Records are written to the partition of the
    turn they belong to, never by key hash, so they stay with the turns that own them.
    """

    def __init__(self, topic: str) -> None:
        self.topic = topic

    def restore(
        self, consumer: Consumer, partition: int, *, timeout_s: float = 120.0
    ) -> Iterator[ConsumedRecord]:
        """Every committed record of ``partition``, read to its end now."""
        yield from read_to_end(consumer, self.topic, [partition], timeout_s=timeout_s)

    def put(
        self, key: str, value: bytes, partition: int, headers: Headers | None = None
    ) -> OutRecord:
        return _record(self.topic, key, value, headers, partition)

    def tombstone(self, key: str, partition: int, headers: Headers | None = None) -> OutRecord:
        return _record(self.topic, key, None, headers, partition)


class SqliteView:
    """A disk-backed local view: key -> (value, record timestamp), one file per partition.

    The file is rebuilt from the topic on each assignment (creating the view empties it),
    so it is opened without a rollback journal or fsync: a crash loses nothing the topic
    does not hold. Its page cache is small (128 KB): a key is looked up about once per
    request that carries it, and the operating system's file cache serves the rest, so
    the process's memory does not grow with the keys held. Used from one thread at a time:
    the owner serializes its calls (the idempotency keys read on the event loop and write
    on a worker thread, under a lock).
    """

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        path.unlink(missing_ok=True)
        # Only this account reads it (sqlite would take the umask): what turns hold.
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
        self.path = path
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self._db.executescript(
            """
            PRAGMA journal_mode = OFF;
            PRAGMA synchronous = OFF;
            PRAGMA cache_size = -128;
            CREATE TABLE entries (
                key TEXT PRIMARY KEY, value BLOB NOT NULL, ts_ms INTEGER NOT NULL
            );
            CREATE INDEX entries_by_time ON entries (ts_ms);
            """
        )

    def __len__(self) -> int:
        row = self._db.execute("SELECT count(*) FROM entries").fetchone()
        return int(row[0])

    @contextlib.contextmanager
    def batch(self) -> Iterator[None]:
        """Apply many writes as one SQLite transaction (a restore: one write, not one each)."""
        self._db.execute("BEGIN")
        try:
            yield
        finally:
            self._db.execute("COMMIT")

    def apply(self, key: str, value: bytes | None, ts_ms: int) -> None:
        """One committed write: ``None`` deletes the key."""
        if value is None:
            self._db.execute("DELETE FROM entries WHERE key = ?", (key,))
        else:
            self._db.execute(
                "INSERT OR REPLACE INTO entries (key, value, ts_ms) VALUES (?, ?, ?)",
                (key, value, ts_ms),
            )

    def apply_many(self, rows: Iterable[tuple[str, bytes, int]]) -> None:
        """Many committed writes (key, value, timestamp) as one SQLite transaction."""
        with self.batch():
            self._db.executemany(
                "INSERT OR REPLACE INTO entries (key, value, ts_ms) VALUES (?, ?, ?)", rows
            )

    def delete_many(self, keys: Iterable[str]) -> None:
        """Forget ``keys`` in one SQLite transaction."""
        with self.batch():
            self._db.executemany("DELETE FROM entries WHERE key = ?", ((k,) for k in keys))

    def get(self, key: str) -> tuple[bytes, int] | None:
        row = self._db.execute("SELECT value, ts_ms FROM entries WHERE key = ?", (key,)).fetchone()
        return None if row is None else (bytes(row[0]), int(row[1]))

    def older_than(self, ts_ms: int, limit: int | None = None) -> list[str]:
        """Keys whose record was written before ``ts_ms`` (expiry), the oldest first;
        at most ``limit`` of them (``None``: all)."""
        rows = self._db.execute(
            "SELECT key FROM entries WHERE ts_ms < ? ORDER BY ts_ms LIMIT ?",
            (ts_ms, -1 if limit is None else limit),
        ).fetchall()
        return [str(row[0]) for row in rows]

    def close(self) -> None:
        """Close and delete the file: the next owner rebuilds it from the topic."""
        self._db.close()
        self.path.unlink(missing_ok=True)


class GlobalTable:
    """Every partition of a compacted topic, read whole, then followed live on a thread.

    ``start`` blocks until the view holds the topic to the end it had then; from there a
    daemon thread applies new records as they arrive (typically milliseconds after they
    commit) and calls ``tick`` every ``tick_interval_s`` (housekeeping such as expiry).
    ``apply`` runs on the starting thread, then on the follower, never on two at once.
    A follower that fails stores the error in ``failure`` and stops.
    """

    def __init__(
        self,
        bootstrap_servers: str,
        topic: str,
        *,
        client_id: str,
        apply: Callable[[ConsumedRecord], None],
        tick: Callable[[], None] | None = None,
        tick_interval_s: float = 60.0,
        kafka_config: Mapping[str, Any] | None = None,
        group_id: str | None = None,
    ) -> None:
        self.bootstrap_servers = bootstrap_servers
        self.topic = topic
        self.client_id = client_id
        self._kafka_config = kafka_config
        self._group_id = group_id
        self.failure: BaseException | None = None
        self.skipped_records = 0
        self._apply = apply
        self._tick = tick
        self._tick_interval_s = tick_interval_s
        self._stop = threading.Event()
        self._consumer: Consumer | None = None
        self._thread: threading.Thread | None = None
        self._polled_at = time.monotonic()

    def following(self, within_s: float) -> bool:
        """Whether the follower thread is alive and has polled within ``within_s``: a
        view that is not may be frozen (a reader that died or hangs)."""
        thread = self._thread
        return (
            thread is not None
            and thread.is_alive()
            and self.failure is None
            and time.monotonic() - self._polled_at <= within_s
        )

    def start(self, *, timeout_s: float) -> None:
        """Read the topic to its end (``TimeoutError`` after ``timeout_s``), then follow it."""
        consumer = self._consumer = new_consumer(
            reader_config(
                self.bootstrap_servers,
                kafka_config=self._kafka_config,
                client_id=self.client_id,
                group_id=self._group_id,
            )
        )
        for record in read_to_end(consumer, self.topic, timeout_s=timeout_s, keep_assigned=True):
            if self._stop.is_set():
                return
            self._apply_guarded(record)
        self._thread = threading.Thread(
            target=self._follow, name=f"{self.client_id}-follow", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        """Stop following and close the reader; safe to repeat and from any thread."""
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=10)
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            consumer.close()

    def record(self, key: str, value: bytes | None, headers: Headers | None = None) -> OutRecord:
        """A write of ``key`` (``None``: a tombstone), partitioned by key like every writer."""
        return _record(self.topic, key, value, headers, None)

    def _follow(self) -> None:
        consumer = self._consumer
        assert consumer is not None
        next_tick = time.monotonic() + self._tick_interval_s
        try:
            while not self._stop.is_set():
                self._polled_at = time.monotonic()
                # poll() returns on the first record (consume() would wait out its timeout
                # for a full batch); whatever else is buffered is then drained at once.
                first = consumer.poll(0.1)
                if first is not None:
                    for msg in [first, *consumer.consume(500, timeout=0)]:
                        self._on_message(msg)
                if self._tick is not None and time.monotonic() >= next_tick:
                    self._tick()
                    next_tick = time.monotonic() + self._tick_interval_s
        except BaseException as exc:  # the thread must not die silently
            self.failure = exc
            logger.error("the reader of %s stopped", self.topic, exc_info=True)

    def _on_message(self, msg: Any) -> None:
        err = msg.error()
        if err is not None:
            if err.code() == KafkaError._PARTITION_EOF:
                return
            if err.fatal():
                raise KafkaException(err)
            logger.warning("reading %s: %s", self.topic, err.str())
            return
        self._apply_guarded(to_record(msg))

    def _apply_guarded(self, record: ConsumedRecord) -> None:
        """Fold one record; one that cannot be read is skipped, logged and counted in
        ``skipped_records``, never the end of the reader (anyone may write the topic)."""
        try:
            self._apply(record)
        except Exception as exc:
            self.skipped_records += 1
            logger.warning(
                "skipping unreadable record %s[%d]@%d: %s",
                self.topic,
                record.partition,
                record.offset,
                bad_record_reason(exc),
            )


class TableWriter:
    """The producer of a table whose writes belong to no transaction (the tool cache).

    Idempotent, ``acks=all``; a thread serves delivery callbacks as soon as they arrive,
    so a writer waiting on one hears back promptly. A full queue is waited out, briefly.
    """

    def __init__(
        self,
        bootstrap_servers: str,
        *,
        client_id: str,
        timeout_s: float,
        max_record_bytes: int,
        kafka_config: Mapping[str, Any] | None = None,
    ) -> None:
        self._timeout_s = timeout_s
        settings: dict[str, Any] = {
            "client.id": client_id,
            "message.max.bytes": max_record_bytes,
            "message.timeout.ms": int(timeout_s * 1000),
        }
        self._producer: Producer | None = new_producer(
            producer_config(bootstrap_servers, kafka_config, **settings)
        )
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, name=f"{client_id}-poll", daemon=True)
        self._thread.start()

    def connect(self, topic: str, *, timeout_s: float) -> None:
        """Fetch ``topic``'s metadata and the producer id now, not on the first write."""
        if self._producer is not None:
            self._producer.list_topics(topic, timeout=timeout_s)

    @property
    def closed(self) -> bool:
        return self._producer is None

    def produce_nowait(self, record: OutRecord, on_delivery: DeliveryCallback) -> None:
        """Enqueue or raise (``BufferError`` on a full queue, ``KafkaException``)."""
        producer = self._producer
        if producer is None:
            raise BufferError("the table writer is closed")
        kwargs: dict[str, Any] = {
            "key": record.key,
            "value": record.value,
            "headers": record.headers,
        }
        if record.partition is not None:
            kwargs["partition"] = record.partition
        producer.produce(record.topic, on_delivery=on_delivery, **kwargs)

    async def produce(self, record: OutRecord, on_delivery: DeliveryCallback) -> None:
        """Enqueue, waiting out a full queue for up to the write timeout (``TimeoutError``)."""
        deadline = time.monotonic() + self._timeout_s
        while True:
            if self._producer is None:
                raise RuntimeError("the table writer is closed")
            try:
                self.produce_nowait(record, on_delivery)
                return
            except BufferError:
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"the producer queue stayed full for {self._timeout_s:g}s"
                    ) from None
                await asyncio.sleep(0.01)

    def close(self) -> int:
        """Stop the poller and deliver what is queued (a few seconds at most).

        Returns how many records were not delivered.
        """
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=10)
        producer, self._producer = self._producer, None
        return 0 if producer is None else producer.flush(min(self._timeout_s, 5.0))

    def _poll(self) -> None:
        try:
            while not self._stop.is_set():
                producer = self._producer
                if producer is None:
                    return
                producer.poll(0.1)
        except BaseException:
            logger.error("a table writer's poller stopped", exc_info=True)
