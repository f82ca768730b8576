"""The tool cache every worker shares: a compacted ``<prefix>.cache`` topic, read whole by each.

``@tool(cache_ttl=...)`` results and ``ctx.cache`` entries must be seen by every worker of
the fleet, or a turn moved to another worker after a rebalance recomputes what its first
worker already paid for. ``KafkaCacheStore`` keeps them where the rest of the system keeps
state: in Kafka. This module moves records; ``pyrula_stream.cache_table`` is the table.

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
import time
import uuid
from collections.abc import Callable, Mapping
from importlib import resources
from types import TracebackType
from typing import Any, Literal, Self

import yaml
from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)

from pyrula_stream.cache_table import (
    EXPIRED_HEADER,
    WRITER_HEADER,
    CacheTable,
    decode_entry,
    encode_entry,
)
from pyrula_stream.errors import (
    BrokerUnavailableError,
    ConfigurationError,
    PayloadTooLarge,
    TopicDriftError,
    UserError,
)
from pyrula_stream.kafka.admin import DEFAULT_PREFIX, TopicSpec, apply_topics, broker_answers
from pyrula_stream.kafka.config import client_config, new_producer, resolve
from pyrula_stream.kafka.consumers import reader_consumer
from pyrula_stream.kafka.partitioner import PARTITIONER

__all__ = ["DEFAULT_CACHE_PARTITIONS", "KafkaCacheStore", "cache_topic_spec"]

logger = logging.getLogger(__name__)

DEFAULT_CACHE_PARTITIONS = 3
MAX_RECORD_BYTES = 1_000_000  # the producer's message.max.bytes; the broker allows a bit more

_State = Literal["new", "starting", "started", "closed"]
_LEADERSHIP_MOVING = frozenset(
    {
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.UNKNOWN_TOPIC_OR_PART,
    }
)


def cache_topic_spec(
    *, prefix: str = DEFAULT_PREFIX, partitions: int = DEFAULT_CACHE_PARTITIONS
) -> TopicSpec:
    """The cache topic, read from the declarative spec shipped with the package."""
    text = resources.files("pyrula_stream").joinpath("topics/cache.yaml").read_text()
    raw = yaml.safe_load(text)["topics"][0]
    fill = {"prefix": prefix, "partitions": str(partitions)}
    return TopicSpec(
        name=str(raw["name"]).format(**fill),
        partitions=int(str(raw["partitions"]).format(**fill)),
        config={k: str(v).format(**fill) for k, v in (raw.get("config") or {}).items()},
    )


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
        self._sweep_interval_s = sweep_interval_s
        self._table = CacheTable()  # shared by the event loop and the reader thread
        self._remaining: dict[int, int] = {}  # partition -> end offset, until caught up
        self._state: _State = "new"
        self._state_lock = threading.Lock()
        self._stop = threading.Event()
        self._caught_up = threading.Event()
        self._failure: BaseException | None = None
        self._producer: Producer | None = None
        self._consumer: Consumer | None = None
        self._threads: list[threading.Thread] = []

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
        self._producer = new_producer(
            client_config(
                self.bootstrap_servers,
                self._kafka_config,
                **{
                    "client.id": self.client_id,
                    "enable.idempotence": True,
                    "acks": "all",
                    "linger.ms": 1,
                    "partitioner": PARTITIONER,
                    "message.max.bytes": MAX_RECORD_BYTES,
                    "message.timeout.ms": int(self._write_timeout_s * 1000),
                },
            )
        )
        try:  # connect now (metadata, idempotent producer id), not on the first set()
            self._producer.list_topics(self.topic, timeout=min(self._start_timeout_s, 10.0))
        except KafkaException as exc:
            raise BrokerUnavailableError(
                f"the cache producer could not reach {self.bootstrap_servers}: {exc}"
            ) from exc
        self._consumer = reader_consumer(
            self.bootstrap_servers,
            client_id=self.client_id,
            kafka_config=self._kafka_config,
            group_id=f"{self.topic}.readers",
        )
        self._assign_from_beginning(self._consumer)
        self._threads = [
            threading.Thread(target=self._read_loop, name=f"{self.client_id}-read", daemon=True),
            threading.Thread(target=self._poll_loop, name=f"{self.client_id}-poll", daemon=True),
        ]
        for thread in self._threads:
            thread.start()
        self._wait_caught_up()

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

    def _assign_from_beginning(self, consumer: Consumer) -> None:
        """Record each partition's end offset, then read every partition from its start."""
        deadline = time.monotonic() + self._start_timeout_s
        while True:
            try:
                partitions = self._end_offsets(consumer)
                break
            except KafkaException as exc:
                err = exc.args[0] if exc.args else None
                # A topic created a moment ago can still be electing leaders: wait that out.
                transient = isinstance(err, KafkaError) and (
                    err.retriable() or err.code() in _LEADERSHIP_MOVING
                )
                if transient and time.monotonic() < deadline:
                    time.sleep(0.1)
                    continue
                raise BrokerUnavailableError(
                    f"could not read the end offsets of {self.topic} at "
                    f"{self.bootstrap_servers}: {exc}"
                ) from exc
        consumer.assign([TopicPartition(self.topic, p, OFFSET_BEGINNING) for p in partitions])
        if not self._remaining:
            self._caught_up.set()

    def _end_offsets(self, consumer: Consumer) -> list[int]:
        timeout = min(self._start_timeout_s, 10.0)
        meta = consumer.list_topics(self.topic, timeout=timeout).topics.get(self.topic)
        if meta is None or meta.error is not None:
            raise KafkaException(
                meta.error if meta is not None else KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART)
            )
        self._remaining.clear()
        for partition in meta.partitions:
            tp = TopicPartition(self.topic, partition)
            low, high = consumer.get_watermark_offsets(tp, timeout=timeout, cached=False)
            if high > low:
                self._remaining[partition] = high
        return sorted(meta.partitions)

    def _wait_caught_up(self) -> None:
        if not self._caught_up.wait(self._start_timeout_s):
            lag = ", ".join(
                f"partition {p} end {end}" for p, end in sorted(self._remaining.items())
            )
            raise BrokerUnavailableError(
                f"the shared tool cache did not read {self.topic} from "
                f"{self.bootstrap_servers} to its end within {self._start_timeout_s:g}s "
                f"(still reading: {lag})"
            )
        if self._failure is not None:
            raise BrokerUnavailableError(
                f"reading the cache topic {self.topic} from {self.bootstrap_servers} failed: "
                f"{self._failure}"
            ) from self._failure

    def _shutdown(self) -> None:
        """Idempotent: stop both threads, flush the producer, close the consumer."""
        self._stop.set()
        for thread in self._threads:
            if thread.is_alive() and thread is not threading.current_thread():
                thread.join(timeout=10)
        producer, self._producer = self._producer, None
        if producer is not None:
            left = producer.flush(min(self._write_timeout_s, 5.0))
            if left:
                logger.warning(
                    "%d cache writes to %s were not delivered before close", left, self.topic
                )
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            consumer.close()

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
            await self._produce(key, payload, [(WRITER_HEADER, token.encode())], on_delivery)
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

    async def _produce(
        self,
        key: str,
        payload: bytes | None,
        headers: list[tuple[str, str | bytes | None]],
        on_delivery: Callable[[KafkaError | None, Any], None],
    ) -> None:
        """Enqueue one record; a full queue is waited out (briefly), never busy-blocked."""
        deadline = time.monotonic() + self._write_timeout_s
        while True:
            producer = self._producer
            if producer is None:
                raise UserError(f"the KafkaCacheStore of {self.topic} is closed")
            try:
                producer.produce(
                    self.topic,
                    key=key.encode(),
                    value=payload,
                    headers=headers,
                    on_delivery=on_delivery,
                )
                return
            except BufferError:
                if time.monotonic() > deadline:
                    raise BrokerUnavailableError(
                        f"the producer queue for {self.topic} stayed full for "
                        f"{self._write_timeout_s:g}s; is Kafka at {self.bootstrap_servers} "
                        "reachable?"
                    ) from None
                await asyncio.sleep(0.01)
            except KafkaException as exc:
                err = exc.args[0] if exc.args else None
                if isinstance(err, KafkaError) and err.code() == KafkaError.MSG_SIZE_TOO_LARGE:
                    raise self._too_large(key, len(payload or b"")) from exc
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
        producer = self._producer
        if producer is None:
            return
        try:
            producer.produce(
                self.topic,
                key=key.encode(),
                value=None,
                headers=[(EXPIRED_HEADER, str(exp).encode())],
                on_delivery=self._on_tombstone_delivered,
            )
        except (BufferError, KafkaException) as exc:
            logger.info("could not tombstone expired cache key %r in %s: %s", key, self.topic, exc)

    def _on_tombstone_delivered(self, err: KafkaError | None, msg: Any) -> None:
        if err is not None:
            logger.info("an expiry tombstone for %s was not written: %s", self.topic, err.str())

    # --- reading (the reader thread) -----------------------------------------------------

    def _check_usable(self) -> None:
        if self._state != "started":
            raise UserError(
                f"the KafkaCacheStore of {self.topic} is {self._state}; call start() or use "
                "it as a context manager"
            )
        if self._failure is not None:
            raise BrokerUnavailableError(
                f"the shared tool cache stopped reading {self.topic} from "
                f"{self.bootstrap_servers}: {self._failure}"
            )

    def _read_loop(self) -> None:
        consumer = self._consumer
        assert consumer is not None
        next_sweep = time.monotonic() + (self._sweep_interval_s or 0.0)
        try:
            while not self._stop.is_set():
                # poll() returns on the first record (consume() would wait out its timeout
                # for a full batch); whatever else is buffered is then drained at once.
                first = consumer.poll(0.1)
                if first is not None:
                    self._on_message(first)
                    for msg in consumer.consume(500, timeout=0):
                        self._on_message(msg)
                if not self._caught_up.is_set():
                    self._check_caught_up(consumer)
                if self._sweep_interval_s is not None and time.monotonic() >= next_sweep:
                    self._sweep()
                    next_sweep = time.monotonic() + self._sweep_interval_s
        except BaseException as exc:  # the thread must not die silently
            self._failure = exc
            logger.error("the cache reader of %s stopped", self.topic, exc_info=True)
        finally:
            self._caught_up.set()  # wake start(); it reports the failure or the stop

    def _poll_loop(self) -> None:
        """Serve delivery callbacks as soon as they arrive, so ``set`` returns promptly."""
        try:
            while not self._stop.is_set():
                producer = self._producer
                if producer is None:
                    return
                producer.poll(0.1)
        except BaseException:
            logger.error("the cache producer poller of %s stopped", self.topic, exc_info=True)

    def _on_message(self, msg: Any) -> None:
        err = msg.error()
        if err is not None:
            if err.code() == KafkaError._PARTITION_EOF:
                self._remaining.pop(msg.partition(), None)
                return
            if err.fatal():
                raise KafkaException(err)
            logger.warning("reading the cache topic %s: %s", self.topic, err.str())
            return
        key = msg.key()
        if not key:
            logger.warning(
                "skipped a record without a key in %s at offset %d of partition %d",
                self.topic,
                msg.offset(),
                msg.partition(),
            )
            return
        self._apply(key.decode("utf-8", "replace"), msg.value(), dict(msg.headers() or []))

    def _apply(self, key: str, value: bytes | None, headers: dict[str, bytes]) -> None:
        try:
            entry = None if value is None else decode_entry(value)
        except ValueError as exc:
            logger.warning("skipped a malformed record for %r in %s: %s", key, self.topic, exc)
            return
        self._table.apply(key, entry, headers)

    def _check_caught_up(self, consumer: Consumer) -> None:
        """Caught up when ``position >= end`` for every partition (markers take offsets)."""
        if self._remaining:
            tps = [TopicPartition(self.topic, p) for p in self._remaining]
            for tp in consumer.position(tps):
                end = self._remaining.get(tp.partition)
                if end is not None and tp.offset >= end:
                    del self._remaining[tp.partition]
        if not self._remaining:
            self._caught_up.set()

    def _sweep(self) -> None:
        """Drop expired entries and tombstone them, with those read already expired."""
        for key, exp in self._table.sweep().items():
            self._tombstone_expired(key, exp)
