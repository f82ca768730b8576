"""The floor: a hand-written confluent-kafka transactional read-process-write loop.

No framework code runs here. For each input turn request it writes the records the
framework wrote for one real turn of the same workload (same count, keys, sizes and
headers, copied byte for byte from the framework's journal, events and results topics),
journal records to the input's partition, events and the result record by key, and
commits them with the input offsets in one transaction (``send_offsets_to_transaction``,
EOS v2). It decodes nothing and calls
no model: it is the Kafka cost alone. Its clients use the worker's settings (lz4,
``acks=all``, idempotence, ``read_committed``, cooperative-sticky) and it has the batching
freedom of a good hand-written processor: every poll takes what is buffered, up to
``batch`` inputs, and all of them share one transaction; the throughput phase runs it in a
process of its own (``run_floor_process``). ``run_floor_latency`` runs the
same loop with one input per transaction at a paced rate: the latency floor; with
``commits=2`` it commits twice per input, in sequence (the records up to the model's
first response, then the rest with the offset): the floor of a turn whose tool has
effects, which must not act before the model's response is durable.
"""

from __future__ import annotations

import multiprocessing
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Any

from confluent_kafka import KafkaException, TopicPartition

from pyrula_stream.bench.framework import TurnRecords
from pyrula_stream.bench.harness import (
    PREFIX,
    create_topics,
    drop_topics,
    process_cpu_s,
    unique,
)
from pyrula_stream.bench.load import (
    CompletionReader,
    Record,
    Submitter,
    event_type,
    turn_requests,
    wake_on_first,
)
from pyrula_stream.bench.workload import QUESTION
from pyrula_stream.kafka.admin import agent_topic_specs
from pyrula_stream.kafka.config import client_config, new_consumer, new_producer
from pyrula_stream.kafka.partitioner import PARTITIONER
from pyrula_stream.wire.events import EventType


@dataclass
class FloorRun:
    turns: int
    seconds: float
    transactions: int
    records_written: int
    cpu_s: float = 0.0
    """CPU time of the floor's process over the timed window (its loop, submitter, reader)."""
    broker_cpu_s: float | None = None
    """The broker's CPU time over the same window (None: no local broker to read)."""

    @property
    def turns_per_s(self) -> float:
        return self.turns / self.seconds


def split_at_first_tool(template: TurnRecords) -> tuple[TurnRecords, TurnRecords]:
    """A turn's records as the two commits of a turn whose tool has effects.

    The first holds what must be durable before the tool acts: the events before the
    first ``tool:start`` and the journal records before the second step entry (keys
    ``<turn>/0``, ``<turn>/progress``, ``<turn>/1``, ...: step 0 is the model's response;
    without numbered keys, the same share of the journal as of the events). The second
    holds the rest, the result record and (in the loop) the offset. The split changes
    which records ride which commit, not how many there are.
    """
    events = [r for r in template if r[0] == "events"]
    journal = [r for r in template if r[0] == "journal"]
    rest = [r for r in template if r[0] not in ("events", "journal")]
    cut = next(
        (i for i, r in enumerate(events) if event_type(r[2]) == EventType.TOOL_START),
        len(events) // 2,
    )
    jcut = next(
        (i for i, r in enumerate(journal) if _step_index(r[1]) >= 1),
        round(len(journal) * cut / max(1, len(events))),
    )
    return [*journal[:jcut], *events[:cut]], [*journal[jcut:], *events[cut:], *rest]


def _step_index(key: bytes) -> int:
    """The step number of a journal key ``<turn>/<n>`` (-1 for any other record)."""
    suffix = key.split(b"/", 1)[-1]
    return int(suffix) if suffix.isdigit() else -1


class FloorProcessor:
    """The loop, in its own thread: consume a batch, write its records, commit with offsets.

    ``rekey`` writes each template record under the input's turn id instead of the
    captured turn's (``<turn>/...`` keeps its suffix), so a reader can clock each input.
    ``commits=2`` (with ``batch=1``) commits each input's records in two transactions in
    sequence, the offset with the second (``split_at_first_tool``).
    """

    def __init__(
        self,
        bootstrap: str,
        *,
        turns_topic: str,
        journal_topic: str,
        events_topic: str,
        results_topic: str,
        partitions: int,
        templates: Sequence[TurnRecords],
        batch: int,
        rekey: bool = False,
        commits: int = 1,
        kafka_config: Mapping[str, Any] | None = None,
    ) -> None:
        if commits not in (1, 2) or (commits == 2 and batch != 1):
            raise ValueError("commits=2 is the latency floor's: one input per transaction")
        self.rekey = rekey
        self.turns_topic = turns_topic
        self.journal_topic = journal_topic
        self.events_topic = events_topic
        self.results_topic = results_topic
        self.partitions = partitions
        self.templates = templates
        self.phases: list[tuple[TurnRecords, ...]] = [
            split_at_first_tool(t) if commits == 2 else (t,) for t in templates
        ]
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
                msgs = [
                    m for m in wake_on_first(self._consumer, self.batch, 0.05) if m.error() is None
                ]
                if not msgs:
                    continue
                if len(msgs) == 1 and len(self.phases[n % len(self.phases)]) == 2:
                    # The tool-with-effects floor: the first part durable before the rest.
                    self._producer.begin_transaction()
                    self._write(msgs[0], self.phases[n % len(self.phases)][0])
                    self._producer.commit_transaction(60)
                    self.transactions += 1
                self._producer.begin_transaction()
                offsets: dict[int, int] = {}
                for msg in msgs:
                    p = msg.partition() or 0
                    self._write(msg, self.phases[n % len(self.phases)][-1])
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

    def _write(self, msg: Any, records: TurnRecords) -> None:
        """One input's share of a template: journal to its partition, the rest by key."""
        p = msg.partition() or 0
        for kind, key, value, headers in records:
            if self.rekey:
                key = (msg.key() or b"") + key[len(key.split(b"/", 1)[0]) :]
            if kind == "journal":
                self._produce(self.journal_topic, key, value, headers, partition=p)
            elif kind == "results":
                self._produce(self.results_topic, key, value, headers)
            else:
                self._produce(self.events_topic, key, value, headers)
            self.records_written += 1

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
    broker: int | None = None,
) -> FloorRun:
    """One floor run over the same encoded turn requests the framework got (blocking);
    ``broker``: the broker's pid, whose CPU time over the timed window is recorded."""
    name = unique("floor")
    specs = agent_topic_specs(name, prefix=PREFIX, partitions=partitions)
    create_topics(bootstrap, specs)
    turns_topic, events_topic, journal_topic, results_topic = (
        f"{PREFIX}.{name}.{t}" for t in ("turns", "events", "journal", "results")
    )
    floor = FloorProcessor(
        bootstrap,
        turns_topic=turns_topic,
        journal_topic=journal_topic,
        events_topic=events_topic,
        results_topic=results_topic,
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
        cpu0, broker0 = time.process_time(), process_cpu_s(broker)
        started = submitter.send_all(turns_topic, requests)
        deadline = time.monotonic() + max(120.0, len(requests) / 10)
        while not reader.reached(len(requests)):
            if floor.error is not None:
                raise RuntimeError(f"floor loop failed: {floor.error}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"floor run: {reader.terminal}/{len(requests)} turns")
            time.sleep(0.02)
        seconds = reader.last_done - started
        cpu_s, broker1 = time.process_time() - cpu0, process_cpu_s(broker)
    finally:
        floor.stop()
        reader.close()
        submitter.close()
        if not keep_topics:
            drop_topics(bootstrap, [s.name for s in specs])
    broker_s = None if broker0 is None or broker1 is None else broker1 - broker0
    return FloorRun(
        len(requests), seconds, floor.transactions, floor.records_written, cpu_s, broker_s
    )


def run_floor_process(
    bootstrap: str,
    *,
    turns: int,
    templates: Sequence[TurnRecords],
    partitions: int,
    batch: int,
    keep_topics: bool = False,
    broker: int | None = None,
) -> FloorRun:
    """``run_floor`` in a fresh process of its own (blocking): nothing of the bench's
    process (its heap, its threads, the framework's leftovers) shares the floor's GIL,
    and its CPU time is the floor's alone."""
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=1, mp_context=context) as pool:
        future = pool.submit(
            _floor_child, bootstrap, turns, list(templates), partitions, batch, keep_topics, broker
        )
        return future.result()


def _floor_child(
    bootstrap: str,
    turns: int,
    templates: list[TurnRecords],
    partitions: int,
    batch: int,
    keep_topics: bool,
    broker: int | None,
) -> FloorRun:
    requests = turn_requests("floor", turns, QUESTION)
    return run_floor(
        bootstrap,
        requests=requests,
        templates=templates,
        partitions=partitions,
        batch=batch,
        keep_topics=keep_topics,
        broker=broker,
    )


@dataclass
class FloorLatency:
    """End-to-end time of each paced input through the floor loop, one per transaction."""

    turns: int
    rate_per_s: float
    latencies_ms: list[float]
    transactions: int


class FloorLatencySession:
    """The latency floor's loop, warmed up, timing paced blocks of inputs one at a time
    (the blocks alternate with the framework's, on the same schedule); blocking calls.

    One input per transaction (``batch=1``; ``commits=2``: two in sequence), the same
    submitter, pacing and reader as the framework's latency run; a sample is the time
    from just before a request is produced to its terminal event read back under
    ``read_committed``.
    """

    def __init__(
        self,
        bootstrap: str,
        *,
        agent: str,
        rate: float,
        templates: Sequence[TurnRecords],
        partitions: int,
        warmup: int = 10,
        keep_topics: bool = False,
        commits: int = 1,
    ) -> None:
        self.bootstrap, self.agent, self.rate = bootstrap, agent, rate
        self.warmup, self.keep_topics = warmup, keep_topics
        name = unique("floorlat")
        self.specs = agent_topic_specs(name, prefix=PREFIX, partitions=partitions)
        self.turns_topic, events_topic, journal_topic, results_topic = (
            f"{PREFIX}.{name}.{t}" for t in ("turns", "events", "journal", "results")
        )
        self.sent: dict[bytes, float] = {}
        self._timed = 0
        create_topics(bootstrap, self.specs)
        self.floor = FloorProcessor(
            bootstrap,
            turns_topic=self.turns_topic,
            journal_topic=journal_topic,
            events_topic=events_topic,
            results_topic=results_topic,
            partitions=partitions,
            templates=templates,
            batch=1,
            rekey=True,
            commits=commits,
        )
        self.submitter = Submitter(bootstrap)
        self.reader = CompletionReader(bootstrap, events_topic, partitions)

    def __enter__(self) -> FloorLatencySession:
        try:
            self.floor.start()
            if not self.floor.assigned.wait(120):
                raise TimeoutError("the floor's consumer got no partitions")
            warm = turn_requests(self.agent, self.warmup, QUESTION)
            self.submitter.send_all(self.turns_topic, warm)
            self._wait_until(self.warmup, "floor latency warm-up")
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def _wait_until(self, n: int, what: str) -> None:
        deadline = time.monotonic() + 120 + n / 10
        while not self.reader.reached(n):
            if self.floor.error is not None:
                raise RuntimeError(f"floor loop failed: {self.floor.error}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what}: {self.reader.terminal}/{n} turns")
            time.sleep(0.02)

    def block(self, turns: int) -> None:
        """Send ``turns`` inputs at the paced rate and wait until all are read back."""
        timed = turn_requests(self.agent, turns, QUESTION)
        sent = self.submitter.send_paced(self.turns_topic, timed, self.rate)
        self._timed += turns
        self._wait_until(self.warmup + self._timed, "floor latency run")
        self.sent.update(sent)

    def __exit__(self, *exc: object) -> None:
        try:
            self.floor.stop()
        finally:
            self.reader.close()
            self.submitter.close()
            if not self.keep_topics:
                drop_topics(self.bootstrap, [s.name for s in self.specs])

    def result(self) -> FloorLatency:
        """Every timed input's end-to-end time, in the order they were sent."""
        latencies = [(self.reader.done[k] - t) * 1000 for k, t in self.sent.items()]
        return FloorLatency(len(self.sent), self.rate, latencies, self.floor.transactions)


def run_floor_latency(
    bootstrap: str,
    *,
    agent: str,
    turns: int,
    rate: float,
    templates: Sequence[TurnRecords],
    partitions: int,
    warmup: int = 10,
    keep_topics: bool = False,
    commits: int = 1,
) -> FloorLatency:
    """The latency floor (blocking): the raw loop at the latency phase's paced rate, one
    block of ``turns`` inputs (``FloorLatencySession``)."""
    with FloorLatencySession(
        bootstrap,
        agent=agent,
        rate=rate,
        templates=templates,
        partitions=partitions,
        warmup=warmup,
        keep_topics=keep_topics,
        commits=commits,
    ) as session:
        session.block(turns)
    return session.result()
