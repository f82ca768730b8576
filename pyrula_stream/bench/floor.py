"""The floor: a hand-written confluent-kafka transactional read-process-write loop.

No framework code runs here. For each input turn request it writes the records the
framework wrote for one real turn of the same workload (same count, keys, sizes and
headers, copied byte for byte from the framework's journal and events topics), journal
records to the input's partition, events by key, and commits them with the input offsets
in one transaction (``send_offsets_to_transaction``, EOS v2). It decodes nothing and calls
no model: it is the Kafka cost alone. Its clients use the worker's settings (lz4,
``acks=all``, idempotence, ``read_committed``, cooperative-sticky) and it has the batching
freedom of a good hand-written processor: every poll takes up to ``batch`` inputs and
all of them share one transaction.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from confluent_kafka import KafkaException, TopicPartition

from pyrula_stream.bench.framework import TurnRecords
from pyrula_stream.bench.harness import PREFIX, create_topics, drop_topics, unique
from pyrula_stream.bench.load import CompletionReader, Record, Submitter
from pyrula_stream.kafka.admin import agent_topic_specs
from pyrula_stream.kafka.config import client_config, new_consumer, new_producer
from pyrula_stream.kafka.partitioner import PARTITIONER


@dataclass
class FloorRun:
    turns: int
    seconds: float
    transactions: int
    records_written: int

    @property
    def turns_per_s(self) -> float:
        return self.turns / self.seconds


class FloorProcessor:
    """The loop, in its own thread: consume a batch, write its records, commit with offsets."""

    def __init__(
        self,
        bootstrap: str,
        *,
        turns_topic: str,
        journal_topic: str,
        events_topic: str,
        partitions: int,
        templates: Sequence[TurnRecords],
        batch: int,
        kafka_config: Mapping[str, Any] | None = None,
    ) -> None:
        self.turns_topic = turns_topic
        self.journal_topic = journal_topic
        self.events_topic = events_topic
        self.partitions = partitions
        self.templates = templates
        self.batch = batch
        self.transactions = 0
        self.records_written = 0
        self.error: BaseException | None = None
        self.assigned = threading.Event()
        self._stop = threading.Event()
        self._owned: set[int] = set()
        self._consumer = new_consumer(
            client_config(
                bootstrap,
                kafka_config,
                **{
                    "group.id": f"{turns_topic}.floor",
                    "enable.auto.commit": False,
                    "enable.auto.offset.store": False,
                    "auto.offset.reset": "earliest",
                    "isolation.level": "read_committed",
                    "partition.assignment.strategy": "cooperative-sticky",
                },
            )
        )
        self._producer = new_producer(
            client_config(
                bootstrap,
                kafka_config,
                **{
                    "transactional.id": f"{turns_topic}.floor",
                    "enable.idempotence": True,
                    "acks": "all",
                    "linger.ms": 1,
                    "compression.type": "lz4",
                    "partitioner": PARTITIONER,
                },
            )
        )
        self._thread = threading.Thread(target=self._run, name="floor", daemon=True)

    def start(self) -> None:
        self._producer.init_transactions(60)
        self._consumer.subscribe([self.turns_topic], on_assign=self._on_assign)
        self._thread.start()

    def _on_assign(self, consumer: Any, partitions: list[TopicPartition]) -> None:
        self._owned.update(tp.partition for tp in partitions)
        if len(self._owned) >= self.partitions:
            self.assigned.set()

    def _produce(
        self, topic: str, key: bytes, value: bytes | None, headers: Any, **kw: Any
    ) -> None:
        while True:
            try:
                self._producer.produce(topic, key=key, value=value, headers=headers, **kw)
                return
            except BufferError:
                self._producer.poll(0.01)

    def _run(self) -> None:
        n = 0
        try:
            while not self._stop.is_set():
                msgs = [m for m in self._consumer.consume(self.batch, 0.05) if m.error() is None]
                if not msgs:
                    continue
                self._producer.begin_transaction()
                offsets: dict[int, int] = {}
                for msg in msgs:
                    p = msg.partition() or 0
                    for kind, key, value, headers in self.templates[n % len(self.templates)]:
                        if kind == "journal":
                            self._produce(self.journal_topic, key, value, headers, partition=p)
                        else:
                            self._produce(self.events_topic, key, value, headers)
                        self.records_written += 1
                    offsets[p] = (msg.offset() or 0) + 1
                    n += 1
                self._producer.send_offsets_to_transaction(
                    [TopicPartition(self.turns_topic, p, o) for p, o in offsets.items()],
                    self._consumer.consumer_group_metadata(),
                )
                self._producer.commit_transaction(60)
                self.transactions += 1
        except (KafkaException, RuntimeError) as exc:
            self.error = exc

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)
        self._consumer.close()
        self._producer.flush(10)


def run_floor(
    bootstrap: str,
    *,
    requests: Sequence[Record],
    templates: Sequence[TurnRecords],
    partitions: int,
    batch: int,
    keep_topics: bool = False,
) -> FloorRun:
    """One floor run over the same encoded turn requests the framework got (blocking)."""
    name = unique("floor")
    specs = agent_topic_specs(name, prefix=PREFIX, partitions=partitions)
    create_topics(bootstrap, specs)
    turns_topic, events_topic, journal_topic = (
        f"{PREFIX}.{name}.{t}" for t in ("turns", "events", "journal")
    )
    floor = FloorProcessor(
        bootstrap,
        turns_topic=turns_topic,
        journal_topic=journal_topic,
        events_topic=events_topic,
        partitions=partitions,
        templates=templates,
        batch=batch,
    )
    submitter = Submitter(bootstrap)
    reader = CompletionReader(bootstrap, events_topic, partitions)
    try:
        floor.start()
        if not floor.assigned.wait(120):
            raise TimeoutError("the floor's consumer got no partitions")
        started = submitter.send_all(turns_topic, requests)
        deadline = time.monotonic() + max(120.0, len(requests) / 10)
        while not reader.reached(len(requests)):
            if floor.error is not None:
                raise RuntimeError(f"floor loop failed: {floor.error}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"floor run: {reader.terminal}/{len(requests)} turns")
            time.sleep(0.02)
        seconds = reader.last_done - started
    finally:
        floor.stop()
        reader.close()
        submitter.close()
        if not keep_topics:
            drop_topics(bootstrap, [s.name for s in specs])
    return FloorRun(len(requests), seconds, floor.transactions, floor.records_written)
