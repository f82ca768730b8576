"""The bench's instruments: a load generator and a reader that clocks each terminal event.

Both are plain confluent-kafka clients, the same for the framework and the floor, so
whatever they cost is paid equally by both sides. The load generator does not use
``KafkaAgentClient.submit``: that waits for the broker's acknowledgement of each request
(one flush per turn), which would make the submitter the bottleneck of the bench.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, KafkaError, TopicPartition

from pyrula_stream.kafka.config import client_config, new_consumer, new_producer, producer_config
from pyrula_stream.wire import serde
from pyrula_stream.wire.events import EventType, decode_event
from pyrula_stream.wire.records import content_type_header
from pyrula_stream.wire.serde import TurnRequest

Headers = list[tuple[str, str | bytes | None]]
Record = tuple[bytes, bytes | None, Headers]
"""``(key, value, headers)`` of one record to produce."""

TERMINAL = (str(EventType.RUN_COMPLETE), str(EventType.RUN_ERROR))


def turn_requests(agent: str, n: int, params: dict[str, Any]) -> list[Record]:
    """``n`` encoded turn requests, exactly as ``KafkaAgentClient.submit`` would write them."""
    now = int(time.time() * 1000)
    out: list[Record] = []
    for _ in range(n):
        request = TurnRequest(uuid.uuid4().hex, agent, dict(params), submitted_ms=now)
        value = serde.encode("turn_request", request)
        out.append((request.key.encode(), value, [content_type_header("turn_request")]))
    return out


def event_type(value: bytes | None) -> str:
    """The ``type`` of an Avro-encoded event without decoding the rest of it.

    ``type`` is the first field of ``schemas/event.avsc``: a zig-zag varint length, then
    UTF-8 bytes. Reading only that keeps the reader's CPU cost out of the measurement.
    """
    if not value:
        return ""
    shift = length = pos = 0
    while pos < len(value):
        b = value[pos]
        pos += 1
        length |= (b & 0x7F) << shift
        if not b & 0x80:
            break
        shift += 7
    length = (length >> 1) ^ -(length & 1)
    return value[pos : pos + length].decode("utf-8", "replace")


class Submitter:
    """An idempotent producer that writes many turn requests without a flush per record
    (``kafka_config``: the user's client settings; None: ``PYRULA_KAFKA_CONFIG``)."""

    def __init__(
        self, bootstrap_servers: str, *, kafka_config: Mapping[str, Any] | None = None
    ) -> None:
        self._producer = new_producer(producer_config(bootstrap_servers, kafka_config))

    def _produce(self, topic: str, record: Record) -> None:
        key, value, headers = record
        while True:
            try:
                self._producer.produce(topic, key=key, value=value, headers=headers)
                return
            except BufferError:
                self._producer.poll(0.01)

    def send_all(self, topic: str, records: Sequence[Record]) -> float:
        """Produce every record as fast as the client takes them; return the first's time."""
        started = time.monotonic()
        for record in records:
            self._produce(topic, record)
        self._producer.flush(60)
        return started

    def send_paced(self, topic: str, records: Sequence[Record], rate: float) -> dict[bytes, float]:
        """Produce at ``rate`` records/s, each sent at once; return each key's submit time."""
        sent: dict[bytes, float] = {}
        start = time.monotonic()
        for i, record in enumerate(records):
            delay = start + i / rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            sent[record[0]] = time.monotonic()
            self._produce(topic, record)
            self._producer.poll(0)
        self._producer.flush(60)
        return sent

    def close(self) -> None:
        self._producer.flush(10)


def wake_on_first(consumer: Any, n: int, wait_s: float) -> list[Any]:
    """Up to ``n`` records: the first within ``wait_s``, then only what is already buffered.

    ``consume(n, timeout)`` alone returns early only once ``n`` records are queued, so at
    a paced rate it waits out the whole timeout and every latency sample is late by up to
    that much (the sawtooth of issue 18). This wakes on the first record instead.
    """
    first = consumer.poll(wait_s)
    if first is None:
        return []
    return [first, *consumer.consume(n - 1, 0)] if n > 1 else [first]


class CompletionReader:
    """Reads an events topic under ``read_committed`` in a thread and clocks each event type.

    ``done`` maps a turn's key to the monotonic time its terminal event was read back;
    ``started`` does the same for ``run:start``. ``keep_ts`` also decodes those two events
    to keep the worker's own ``ts_ms``. It wakes on the first record (``wake_on_first``)
    and ``fetch.wait.max.ms`` is 10 ms, so the reader adds little to a measured latency.
    """

    def __init__(
        self,
        bootstrap_servers: str,
        topic: str,
        partitions: int,
        *,
        keep_ts: bool = False,
        kafka_config: Mapping[str, Any] | None = None,
    ) -> None:
        self.topic = topic
        self.keep_ts = keep_ts
        self.start_ts_ms: dict[bytes, int] = {}
        self.end_ts_ms: dict[bytes, int] = {}
        self.counts: Counter[str] = Counter()
        self.done: dict[bytes, float] = {}
        self.started: dict[bytes, float] = {}
        self.errors: list[bytes] = []
        self.last_done = 0.0
        self.failure: str | None = None
        self._stop = threading.Event()
        self._consumer = new_consumer(
            client_config(
                bootstrap_servers,
                kafka_config,
                **{
                    "group.id": f"bench-reader-{uuid.uuid4().hex[:8]}",
                    "enable.auto.commit": False,
                    "isolation.level": "read_committed",
                    "auto.offset.reset": "earliest",
                    "fetch.wait.max.ms": 10,
                },
            )
        )
        self._consumer.assign(
            [TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)]
        )
        self._thread = threading.Thread(target=self._run, name=f"reader-{topic}", daemon=True)
        self._thread.start()

    @property
    def terminal(self) -> int:
        return self.counts[TERMINAL[0]] + self.counts[TERMINAL[1]]

    @property
    def in_flight(self) -> int:
        """Turns whose ``run:start`` is committed and whose terminal event is not yet."""
        return self.counts[str(EventType.RUN_START)] - self.terminal

    def reached(self, n: int) -> bool:
        """Whether ``n`` turns ended; raises if the reader failed or a turn failed."""
        if self.failure is not None:
            raise RuntimeError(self.failure)
        if self.errors:
            raise RuntimeError(
                f"{len(self.errors)} turns ended with run:error (first: {self.errors[0]!r}); "
                "a benchmark of failing turns measures nothing"
            )
        return self.terminal >= n

    def _run(self) -> None:
        while not self._stop.is_set():
            msgs = wake_on_first(self._consumer, 1000, 0.05)
            now = time.monotonic()
            for msg in msgs:
                err = msg.error()
                if err is not None:
                    if err.code() != KafkaError._PARTITION_EOF:
                        self.failure = f"reading {self.topic}: {err.str()}"
                    continue
                kind = event_type(msg.value())
                key = msg.key() or b""
                self.counts[kind] += 1
                if kind == EventType.RUN_START:
                    self.started.setdefault(key, now)
                    if self.keep_ts:
                        self.start_ts_ms[key] = self._ts_ms(msg)
                elif kind in TERMINAL:
                    self.done.setdefault(key, now)
                    if self.keep_ts:
                        self.end_ts_ms[key] = self._ts_ms(msg)
                    self.last_done = now
                    if kind == EventType.RUN_ERROR:
                        self.errors.append(key)

    @staticmethod
    def _ts_ms(msg: Any) -> int:
        return decode_event(msg.value(), serde.headers_dict(msg.headers())).ts_ms

    def close(self) -> None:
        self._stop.set()
        self._thread.join(10)
        self._consumer.close()


def read_records(
    bootstrap_servers: str, topic: str, partitions: int
) -> list[tuple[int, str, bytes | None, dict[str, str]]]:
    """Every committed record of ``topic`` as ``(partition, key, value, headers)``."""
    from pyrula_stream.kafka.consumers import read_topic

    records = read_topic(
        bootstrap_servers, topic, timeout_s=300, client_id=f"bench-dump-{uuid.uuid4().hex[:8]}"
    )
    return [(r.partition, r.key, r.value, r.headers) for r in records]
