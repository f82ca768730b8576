"""The tool cache every worker shares: a compacted ``<prefix>.cache`` topic, read whole by each.

``@tool(cache_ttl=...)`` results and ``ctx.cache`` entries must be seen by every worker of
the fleet, or a turn moved to another worker after a rebalance recomputes what its first
worker already paid for. ``KafkaCacheStore`` keeps them where the rest of the system keeps
state: in Kafka. The topic is a global table (``pyrula_stream.kafka.table.GlobalTable``
reads and follows it, ``TableWriter`` writes it); ``pyrula_stream.tools.cache_table`` decides
what a record changes and what a read returns; this module ties them to the cache API.

Why a compacted topic materialized in every worker (a Kafka Streams GlobalKTable):

- **No new infrastructure.** The brokers that hold the journal hold the cache; there is no
  Redis to deploy, secure and keep alive beside them.
- **Compaction is the right retention.** Only the newest record of a key matters, and
  compaction keeps exactly that, so the topic stays the size of the live cache and a
  restart reads one record per key. Expired keys are tombstoned and compact away.
- **Reads are local.** ``get`` is a dict lookup: a network round trip per tool call would
  eat the latency the cache saves, and a slow broker must not stall the tool loop.
- **No partition affinity.** A tool call can run on any worker for any turn, so every worker
  holds every key (a partitioned, KTable-style store would not do). That is the price, and
  it is bounded, because every entry carries a TTL.

Consistency:

- **Last writer wins, in log order.** Two workers writing one key both produce to the key's
  partition; every reader applies the partition in order, so all converge on the record
  the broker appended last (not the one with the later wall clock).
- **Eventual across workers.** Another worker sees a write once its reader consumes it
  (typically milliseconds). Until then it may miss or read the older value; for a cache
  that costs one recomputation, never a wrong turn, because a hit is journaled like a
  result and replay never consults the cache.
- **Read-your-writes in one worker.** ``set`` updates the local table at once, and older
  records of the key still being read are ignored, so a worker never sees its own write
  go back to an older value. If the broker refuses the write, the local entry is dropped
  and ``set`` raises.
- **Expiry is wall-clock.** A record holds its expiry as epoch milliseconds (value
  ``{"v": <value>, "exp": <ms>}``); clock skew between hosts shifts expiry by that much.
  Expired entries read as missing everywhere and are tombstoned, lazily by ``get`` and by
  the reader's periodic sweep (``sweep_interval_s``), which also catches keys that expired
  while no worker ran. An expiry tombstone spares a fresher value another worker wrote
  meanwhile (should compaction then drop that value, a worker started later misses it: a
  cache miss, never a wrong value).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import math
import threading
import uuid
from collections.abc import Mapping
from types import TracebackType
from typing import Any, Literal, Self

from confluent_kafka import KafkaError, KafkaException

from pyrula_stream.errors import (
    BrokerUnavailableError,
    ConfigurationError,
    PayloadTooLarge,
    TopicDriftError,
    UserError,
)
from pyrula_stream.kafka.admin import (
    DEFAULT_PREFIX,
    TopicSpec,
    apply_topics,
    broker_answers,
    topic_specs,
)
from pyrula_stream.kafka.config import resolve
from pyrula_stream.kafka.offsets import ConsumedRecord, kafka_error
from pyrula_stream.kafka.table import DeliveryCallback, GlobalTable, TableWriter
from pyrula_stream.tools.cache_table import (
    EXPIRED_HEADER,
    WRITER_HEADER,
    CacheTable,
    decode_entry,
    encode_entry,
)
from pyrula_stream.wire.records import OutRecord

__all__ = ["DEFAULT_CACHE_PARTITIONS", "KafkaCacheStore", "cache_topic_spec"]

logger = logging.getLogger(__name__)

DEFAULT_CACHE_PARTITIONS = 3
MAX_RECORD_BYTES = 1_000_000  # the producer's message.max.bytes; the broker allows a bit more

_State = Literal["new", "starting", "started", "closed"]


def cache_topic_spec(
    *, prefix: str = DEFAULT_PREFIX, partitions: int = DEFAULT_CACHE_PARTITIONS
) -> TopicSpec:
    """The cache topic, from ``topics/cache.yaml``."""
    (spec,) = topic_specs("cache.yaml", {"prefix": prefix, "partitions": str(partitions)})
    return spec


def _settle(done: asyncio.Future[None], failure: BaseException | None) -> None:
    if done.done():  # the waiter was cancelled
        return
    if failure is None:
        done.set_result(None)
    else:
        done.set_exception(failure)


class KafkaCacheStore:
    """A ``CacheStore`` on the compacted ``<prefix>.cache`` topic (see the module docstring).

    ``start()`` creates the topic if missing and blocks until this store has read it to the
    end; ``close()`` stops the reader and flushes pending writes. Both are safe to repeat,
    and the store is a context manager (sync and async). A store that failed to start or
    was closed cannot be restarted: make a new one.
    """

    def __init__(
        self,
        bootstrap_servers: str,
        *,
        prefix: str = DEFAULT_PREFIX,
        partitions: int = DEFAULT_CACHE_PARTITIONS,
        client_id: str | None = None,
        start_timeout_s: float = 30.0,
        write_timeout_s: float = 10.0,
        sweep_interval_s: float | None = 60.0,
        kafka_config: Mapping[str, Any] | None = None,
    ) -> None:
        for option, seconds in (
            ("start_timeout_s", start_timeout_s),
            ("write_timeout_s", write_timeout_s),
            ("sweep_interval_s", 1.0 if sweep_interval_s is None else sweep_interval_s),
        ):
            if not (math.isfinite(seconds) and seconds > 0):
                raise ConfigurationError(f"{option} must be a finite number > 0, got {seconds!r}")
        if partitions < 1:
            raise ConfigurationError(f"partitions must be >= 1, got {partitions}")
        self.bootstrap_servers = bootstrap_servers
        self._kafka_config = resolve(kafka_config)
        self._spec = cache_topic_spec(prefix=prefix, partitions=partitions)
        self.topic = self._spec.name
        self.client_id = client_id or f"pyrula-cache-{uuid.uuid4().hex[:8]}"
        self._start_timeout_s = start_timeout_s
        self._write_timeout_s = write_timeout_s
        self._table = CacheTable()  # shared by the event loop and the reader thread
        self._state: _State = "new"
        self._state_lock = threading.Lock()
        self._stop = threading.Event()
        self._writer: TableWriter | None = None
        self._reader = GlobalTable(
            bootstrap_servers,
            self.topic,
            client_id=self.client_id,
            apply=self._apply,
            tick=None if sweep_interval_s is None else self._sweep,
            tick_interval_s=sweep_interval_s or 60.0,
            kafka_config=self._kafka_config,
            group_id=f"{self.topic}.readers",
        )

    @property
    def skipped_records(self) -> int:
        """Records of the topic that could not be read and were skipped (logged)."""
        return self._reader.skipped_records

    def __repr__(self) -> str:
        return f"<KafkaCacheStore {self.topic} at {self.bootstrap_servers} ({self._state})>"

    def __len__(self) -> int:
        """Entries held now, expired ones not yet swept included."""
        return len(self._table)

    # --- lifecycle -----------------------------------------------------------------------

    def start(self) -> None:
        """Create the topic if missing, then block until the table is read to its end."""
        with self._state_lock:
            if self._state == "started":
                return
            if self._state != "new":
                raise UserError(
                    f"this KafkaCacheStore of {self.topic} is {self._state}; create a new one"
                )
            self._state = "starting"
        try:
            self._open()
        except BaseException:
            with self._state_lock:
                self._state = "closed"
            self._shutdown()
            raise
        with self._state_lock:
            closed_meanwhile = self._stop.is_set()  # close() ran while we started
            self._state = "closed" if closed_meanwhile else "started"
        if closed_meanwhile:
            self._shutdown()
            raise UserError(f"the KafkaCacheStore of {self.topic} was closed while starting")

    def close(self) -> None:
        """Stop the reader, deliver pending writes (a few seconds at most), close clients."""
        with self._state_lock:
            previous, self._state = self._state, "closed"
        if previous == "closed":
            return
        if previous == "starting":  # start() sees the stop and cleans up in its own thread
            self._stop.set()
            return
        self._shutdown()

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    async def __aenter__(self) -> Self:
        try:
            await asyncio.to_thread(self.start)
        except asyncio.CancelledError:
            self._stop.set()  # the start() thread notices, cleans up and ends
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await asyncio.to_thread(self.close)

    def _open(self) -> None:
        answer_s = min(self._start_timeout_s, 10.0)
        if not broker_answers(
            self.bootstrap_servers, timeout_s=answer_s, kafka_config=self._kafka_config
        ):
            raise BrokerUnavailableError(
                f"Kafka at {self.bootstrap_servers} did not answer within {answer_s:g}s, so "
                f"the shared tool cache ({self.topic}) cannot start; check the address and "
                "that the broker is running"
            )
        try:
            report = apply_topics(
                self.bootstrap_servers,
                [self._spec],
                self._start_timeout_s,
                kafka_config=self._kafka_config,
            )
        except KafkaException as exc:
            raise BrokerUnavailableError(
                f"could not create or check the cache topic {self.topic} at "
                f"{self.bootstrap_servers}: {exc}"
            ) from exc
        self._check_drift(report.drift)
        self._writer = TableWriter(
            self.bootstrap_servers,
            client_id=self.client_id,
            timeout_s=self._write_timeout_s,
            max_record_bytes=MAX_RECORD_BYTES,
            kafka_config=self._kafka_config,
        )
        try:  # connect now (metadata, idempotent producer id), not on the first set()
            self._writer.connect(self.topic, timeout_s=min(self._start_timeout_s, 10.0))
        except KafkaException as exc:
            raise BrokerUnavailableError(
                f"the cache producer could not reach {self.bootstrap_servers}: {exc}"
            ) from exc
        try:
            self._reader.start(timeout_s=self._start_timeout_s)
        except TimeoutError as exc:
            raise BrokerUnavailableError(
                f"the shared tool cache did not read {self.topic} from "
                f"{self.bootstrap_servers} to its end: {exc}"
            ) from exc
        except KafkaException as exc:
            raise BrokerUnavailableError(
                f"reading the cache topic {self.topic} from {self.bootstrap_servers} failed: {exc}"
            ) from exc

    def _check_drift(self, drift: list[str]) -> None:
        """Only a non-compacted topic is fatal: it would lose live entries to retention."""
        fatal = [d for d in drift if "cleanup.policy" in d]
        if fatal:
            raise TopicDriftError(
                f"the cache topic differs from its spec: {'; '.join(fatal)}. The cache needs "
                f"cleanup.policy=compact; fix the topic or use another prefix"
            )
        for difference in drift:
            logger.warning("cache topic drift (harmless for the cache): %s", difference)

    def _shutdown(self) -> None:
        """Idempotent: stop the reader, deliver pending writes, close the clients."""
        self._stop.set()
        self._reader.stop()
        writer, self._writer = self._writer, None
        if writer is not None:
            left = writer.close()
            if left:
                logger.warning(
                    "%d cache writes to %s were not delivered before close", left, self.topic
                )

    # --- the CacheStore protocol ---------------------------------------------------------

    async def get(self, key: str) -> Any | None:
        """The value, or ``None`` when missing or expired; never waits on the network."""
        return self.get_nowait(key)

    def get_nowait(self, key: str) -> Any | None:
        """``get`` for sync code (a sync tool, a ``cache_getter``); returns a copy."""
        self._check_usable()
        value, expired = self._table.lookup(key)
        if expired is not None:
            self._tombstone_expired(key, expired)
        return value

    async def set(self, key: str, value: Any, ttl_s: float) -> None:
        """Store ``value`` for ``ttl_s`` seconds and wait for the broker's acknowledgement.

        The local table changes at once; other workers see the write once they read it.
        ``None`` or ``ttl_s <= 0`` deletes the key for everyone (a tombstone).
        """
        self._check_usable()
        if not isinstance(key, str):
            raise UserError(f"cache keys are str, got {type(key).__name__}")
        payload: bytes | None = None
        local: tuple[Any, int] | None = None
        if value is not None and ttl_s > 0:
            payload, local = encode_entry(key, value, ttl_s)
            if len(payload) > MAX_RECORD_BYTES:
                raise self._too_large(key, len(payload))
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()
        token = self._table.begin_write(key, local)
        on_delivery = functools.partial(self._on_write_delivered, loop, done, key, token)
        try:
            record = self._reader.record(key, payload, [(WRITER_HEADER, token.encode())])
            await self._produce(key, record, on_delivery)
        except BaseException:
            self._table.forget_write(key, token)
            raise
        try:
            async with asyncio.timeout(self._write_timeout_s + 5.0):
                await done
        except TimeoutError:
            self._table.forget_write(key, token)
            raise BrokerUnavailableError(
                f"no acknowledgement for cache key {key!r} from {self.topic} at "
                f"{self.bootstrap_servers} within {self._write_timeout_s:g}s"
            ) from None

    # --- writing -------------------------------------------------------------------------

    async def _produce(self, key: str, record: OutRecord, on_delivery: DeliveryCallback) -> None:
        """Enqueue one record; a full queue is waited out (briefly), never busy-blocked."""
        writer = self._writer
        if writer is None:
            raise UserError(f"the KafkaCacheStore of {self.topic} is closed")
        try:
            await writer.produce(record, on_delivery)
        except (TimeoutError, RuntimeError) as exc:
            raise BrokerUnavailableError(
                f"could not write cache key {key!r} to {self.topic}: {exc}; is Kafka at "
                f"{self.bootstrap_servers} reachable?"
            ) from None
        except KafkaException as exc:
            err = kafka_error(exc)
            if err is not None and err.code() == KafkaError.MSG_SIZE_TOO_LARGE:
                raise self._too_large(key, len(record.value or b"")) from exc
            raise BrokerUnavailableError(
                f"could not write cache key {key!r} to {self.topic} at "
                f"{self.bootstrap_servers}: {exc}"
            ) from exc

    def _too_large(self, key: str, size: int) -> PayloadTooLarge:
        return PayloadTooLarge(
            f"the cache record for {key!r} is {size} bytes, over the {MAX_RECORD_BYTES}-byte "
            "record limit; cache something smaller",
            detail={"bytes": size, "limit": MAX_RECORD_BYTES},
        )

    def _on_write_delivered(
        self,
        loop: asyncio.AbstractEventLoop,
        done: asyncio.Future[None],
        key: str,
        token: str,
        err: KafkaError | None,
        msg: Any,
    ) -> None:
        """Runs on the poll thread: settle the waiting ``set`` on its own loop."""
        failure: BaseException | None = None
        if err is not None:
            self._table.forget_write(key, token)
            failure = BrokerUnavailableError(
                f"the shared tool cache could not write {key!r} to {self.topic} at "
                f"{self.bootstrap_servers}: {err.str()}"
            )
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody is waiting
            loop.call_soon_threadsafe(_settle, done, failure)

    def _tombstone_expired(self, key: str, exp: int) -> None:
        """Best effort, never blocking: a missed tombstone is retried by a later sweep."""
        writer = self._writer
        if writer is None:
            return
        record = self._reader.record(key, None, [(EXPIRED_HEADER, str(exp).encode())])
        try:
            writer.produce_nowait(record, self._on_tombstone_delivered)
        except (BufferError, KafkaException) as exc:
            logger.info("could not tombstone expired cache key %r in %s: %s", key, self.topic, exc)

    def _on_tombstone_delivered(self, err: KafkaError | None, msg: Any) -> None:
        if err is not None:
            logger.info("an expiry tombstone for %s was not written: %s", self.topic, err.str())

    # --- reading -------------------------------------------------------------------------

    def _check_usable(self) -> None:
        if self._state != "started":
            raise UserError(
                f"the KafkaCacheStore of {self.topic} is {self._state}; call start() or use "
                "it as a context manager"
            )
        failure = self._reader.failure
        if failure is not None:
            raise BrokerUnavailableError(
                f"the shared tool cache stopped reading {self.topic} from "
                f"{self.bootstrap_servers}: {failure}"
            )

    def _apply(self, record: ConsumedRecord) -> None:
        """Fold one record read from the topic into the table (the reader's thread)."""
        if not record.key:
            logger.warning(
                "skipped a record without a key in %s at offset %d of partition %d",
                self.topic,
                record.offset,
                record.partition,
            )
            return
        # An unreadable value raises: the table reader skips, logs and counts it.
        entry = None if record.value is None else decode_entry(record.value)
        self._table.apply(record.key, entry, record.headers)

    def _sweep(self) -> None:
        """Drop expired entries and tombstone them, with those read already expired."""
        for key, exp in self._table.sweep().items():
            self._tombstone_expired(key, exp)
