"""The consumer-group worker: assignment, restore, per-turn tasks, commit, cancel, poison.

One asyncio loop runs many turns. The group consumer polls in a thread; its rebalance
callbacks hand over to the loop and wait, so a partition is restored from its journal
before any of its turns runs, and revoked turns stop before the partition moves on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import socket
import tempfile
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from types import TracebackType
from typing import Any, Literal, Self

import httpx

from pyrula_stream import serde
from pyrula_stream.agent import KafkaAgent
from pyrula_stream.errors import (
    ConfigurationError,
    ErrorCode,
    MalformedRecordError,
    TopicDriftError,
    TurnCancelled,
    TurnNotRecorded,
    UserError,
)
from pyrula_stream.events import RunError
from pyrula_stream.health import start_health_server
from pyrula_stream.history import TurnRecording, load_recording
from pyrula_stream.kafka.admin import apply_topics, broker_answers, missing_topics
from pyrula_stream.kafka.cache_store import KafkaCacheStore
from pyrula_stream.kafka.config import is_connection_failure, registry_config
from pyrula_stream.kafka.consumers import (
    ControlReader,
    RepliesReader,
    reader_consumer,
    reader_group_id,
)
from pyrula_stream.kafka.group import BadRecord, ConsumerFenced, TurnConsumer, TurnRecord
from pyrula_stream.kafka.memory_store import KafkaMemory
from pyrula_stream.kafka.offsets import ConsumedRecord, committed_offset, watermarks
from pyrula_stream.kafka.table import PartitionedTable, SqliteView
from pyrula_stream.kafka.transactions import BatchWriter, Offsets, ProducerFenced
from pyrula_stream.llm.base import LLMClient
from pyrula_stream.mcp.pool import MCPPool
from pyrula_stream.observability import logs
from pyrula_stream.observability.telemetry import WorkerTelemetry
from pyrula_stream.observability.tracing import TraceCarrier
from pyrula_stream.options import PoisonOptions, WorkerOptions
from pyrula_stream.records import (
    ControlRequest,
    OutRecord,
    content_type_header,
    dead_letter_source,
)
from pyrula_stream.runtime.committer import GroupCommitter
from pyrula_stream.runtime.execution import TurnExecutor
from pyrula_stream.runtime.journal import IdempotencyKeys, PartitionJournal, TurnJournal
from pyrula_stream.runtime.parking import ParkedTurns
from pyrula_stream.runtime.partition import PartitionState, QueuedTurn
from pyrula_stream.runtime.turn import TurnRuntime, TurnTopics
from pyrula_stream.serde import TurnRequest
from pyrula_stream.subagents import Reply, cursor_record, parse_reply, reply_journal_record
from pyrula_stream.threads import PartitionThreads
from pyrula_stream.tool_cache import CacheStore, InProcessCacheStore
from pyrula_stream.versions import known_versions, missing_version

log = logging.getLogger(__name__)

REVOKE_COMMIT_WAIT_S = 10.0
"""How long a revoke waits for a transaction in flight (the transaction timeout)."""

BROKER_WAIT_MAX_S = 10.0
"""Longest pause between two looks for a Kafka that does not answer yet."""

MAX_REMEMBERED_CANCELS = 100_000
"""Cancel requests kept for turns this worker has not seen yet (oldest dropped first)."""

_State = Literal["new", "running", "stopped"]

EXPIRY_INTERVAL_S = 60.0
"""How often idempotency keys past their TTL are looked for (and tombstoned)."""


class SessionLost(Exception):
    """The worker's clients must be recreated: it drops its turns and rejoins the group."""


@dataclass
class _Running:
    runtime: TurnRuntime
    task: asyncio.Task[None]
    partition: int
    offset: int


@dataclass
class _Session:
    """The Kafka clients of one group membership; recreated after fencing."""

    writer: BatchWriter
    consumer: TurnConsumer
    restorer: Any
    control: ControlReader
    replies: RepliesReader
    committer: GroupCommitter
    loop: asyncio.AbstractEventLoop

    def close(self) -> None:
        self.consumer.close()
        self.restorer.close()
        self.control.close()
        self.replies.close()
        self.writer.close()


class KafkaWorker:
    """Runs one agent's turns as a member of the agent's consumer group.

    ``await worker.run()`` runs until ``stop()``; or ``async with KafkaWorker(...)`` runs it
    in the background and stops it (draining its turns) on exit. A worker runs once.
    """

    def __init__(
        self, agent: KafkaAgent, *, bootstrap_servers: str, options: WorkerOptions | None = None
    ) -> None:
        if not isinstance(agent, KafkaAgent):
            raise ConfigurationError(
                f"KafkaWorker runs one @kafka_agent, not {type(agent).__name__}: for several "
                "agents in one process use MeshWorker([...]) or run_worker([...]) (on the "
                "command line: pyrula-stream worker mod:a mod:b)"
            )
        if agent.llm is None:
            raise ConfigurationError(
                f"agent '{agent.name}' has no model: pass llm= to @kafka_agent (AnthropicLLM, "
                "OpenAILLM, or FakeLLM for a scripted model in tests)"
            )
        if options is not None and options.static_membership and not options.worker_id:
            raise ConfigurationError(
                "static_membership needs a stable worker_id: it becomes the consumer's "
                "group.instance.id, which must be the same after a restart"
            )
        self.agent = agent
        self.llm: LLMClient = agent.llm
        self.bootstrap_servers = bootstrap_servers
        self.options = options or WorkerOptions()
        self.topics = agent.topics
        self.worker_id = self.options.worker_id or f"{socket.gethostname()}-{os.getpid()}"
        self.group_id = self.options.group_id or f"{agent.prefix}.{agent.name}.workers"
        self.telemetry = WorkerTelemetry(
            agent.name, topics=self.topics, worker_id=self.worker_id, enabled=self.options.telemetry
        )
        self.metrics = self.telemetry.metrics
        self.turns_finished = 0
        self.restored_records = 0
        self.sessions = 0
        self._state: _State = "new"
        self._task: asyncio.Task[None] | None = None
        self._session: _Session | None = None
        self._executor: TurnExecutor | None = None
        self._cache: CacheStore = InProcessCacheStore()
        self._memory: KafkaMemory | None = None
        self._parts: dict[int, PartitionState] = {}
        self._running: dict[str, _Running] = {}
        self._cancels: OrderedDict[str, tuple[str, str]] = OrderedDict()
        self._waiting: list[tuple[int, QueuedTurn]] = []
        self._parked = ParkedTurns(self._parts, self._admit, self._cancels.__contains__)
        self.metrics.watch_parked(lambda: self._parked.count)
        self._known_topics: set[str] = set()
        self._stop_requested = False
        self._ready = False
        self._joined = asyncio.Event()
        self._callback_error: Exception | None = None
        self._journal_table = PartitionedTable(self.topics.journal)
        self._threads_table = PartitionedTable(self.topics.threads)
        self._state_dir: Path | None = None  # created by run(): options.state_dir or a temp dir
        self._next_expiry = 0.0
        self._reader_codec: serde.ValueCodec | None = None
        self._writer_codec: serde.ValueCodec = serde.SCHEMALESS

    # -- lifecycle ------------------------------------------------------------------------

    @property
    def assigned_partitions(self) -> int:
        return len(self._parts)

    @property
    def done(self) -> bool:
        """Whether ``run()`` has returned (or failed); see ``__aexit__`` for its error."""
        return self._state == "stopped"

    @property
    def ready(self) -> bool:
        return self._ready and not self._stop_requested

    @property
    def committer(self) -> GroupCommitter:
        """The current session's group committer (there is one while the worker runs)."""
        if self._session is None:
            raise UserError(f"the worker of '{self.agent.name}' is not running")
        return self._session.committer

    async def wait_joined(self) -> None:
        """Return once the worker has joined its group (its first session started)."""
        await self._joined.wait()

    def stop(self) -> None:
        """Ask the worker to stop: stop fetching, let turns reach a step boundary, leave.

        Safe to call before the worker runs and more than once.
        """
        self._stop_requested = True

    async def __aenter__(self) -> Self:
        """Start ``run()`` in the background; return once the worker joined its group."""
        self._task = asyncio.create_task(self.run(), name=f"worker-{self.agent.name}")
        joined = asyncio.ensure_future(self._joined.wait())
        await asyncio.wait({self._task, joined}, return_when=asyncio.FIRST_COMPLETED)
        joined.cancel()
        if self._task.done():
            self._task.result()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
        if self._task is not None:
            await self._task

    async def run(self) -> None:
        """Run until ``stop()``; recreates the clients after a fatal (fenced) error.

        ``/readyz`` (with ``health_port``) answers from the start: 503 until the worker
        has joined its group, so a worker waiting for Kafka is alive but not ready. Kafka
        that is down at the start, or goes away, is waited for with backoff.
        """
        if self._state != "new":
            raise UserError(f"this worker of '{self.agent.name}' already ran; create a new one")
        self._state = "running"
        health = None
        if self.options.health_port is not None:
            health = await start_health_server(
                self.options.health_host,
                self.options.health_port,
                lambda: self.ready,
                metrics=self.metrics.exposition,
            )
        own_state_dir = self.options.state_dir is None
        self._state_dir = Path(
            tempfile.mkdtemp(prefix=f"pyrula-{self.agent.name}-")
            if self.options.state_dir is None
            else self.options.state_dir
        )
        logs.bind(agent=self.agent.name, worker_id=self.worker_id)
        try:
            while not self._stop_requested:
                await self._wait_for_broker()
                if self._stop_requested:
                    return
                try:
                    await self._run()
                    return
                except Exception as exc:
                    if not is_connection_failure(exc):
                        raise
                    log.warning("lost Kafka (%s); waiting for it, then starting again", exc)
        finally:
            self._state = "stopped"
            if health is not None:
                health.close()
            if own_state_dir:
                shutil.rmtree(self._state_dir, ignore_errors=True)
            else:  # the local tables are rebuilt from the journal on the next assignment
                for table in self._state_dir.glob(self._table_file("*")):
                    table.unlink(missing_ok=True)

    async def _wait_for_broker(self) -> None:
        """Kafka may come up after the worker (a restart, a deploy): wait with backoff."""
        delay, waited, started = 0.5, False, time.monotonic()
        while not self._stop_requested:
            if await asyncio.to_thread(
                partial(
                    broker_answers,
                    self.bootstrap_servers,
                    2.0,
                    kafka_config=self.options.kafka_config,
                )
            ):
                if waited:
                    log.warning(
                        "Kafka at %s answers after %.0fs; starting",
                        self.bootstrap_servers,
                        time.monotonic() - started,
                    )
                return
            if not waited:
                log.warning(
                    "Kafka at %s does not answer; waiting for it (retrying with backoff up "
                    "to %.0fs; /readyz says not ready until the worker has started)",
                    self.bootstrap_servers,
                    BROKER_WAIT_MAX_S,
                )
                waited = True
            await asyncio.sleep(delay)
            delay = min(delay * 2, BROKER_WAIT_MAX_S)

    async def _run(self) -> None:
        """One start: topics, the shared cache, then group sessions until stopped."""
        try:
            await self._check_topics()
            await asyncio.to_thread(self._open_codecs)
            if self.options.shared_tool_cache:
                shared = KafkaCacheStore(
                    self.bootstrap_servers,
                    prefix=self.agent.prefix,
                    client_id=f"{self.worker_id}-cache",
                    kafka_config=self.options.kafka_config,
                )
                await asyncio.to_thread(shared.start)
                self._cache = shared
            if self.options.memory_backend is None:
                assert self._state_dir is not None, "run() sets the state dir"
                self._memory = KafkaMemory(
                    self.bootstrap_servers,
                    state_dir=self._state_dir,
                    client_id=f"{self.worker_id}-memory",
                    prefix=self.agent.prefix,
                    kafka_config=self.options.kafka_config,
                )
                await asyncio.to_thread(self._memory.start)
            async with httpx.AsyncClient() as http, MCPPool(self.agent.mcp_servers) as mcp:
                self._executor = TurnExecutor(
                    self.agent,
                    self.llm,
                    http=http,
                    cache=self._cache,
                    options=self.options,
                    worker_id=self.worker_id,
                    add_records=lambda records: self.committer.add_records(records),
                    topic_exists=self._topic_exists,
                    mcp_pool=mcp,
                    load_recording=self._load_recording,
                    memory=self.options.memory_backend or self._memory,
                )
                while not self._stop_requested:
                    try:
                        await self._run_session()
                    except (ProducerFenced, ConsumerFenced, SessionLost) as exc:
                        log.warning("%s: dropping turns and rejoining", exc)
                        self.metrics.was_fenced()
                        await self._drop_all_turns()
        finally:
            if isinstance(self._cache, KafkaCacheStore):
                await asyncio.to_thread(self._cache.close)
                self._cache = InProcessCacheStore()
            if self._memory is not None:
                await asyncio.to_thread(self._memory.close)
                self._memory = None
            self._close_codecs()

    async def _topic_exists(self, topic: str) -> bool:
        """Whether a sub-agent's turns topic exists (a found topic is remembered)."""
        if topic in self._known_topics:
            return True
        absent = await asyncio.to_thread(
            partial(
                missing_topics,
                self.bootstrap_servers,
                [topic],
                kafka_config=self.options.kafka_config,
            )
        )
        if not absent:
            self._known_topics.add(topic)
        return not absent

    async def _check_topics(self) -> None:
        """Create what is missing; refuse drift and output topics that do not exist."""
        if self.options.apply_topics:
            report = await asyncio.to_thread(
                partial(
                    apply_topics,
                    self.bootstrap_servers,
                    self.agent.topic_specs(),
                    kafka_config=self.options.kafka_config,
                )
            )
            if not report.ok:
                raise TopicDriftError(
                    f"agent '{self.agent.name}' refuses to start: its topics differ from the "
                    "spec:\n  " + "\n  ".join(report.drift)
                )
        routed = sorted(self.agent.event_routing.all_topics() - {self.topics.events})
        absent = await asyncio.to_thread(
            partial(
                missing_topics,
                self.bootstrap_servers,
                routed,
                kafka_config=self.options.kafka_config,
            )
        )
        if absent:
            raise ConfigurationError(
                f"agent '{self.agent.name}' routes events to output topics that do not exist: "
                f"{', '.join(absent)}; create them (they are yours, so they are never created "
                "for you) or remove them from output_topics"
            )

    def _open_codecs(self) -> None:
        """Schema Registry framing (opt-in; see ``kafka/schema_registry.py``)."""
        if self._reader_codec is None and registry_config(self.options.kafka_config) is not None:
            from pyrula_stream.kafka.schema_registry import event_codecs

            self._reader_codec, self._writer_codec = event_codecs(
                self.options.kafka_config,
                self.options.serialization,
                sorted(self.agent.event_routing.all_topics()),
            )

    def _close_codecs(self) -> None:
        if self._reader_codec is not None:
            self._reader_codec.close()
        self._reader_codec, self._writer_codec = None, serde.SCHEMALESS

    async def _run_session(self) -> None:
        self.sessions += 1
        exactly_once = self.options.processing_guarantee == "exactly_once_v2"
        writer = BatchWriter(
            self.bootstrap_servers,
            transactional_id=f"{self.agent.prefix}.{self.agent.name}.{self.worker_id}",
            exactly_once=exactly_once,
            extra=self.options.producer_config,
            kafka_config=self.options.kafka_config,
        )
        await asyncio.to_thread(writer.start)
        consumer = TurnConsumer(
            self.bootstrap_servers,
            topic=self.topics.turns,
            agent=self.agent.name,
            group_id=self.group_id,
            client_id=self.worker_id,
            exactly_once=exactly_once,
            group_instance_id=self.worker_id if self.options.static_membership else None,
            group_protocol=self.options.group_protocol,
            extra=self.options.consumer_config,
            on_lag=self.telemetry.on_lag,
            kafka_config=self.options.kafka_config,
            codec=self._reader_codec,
        )
        # Readers never join their group, but a secured cluster wants DESCRIBE on it.
        readers = reader_group_id(self.agent.prefix, self.agent.name)
        settings = self.options.kafka_config
        session = self._session = _Session(
            writer=writer,
            consumer=consumer,
            restorer=reader_consumer(
                self.bootstrap_servers,
                client_id=f"{self.worker_id}-restore",
                kafka_config=settings,
                group_id=readers,
            ),
            control=ControlReader(
                self.bootstrap_servers,
                self.topics.control,
                client_id=f"{self.worker_id}-control",
                kafka_config=settings,
                group_id=readers,
            ),
            replies=RepliesReader(
                self.bootstrap_servers,
                self.topics.replies,
                client_id=f"{self.worker_id}-replies",
                kafka_config=settings,
                group_id=readers,
            ),
            committer=GroupCommitter(
                self._write,
                self._committable_offsets,
                self._on_abort,
                interval_s=self.options.commit_interval_s,
                telemetry=self.telemetry,
                on_committed=self._on_committed,
            ),
            loop=asyncio.get_running_loop(),
        )
        consumer.subscribe(self._on_assign_cb, self._on_revoke_cb)
        committer_task = asyncio.create_task(session.committer.run(), name="committer")
        self._ready = True
        self._joined.set()
        try:
            await self._poll_loop(session, committer_task)
        finally:
            self._ready = False
            await self._drain()
            committer_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, ProducerFenced):
                await committer_task
            await asyncio.to_thread(session.close)

    async def _poll_loop(self, session: _Session, committer_task: asyncio.Task[None]) -> None:
        while not self._stop_requested:
            if committer_task.done():
                committer_task.result()  # re-raises ProducerFenced
            intake = await asyncio.to_thread(session.consumer.poll)
            if self._callback_error is not None:
                error, self._callback_error = self._callback_error, None
                raise SessionLost(f"rebalance handling failed: {error!r}") from error
            for item in intake:
                if isinstance(item, BadRecord):
                    self._on_bad_record(item)
                else:
                    self._on_turn_record(item)
            for value in session.control.poll():
                self._on_control_record(value)
            for reply in session.replies.poll():
                self._on_reply(reply)
            self._apply_backpressure(session.consumer)

    async def _drain(self) -> None:
        """Stop fetching; give running turns ``shutdown_grace`` to finish, then stop them.

        Only a requested stop waits: after fencing the turns are no longer ours to finish.
        """
        if self._running and self._stop_requested:
            tasks = [r.task for r in self._running.values()]
            await asyncio.wait(tasks, timeout=self.options.shutdown_grace)
        await self._drop_all_turns(flush=True)

    async def _drop_all_turns(self, *, flush: bool = False) -> None:
        ids = set(self._running)
        for rt in list(self._running.values()):
            rt.task.cancel()
        for rt in list(self._running.values()):
            with contextlib.suppress(BaseException):
                await rt.task
        self._running.clear()
        if self._session is not None:
            self.committer.purge(ids)
            if flush:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(self.committer.flush(), self.options.cancel_timeout)
        self._parts.clear()
        self._waiting.clear()

    # -- rebalance (called in the consumer thread) ----------------------------------------

    def _on_assign_cb(self, partitions: list[int]) -> None:
        session = self._session
        assert session is not None
        try:
            restored = {p: self._restore(p) for p in partitions}
            asyncio.run_coroutine_threadsafe(self._install(restored), session.loop).result()
        except Exception as exc:  # an exception must not die inside librdkafka's callback
            self._callback_error = exc

    def _on_revoke_cb(self, partitions: list[int]) -> None:
        session = self._session
        assert session is not None
        try:
            asyncio.run_coroutine_threadsafe(self._revoke(set(partitions)), session.loop).result()
        except Exception as exc:
            self._callback_error = exc

    def _restore(self, partition: int) -> PartitionState:
        """Rebuild a partition's state from its journal (runs in the assign callback).

        The input partition's end is read after the journal: every turn the journal shows
        finished was read before that, so its request lies below the end.
        """
        assert self._state_dir is not None, "run() sets the state dir"
        session = self._session
        assert session is not None
        started = time.monotonic()
        journal = restore_journal(
            session.restorer,
            self._journal_table,
            partition,
            self._state_dir / self._table_file(str(partition)),
        )
        self.restored_records += journal.records_read
        threads = PartitionThreads()
        self.restored_records += threads.restore(
            self._threads_table.restore(session.restorer, partition)
        )
        _, end = watermarks(session.restorer, self.topics.turns, partition)
        committed = committed_offset(session.consumer.client, self.topics.turns, partition)
        self.metrics.restored(time.monotonic() - started, journal.records_read)
        return PartitionState(
            partition, journal, restored_end=end, restored_committed=committed, threads=threads
        )

    def _table_file(self, partition: str) -> str:
        """The file of a partition's idempotency keys: one per group, worker and partition."""
        return f"{self.group_id}.{self.worker_id}.journal-{partition}.sqlite"

    async def _install(self, restored: dict[int, PartitionState]) -> None:
        ttl_ms = int(self.options.idempotency_ttl_s * 1000)
        for p, state in restored.items():
            self._parts[p] = state
            # Replies and parked turns need the watermark to start at the committed offset.
            state.watermark.start_at(state.restored_committed or 0)
            # housekeeping: keys past the idempotency TTL, terminal records nothing re-reads
            expired = state.journal.expire(int(time.time() * 1000), ttl_ms)
            if state.restored_committed is not None:
                expired += state.committed(state.restored_committed)
            if expired:
                self.committer.add_records([self._tombstone(p, key) for key in expired])
        assert self._session is not None
        self._session.replies.assign({p: s.journal.reply_cursor for p, s in restored.items()})
        for p in restored:
            self._parked.rearm(p)

    def _tombstone(self, partition: int, key: str) -> OutRecord:
        return self._journal_table.tombstone(key, partition, [content_type_header("journal_entry")])

    async def _revoke(self, partitions: set[int]) -> None:
        """Stop the partitions' turns and let a commit in flight end before they move on."""
        for p in partitions:  # first, so nothing starts or restarts on them from now on
            self._parts.pop(p, None)
        if self._session is not None:
            self._session.replies.unassign(partitions)
        self._waiting = [(p, q) for p, q in self._waiting if p not in partitions]
        lost = {t: r.task for t, r in self._running.items() if r.partition in partitions}
        for turn_id, task in lost.items():
            task.cancel()
            del self._running[turn_id]
        if lost:
            await asyncio.wait(lost.values(), timeout=self.options.cancel_timeout)
        # Buffered replies of these partitions are the new owner's to take now (purged
        # again after the commit in flight: an abort puts its replies back).
        replies = {_replies_owner(p) for p in partitions}
        self.committer.purge(set(lost) | replies)
        if self.options.processing_guarantee == "exactly_once_v2":
            try:
                await asyncio.wait_for(self.committer.wait_idle(), REVOKE_COMMIT_WAIT_S)
            except TimeoutError:
                log.error(
                    "a commit was still in flight %ss after partitions %s were revoked",
                    REVOKE_COMMIT_WAIT_S,
                    sorted(partitions),
                )
        self.committer.purge(replies)
        self.committer.forget_offsets({(self.topics.turns, p) for p in partitions})

    # -- records --------------------------------------------------------------------------

    def _on_bad_record(self, bad: BadRecord) -> None:
        """Dead-letter it (riding the next commit with its offset) and move on."""
        ps = self._parts.get(bad.partition)
        if ps is None:
            return
        self.committer.add_records(
            [
                dead_letter_source(
                    self.topics.dlq,
                    bad.source,
                    bad.reason,
                    ErrorCode.INVALID_REQUEST,
                    worker=self.worker_id,
                )
            ]
        )
        log.warning("dead-lettered %s: %s", bad.source.source, bad.reason)
        ps.watermark.track(bad.offset)
        ps.watermark.done(bad.offset)
        self.committer.offsets_changed()

    def _on_turn_record(self, record: TurnRecord) -> None:
        p, offset, request = record.partition, record.offset, record.request
        ps = self._parts.get(p)
        if ps is None:
            return
        ps.watermark.track(offset)
        if (
            ps.is_finished(request)
            or request.turn_id in self._running
            or request.turn_id in ps.queued_ids
            or request.turn_id in ps.parked
        ):
            ps.watermark.done(offset)
            self.committer.offsets_changed()
            return
        queued = QueuedTurn(offset, request, ps.original_turn(request), record.trace)
        if request.idempotency_key and queued.duplicate_of is None:
            ps.running_keys[request.idempotency_key] = request.turn_id
        if ps.enqueue(queued):
            self._admit(p, queued)

    def _admit(self, partition: int, queued: QueuedTurn) -> None:
        if self._stop_requested:
            return  # not started, not committed: the next owner of the partition runs it
        if len(self._running) >= self.options.max_concurrent_turns:
            self._waiting.append((partition, queued))
        else:
            self._start_turn(partition, queued)

    def _apply_backpressure(self, consumer: TurnConsumer) -> None:
        while self._waiting and len(self._running) < self.options.max_concurrent_turns:
            p, queued = self._waiting.pop(0)
            if p in self._parts:
                self._start_turn(p, queued)
        full = len(self._running) + len(self._waiting) >= self.options.max_concurrent_turns
        consumer.set_paused(full)

    def _on_control_record(self, value: bytes | None) -> None:
        control = ControlRequest.parse(value)
        if control is None:
            log.warning("ignoring unreadable control record: %r", value)
            return
        reason = control.reason or control.action
        self._cancels[control.turn_id] = (control.action, reason)
        self._cancels.move_to_end(control.turn_id)
        while len(self._cancels) > MAX_REMEMBERED_CANCELS:  # the control topic is replayed
            self._cancels.popitem(last=False)
        running = self._running.get(control.turn_id)
        if running is None:
            self._parked.wake_to_cancel(control.turn_id)
            return
        running.runtime.cancel_reason = reason
        if control.action == "terminate":
            running.task.cancel(msg="terminate")

    def _on_reply(self, record: ConsumedRecord) -> None:
        """A child's outcome: journal it with the replies position in one transaction
        that also carries the input offsets (a worker that lost the partition is fenced)."""
        p = record.partition
        ps = self._parts.get(p)
        if ps is None:
            return
        records = [cursor_record(self.topics.journal, p, record.offset + 1)]
        reply: Reply | None = None
        try:
            reply = parse_reply(record.value)
        except MalformedRecordError as exc:
            log.warning(
                "skipping unreadable reply at %s[%d]@%d: %s",
                self.topics.replies,
                p,
                record.offset,
                exc,
            )
        if reply is not None and self._parked.wants(ps, reply):
            records.append(reply_journal_record(self.topics.journal, p, reply))
        else:
            reply = None
        committed = self.committer.durable_records(_replies_owner(p), records)
        if reply is not None:
            taken = reply

            def on_commit(fut: asyncio.Future[None]) -> None:
                if not fut.cancelled() and fut.exception() is None:
                    self._parked.reply_committed(p, taken)

            committed.add_done_callback(on_commit)

    @property
    def running_turns(self) -> int:
        """Turns with a task on this worker now."""
        return len(self._running)

    @property
    def parked_turns(self) -> int:
        """Turns of this worker's partitions that only their journal holds now."""
        return self._parked.count

    # -- turns ----------------------------------------------------------------------------

    def _start_turn(self, partition: int, queued: QueuedTurn) -> None:
        ps = self._parts[partition]
        turn_id = queued.request.turn_id
        restored = ps.journal.turns.get(turn_id)
        journal = restored.materialize() if restored else TurnJournal(turn_id)
        version = missing_version(self.agent, journal)
        if version is not None:  # pinned elsewhere: not started, offset not committed
            log.warning(
                "turn %s is pinned to version %s, which this worker lacks (it has %s); "
                "left for a worker that has it",
                turn_id,
                version,
                known_versions(self.agent),
            )
            return
        ps.journal.turns[turn_id] = journal  # replies land here while the turn runs
        runtime = self._new_runtime(partition, queued.request, journal, queued.trace)
        runtime.resumed = ps.parked.pop(turn_id, None) is not None
        ps.resuming.discard(turn_id)
        turn = runtime.telemetry.track(partial(self._run_turn, runtime, queued), runtime.attempt)
        task = asyncio.create_task(turn, name=runtime.turn_id)
        self._running[runtime.turn_id] = _Running(runtime, task, partition, queued.offset)

    def _new_runtime(
        self,
        partition: int,
        request: TurnRequest,
        journal: TurnJournal,
        trace: TraceCarrier | None = None,
    ) -> TurnRuntime:
        limits = self.agent.limits
        runtime = TurnRuntime(
            request=request,
            topics=TurnTopics(
                self.topics.journal,
                self.agent.event_routing,
                partition,
                history=self.topics.history if self.agent.keep_history else None,
                threads=self.topics.threads,
                max_thread_turns=self.agent.max_thread_turns,
            ),
            output=self.committer,
            journal=journal,
            attempt=journal.attempt + 1,
            max_record_bytes=self.options.max_record_bytes,
            max_event_count=limits.max_event_count_per_turn,
            max_event_payload_bytes=limits.max_event_payload_bytes,
            telemetry=self.telemetry.for_turn(request, partition, journal.steps, trace),
            codec=self._writer_codec,
        )
        ps = self._parts.get(partition)
        if request.thread_id is not None and ps is not None:
            runtime.thread = ps.threads.handle(request.thread_id)
        cancel = self._cancels.get(request.turn_id)
        if cancel is not None:
            runtime.cancel_reason = cancel[1]
        return runtime

    async def _run_turn(self, runtime: TurnRuntime, queued: QueuedTurn) -> None:
        executor = self._executor
        assert executor is not None
        try:
            if queued.duplicate_of is not None:
                await executor.finish_duplicate(runtime, queued.duplicate_of)
            else:
                await executor.execute(runtime)
        except asyncio.CancelledError:
            if self._cancels.get(runtime.turn_id, ("",))[0] == "terminate" and not runtime.finished:
                with contextlib.suppress(Exception):
                    await runtime.finish(
                        RunError.of(TurnCancelled(f"turn terminated: {runtime.cancel_reason}"))
                    )
                    self._turn_done(runtime, queued)
                return
            raise
        if runtime.parked is not None:
            self._turn_parked(runtime, queued)
        else:
            self._turn_done(runtime, queued)

    def _turn_parked(self, runtime: TurnRuntime, queued: QueuedTurn) -> None:
        """The journal owns the turn now: free its slot, its key and its input offset."""
        self._running.pop(runtime.turn_id, None)
        ps = self._parts.get(runtime.topics.partition)
        if ps is None or runtime.parked is None:
            return
        ps.parked[runtime.turn_id] = runtime.parked
        self._release(ps, queued)
        self._parked.arm(ps.partition, runtime.turn_id)

    def _release(self, ps: PartitionState, queued: QueuedTurn) -> None:
        """The turn's input offset may be committed and its key's next turn may start;
        a resumed turn (offset -1) was released when it parked."""
        if queued.offset < 0:
            return
        ps.watermark.done(queued.offset)
        self.committer.offsets_changed()
        nxt = ps.dequeue(queued.request.key)
        if nxt is not None:
            self._admit(ps.partition, nxt)

    def _turn_done(self, runtime: TurnRuntime, queued: QueuedTurn) -> None:
        self._running.pop(runtime.turn_id, None)
        ps = self._parts.get(runtime.topics.partition)
        if ps is None:
            return
        for key, value in runtime.thread_writes:  # committed with the terminal event
            ps.threads.apply(key, value)
        ps.turn_finished(runtime.request, queued.offset, int(time.time() * 1000))
        self.turns_finished += 1
        self._release(ps, queued)

    async def _load_recording(self, turn_id: str) -> TurnRecording | None:
        """A branch's original turn, from the history topic (``None`` when it is gone)."""
        if not self.agent.keep_history:
            return None
        try:
            return await asyncio.to_thread(
                partial(
                    load_recording,
                    self.bootstrap_servers,
                    self.topics.history,
                    turn_id,
                    kafka_config=self.options.kafka_config,
                    group_id=reader_group_id(self.agent.prefix, self.agent.name),
                )
            )
        except TurnNotRecorded:
            return None

    def _on_committed(self, offsets: Offsets) -> None:
        """Input offsets committed: forget the finished turns they passed, tombstone their
        terminal records (a later commit carries them), and expire idempotency keys."""
        records: list[OutRecord] = []
        for (_, p), offset in offsets.items():
            ps = self._parts.get(p)
            if ps is not None:
                records += [self._tombstone(p, key) for key in ps.committed(offset)]
        if time.monotonic() >= self._next_expiry:
            self._next_expiry = time.monotonic() + EXPIRY_INTERVAL_S
            now_ms, ttl_ms = int(time.time() * 1000), int(self.options.idempotency_ttl_s * 1000)
            for p, ps in self._parts.items():
                records += [self._tombstone(p, k) for k in ps.journal.expire(now_ms, ttl_ms)]
        if records:
            self.committer.add_records(records)

    @property
    def remembered_turns(self) -> int:
        """Finished turns held in memory: those the committed input offset has not passed."""
        return sum(ps.remembered_turns for ps in self._parts.values())

    # -- commit plumbing ------------------------------------------------------------------

    async def _write(self, records: list[OutRecord], offsets: Offsets) -> None:
        session = self._session
        assert session is not None
        consumer = session.consumer
        await asyncio.to_thread(
            session.writer.write, records, offsets, consumer.client, consumer.group_metadata
        )
        consumer.note_committed({p: o for (_, p), o in offsets.items()})

    def _committable_offsets(self) -> Offsets:
        out: Offsets = {}
        for p, ps in self._parts.items():
            offset = ps.watermark.committable()
            if offset is not None:
                out[(self.topics.turns, p)] = offset
        return out

    def _on_abort(self, turn_ids: set[str]) -> None:
        """A transaction aborted: restart its turns from what is durably journaled."""
        for turn_id in turn_ids:
            running = self._running.get(turn_id)
            if running is None:
                continue
            running.task.cancel()
            if running.partition not in self._parts:  # revoked meanwhile: not ours to rerun
                del self._running[turn_id]
                continue
            old = running.runtime
            journal = TurnJournal(
                turn_id,
                steps=dict(old.journal.steps),
                progress=old.journal.progress,
                replies=old.journal.replies,
                park=old.journal.park,
            )
            self._parts[running.partition].journal.turns[turn_id] = journal
            queued = QueuedTurn(running.offset, old.request)
            runtime = self._new_runtime(
                running.partition, old.request, journal, old.telemetry.trace
            )
            runtime.restart_from(old)
            turn = runtime.telemetry.track(
                partial(self._run_turn, runtime, queued), runtime.attempt
            )
            task = asyncio.create_task(turn, name=turn_id)
            self._running[turn_id] = _Running(runtime, task, running.partition, running.offset)


def _replies_owner(partition: int) -> str:
    """The committer's owner tag of a partition's reply records (not a turn id)."""
    return f"~replies/{partition}"


def restore_journal(
    reader: Any, journal_table: PartitionedTable, partition: int, keys_file: Path
) -> PartitionJournal:
    """One journal partition read to its last stable offset: unfinished turns in memory,
    idempotency keys in the SQLite file ``keys_file``."""
    journal = PartitionJournal(partition, IdempotencyKeys(SqliteView(keys_file)))
    journal.restore(journal_table.restore(reader, partition))
    return journal


def run_worker(
    agent: KafkaAgent | Sequence[KafkaAgent],
    bootstrap_servers: str,
    options: WorkerOptions | None = None,
    *,
    handle_signals: bool = True,
) -> None:
    """Run a worker until SIGTERM/SIGINT (graceful: drain, commit, leave the group).

    Several agents run side by side in this one process (``MeshWorker``).
    """
    import signal

    from pyrula_stream.mesh import MeshWorker
    from pyrula_stream.runtime.collector import tune_for_worker

    async def main() -> None:
        worker: KafkaWorker | MeshWorker
        if isinstance(agent, KafkaAgent):
            worker = KafkaWorker(agent, bootstrap_servers=bootstrap_servers, options=options)
        else:
            worker = MeshWorker(agent, bootstrap_servers=bootstrap_servers, options=options)
        if handle_signals:
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, worker.stop)
        tune_for_worker()  # this process is the worker's: its startup objects live on
        await worker.run()

    asyncio.run(main())


__all__: Sequence[str] = ["KafkaWorker", "PoisonOptions", "WorkerOptions", "run_worker"]
