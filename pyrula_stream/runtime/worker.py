"""The consumer-group worker: lifecycle, group sessions, rebalances, intake, commits.

One asyncio loop runs many turns. The group consumer polls in a thread; its rebalance
callbacks hand over to the loop and wait, so a partition is restored from its journal
before any of its turns runs, and revoked turns stop before the partition moves on.
Which turns run, and when, is the ``TurnScheduler``'s; the Kafka clients of one
membership are a ``GroupSession``; what is checked before joining is in ``startup``.
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
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Literal

import httpx

from pyrula_stream.agent.definition import KafkaAgent
from pyrula_stream.errors import (
    ConfigurationError,
    ErrorCode,
    TurnNotRecorded,
    UserError,
)
from pyrula_stream.kafka.config import registry_config
from pyrula_stream.kafka.connection_log import is_connection_failure
from pyrula_stream.kafka.consumers import reader_group_id
from pyrula_stream.kafka.group import BadRecord, ConsumerFenced, TurnRecord
from pyrula_stream.kafka.offsets import ConsumedRecord
from pyrula_stream.kafka.stores.memory import KafkaMemory
from pyrula_stream.kafka.table import PartitionedTable
from pyrula_stream.kafka.transactions import Offsets, ProducerFenced
from pyrula_stream.llm.base import LLMClient
from pyrula_stream.mcp.pool import MCPPool
from pyrula_stream.observability import logs
from pyrula_stream.observability.telemetry import WorkerTelemetry
from pyrula_stream.runtime.background import RunsInBackground
from pyrula_stream.runtime.committer import GroupCommitter
from pyrula_stream.runtime.execution import TurnExecutor
from pyrula_stream.runtime.health import start_health_server
from pyrula_stream.runtime.options import PoisonOptions, WorkerOptions
from pyrula_stream.runtime.parking import replies_owner
from pyrula_stream.runtime.partition import PartitionState, QueuedTurn
from pyrula_stream.runtime.poison import CrashGuard, IntakeMark, intake_owner
from pyrula_stream.runtime.restore import restore_partition
from pyrula_stream.runtime.scheduler import TurnScheduler
from pyrula_stream.runtime.session import GroupSession, SessionLost, open_session
from pyrula_stream.runtime.startup import (
    TopicProbe,
    check_topics,
    shared_stores,
    tenant_quotas,
    wait_for_broker,
)
from pyrula_stream.state.history import TurnRecording, load_recording
from pyrula_stream.tools.cache import CacheStore, InProcessCacheStore
from pyrula_stream.wire import serde
from pyrula_stream.wire.journal_keys import DEAD_LETTERED_PREFIX, INTAKE_MARK_KEY
from pyrula_stream.wire.records import (
    ControlRequest,
    OutRecord,
    content_type_header,
    dead_letter_source,
    undeliverable_letter,
)
from pyrula_stream.wire.serde import JournalEntry

log = logging.getLogger(__name__)

REVOKE_COMMIT_WAIT_S = 10.0
"""How long a revoke waits for a transaction in flight (the transaction timeout)."""

EXPIRY_INTERVAL_S = 60.0
"""How often idempotency keys past their TTL are looked for (and tombstoned)."""

_State = Literal["new", "running", "stopped"]


class KafkaWorker(RunsInBackground):
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
            agent.name,
            topics=self.topics,
            worker_id=self.worker_id,
            group_id=self.group_id,
            enabled=self.options.telemetry,
        )
        self.metrics = self.telemetry.metrics
        self.restored_records = 0
        self.sessions = 0
        self._state: _State = "new"
        self._task: asyncio.Task[None] | None = None
        self._session: GroupSession | None = None
        self._executor: TurnExecutor | None = None
        self._cache: CacheStore = InProcessCacheStore()
        self._memory: KafkaMemory | None = None
        self._parts: dict[int, PartitionState] = {}
        self._quotas = tenant_quotas(agent, bootstrap_servers, self.options, self.worker_id)
        self._scheduler = TurnScheduler(
            agent,
            self.options,
            self._parts,
            telemetry=self.telemetry,
            committer=lambda: self.committer,
            executor=self._running_executor,
            writer_codec=lambda: self._writer_codec,
            stopping=lambda: self._stop_requested,
            quotas=self._quotas,
        )
        self._parked = self._scheduler.parked
        self.metrics.watch_parked(lambda: self._parked.count)
        self._topic_probe = TopicProbe(bootstrap_servers, self.options.kafka_config)
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

    @property
    def turns_finished(self) -> int:
        """Turns this worker ran to their end (replays of finished turns not counted)."""
        return self._scheduler.turns_finished

    @property
    def running_turns(self) -> int:
        """Turns with a task on this worker now."""
        return self._scheduler.running_count

    @property
    def queued_turns(self) -> int:
        """Turns read and ready to start, waiting for a slot (or for their tenant's room)."""
        return self._scheduler.waiting_count

    @property
    def held_signals(self) -> int:
        """Signals waiting for this worker to read their turn's request."""
        return self._parked.held

    @property
    def parked_turns(self) -> int:
        """Turns of this worker's partitions that only their journal holds now."""
        return self._parked.count

    @property
    def remembered_turns(self) -> int:
        """Finished turns held in memory: those the committed input offset has not passed."""
        return sum(ps.remembered_turns for ps in self._parts.values())

    async def wait_joined(self) -> None:
        """Return once the worker has joined its group (its first session started)."""
        await self._joined.wait()

    def stop(self) -> None:
        """Ask the worker to stop: stop fetching, let turns reach a step boundary, leave.

        Safe to call before the worker runs and more than once.
        """
        self._stop_requested = True

    def _task_name(self) -> str:
        return f"worker-{self.agent.name}"

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
                await wait_for_broker(
                    self.bootstrap_servers, self.options.kafka_config, lambda: self._stop_requested
                )
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

    async def _run(self) -> None:
        """One start: topics, the shared cache, then group sessions until stopped."""
        try:
            await check_topics(
                self.agent,
                self.bootstrap_servers,
                self.options.kafka_config,
                apply=self.options.apply_topics,
            )
            await asyncio.to_thread(self._open_codecs)
            assert self._state_dir is not None, "run() sets the state dir"
            stores = shared_stores(
                self.agent,
                self.bootstrap_servers,
                self.options,
                worker_id=self.worker_id,
                state_dir=self._state_dir,
                quotas=self._quotas,
            )
            async with (
                stores as (self._cache, self._memory),
                httpx.AsyncClient() as http,
                MCPPool(self.agent.mcp_servers) as mcp,
            ):
                self._executor = TurnExecutor(
                    self.agent,
                    self.llm,
                    http=http,
                    cache=self._cache,
                    options=self.options,
                    worker_id=self.worker_id,
                    add_records=lambda records: self.committer.add_records(records),
                    topic_exists=self._topic_probe.exists,
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
            self._cache, self._memory = InProcessCacheStore(), None
            self._close_codecs()

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

    def _running_executor(self) -> TurnExecutor:
        assert self._executor is not None, "run() makes the executor before any turn starts"
        return self._executor

    async def _run_session(self) -> None:
        self.sessions += 1
        committer = GroupCommitter(
            self._write,
            self._committable_offsets,
            self._scheduler.restart_aborted,
            interval_s=self.options.commit_interval_s,
            linger_s=self.options.commit_linger_s,
            telemetry=self.telemetry,
            on_committed=self._on_committed,
            on_undeliverable=self._scheduler.end_undeliverable,
            dead_letter=partial(undeliverable_letter, self.topics.dlq, worker=self.worker_id),
            max_delivery_attempts=self.options.max_delivery_attempts,
            max_pending_records=self.options.max_pending_records,
        )
        session = self._session = await open_session(
            self.agent,
            self.bootstrap_servers,
            self.options,
            worker_id=self.worker_id,
            group_id=self.group_id,
            telemetry=self.telemetry,
            codec=self._reader_codec,
            committer=committer,
        )
        session.consumer.subscribe(self._on_assign_cb, self._on_revoke_cb)
        self._parked.turns_reader = session.consumer
        committer_task = asyncio.create_task(session.committer.run(), name="committer")
        self._ready = True
        self._joined.set()
        try:
            await self._poll_loop(session, committer_task)
        finally:
            self._ready = False
            self._parked.turns_reader = None
            self._parked.turns_read()  # releases what waited on this session's reads
            await self._drain()
            committer_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, ProducerFenced):
                await committer_task
            await asyncio.to_thread(session.close)

    async def _poll_loop(self, session: GroupSession, committer_task: asyncio.Task[None]) -> None:
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
            if self._parked.held:
                self._parked.turns_read()
            for value in session.control.poll():
                self._on_control_record(value)
            for reply in session.replies.poll():
                self._on_reply(reply)
            session.consumer.set_paused(self._scheduler.fill_slots())

    async def _drain(self) -> None:
        """Stop fetching; give running turns ``shutdown_grace`` to finish, then stop them.

        Only a requested stop waits: after fencing the turns are no longer ours to finish.
        """
        tasks = self._scheduler.running_tasks()
        if tasks and self._stop_requested:
            await asyncio.wait(tasks, timeout=self.options.shutdown_grace)
        await self._drop_all_turns(flush=True)

    async def _drop_all_turns(self, *, flush: bool = False) -> None:
        ids = await self._scheduler.stop_all()
        if self._session is not None:
            self.committer.purge(ids | {intake_owner(p) for p in self._parts})
            if flush and self._stop_requested:  # a clean stop, not a session that failed
                self.committer.add_records(self._closing_marks(set(self._parts)))
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(self.committer.flush(), self.options.cancel_timeout)
        self._parts.clear()

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
        """Rebuild a partition's state from its changelogs (runs in the assign callback)."""
        assert self._state_dir is not None, "run() sets the state dir"
        session = self._session
        assert session is not None
        started = time.monotonic()
        state, records = restore_partition(
            partition,
            reader=session.restorer,
            group_client=session.consumer.client,
            turns_topic=self.topics.turns,
            journal_table=self._journal_table,
            threads_table=self._threads_table,
            keys_file=self._state_dir / self._table_file(str(partition)),
        )
        self.restored_records += records
        self.metrics.restored(time.monotonic() - started, state.journal.records_read)
        return state

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
            state.crash_guard = self._crash_guard(p, state)
        assert self._session is not None
        self._session.replies.assign({p: s.journal.reply_cursor for p, s in restored.items()})
        for p in restored:
            self._parked.rearm(p)

    def _crash_guard(self, p: int, state: PartitionState) -> CrashGuard:
        """Count a crash of the previous owner and commit this owner's intake mark before
        any turn of the partition starts (``runtime/poison.py``)."""
        stored = state.journal.intake_mark
        mark = IntakeMark.from_entry(*stored) if stored is not None else None
        return CrashGuard.restored(
            p,
            mark,
            -1 if state.restored_committed is None else state.restored_committed,
            state.restored_end,
            options=self.options.poison,
            worker=self.worker_id,
            write_mark=partial(self._write_mark, p),
            release=partial(self._scheduler.admit, p),
        )

    def _write_mark(self, p: int, mark: IntakeMark) -> asyncio.Future[None]:
        return self.committer.durable_records(
            intake_owner(p), [mark.record(self.topics.journal, p)]
        )

    def _closing_marks(self, partitions: set[int]) -> list[OutRecord]:
        """A clean handover tombstones the intake marks: the next owner counts no crash,
        and compaction keeps nothing of a partition that was left cleanly."""
        return [
            self._tombstone(p, INTAKE_MARK_KEY)
            for p in sorted(partitions)
            if p in self._parts and self._parts[p].crash_guard is not None
        ]

    def _tombstone(self, partition: int, key: str) -> OutRecord:
        return self._journal_table.tombstone(key, partition, [content_type_header("journal_entry")])

    async def _revoke(self, partitions: set[int]) -> None:
        """Stop the partitions' turns and let a commit in flight end before they move on."""
        closing = self._closing_marks(partitions)
        for p in partitions:  # first, so nothing starts or restarts on them from now on
            self._parts.pop(p, None)
        if self._session is not None:
            self._session.replies.unassign(partitions)
        lost = self._scheduler.stop_partitions(partitions)
        if lost:
            await asyncio.wait(lost.values(), timeout=self.options.cancel_timeout)
        # Buffered replies of these partitions are the new owner's to take now (purged
        # again after the commit in flight: an abort puts its replies back).
        replies = {replies_owner(p) for p in partitions}
        marks = {intake_owner(p) for p in partitions}
        self.committer.purge(set(lost) | replies | marks)
        if closing:
            await self._commit_closing(closing)
        if self.options.processing_guarantee == "exactly_once_v2":
            try:
                await asyncio.wait_for(self.committer.wait_idle(), REVOKE_COMMIT_WAIT_S)
            except TimeoutError:
                log.error(
                    "a commit was still in flight %ss after partitions %s were revoked",
                    REVOKE_COMMIT_WAIT_S,
                    sorted(partitions),
                )
        self.committer.purge(replies | marks)
        self.committer.forget_offsets({(self.topics.turns, p) for p in partitions})

    async def _commit_closing(self, records: list[OutRecord]) -> None:
        """Commit the clean-handover marks before the partitions move on; a handover that
        cannot commit them only makes the next owner count a crash if nothing progressed."""
        try:
            await asyncio.wait_for(
                self.committer.durable_records("pyrula.closing", records),
                self.options.cancel_timeout,
            )
        except (TimeoutError, asyncio.CancelledError, ProducerFenced):
            self.committer.purge({"pyrula.closing"})
            log.warning("the intake marks of a clean handover did not commit in time")

    # -- records --------------------------------------------------------------------------

    def _on_bad_record(self, bad: BadRecord) -> None:
        """Dead-letter it (riding the next commit with its offset) and move on.

        The offset may stay uncommitted a while (an earlier turn still runs), so a marker
        in the journal commits with the dead letter: a crash that makes the next owner
        read the record again leaves one dead letter, not two."""
        ps = self._parts.get(bad.partition)
        if ps is None:
            return
        if bad.offset in ps.journal.dead_lettered:
            log.info("%s was dead-lettered before this read; skipped", bad.source.source)
        else:
            entry = JournalEntry("", -1, "dead_lettered", data={"reason": bad.reason[:200]})
            marker = self._journal_table.put(
                f"{DEAD_LETTERED_PREFIX}{bad.offset}",
                serde.encode("journal_entry", entry),
                bad.partition,
                [content_type_header("journal_entry")],
            )
            letter = dead_letter_source(
                self.topics.dlq,
                bad.source,
                bad.reason,
                ErrorCode.INVALID_REQUEST,
                worker=self.worker_id,
            )
            self.committer.add_records([letter, marker])
            ps.journal.dead_lettered.add(bad.offset)
            log.warning("dead-lettered %s: %s", bad.source.source, bad.reason)
        ps.watermark.track(bad.offset)
        ps.watermark.done(bad.offset)
        self.committer.offsets_changed()

    def _on_turn_record(self, record: TurnRecord) -> None:
        p, offset = record.partition, record.offset
        request = self.agent.tenancy.resolve(record.request, record.headers)
        ps = self._parts.get(p)
        if ps is None:
            return
        ps.watermark.track(offset)
        if (
            ps.is_finished(request)
            or self._scheduler.is_active(request.turn_id)
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
            self._scheduler.admit(p, queued)

    def _on_control_record(self, value: bytes | None) -> None:
        control = ControlRequest.parse(value)
        if control is None:
            # Every worker reads every control partition, so a dead letter here would be
            # written once per worker and start: skipped, logged and counted instead.
            self.metrics.skipped_record("control")
            log.warning("ignoring unreadable control record: %.200r", value)
            return
        self._scheduler.on_control(control)

    def _on_reply(self, record: ConsumedRecord) -> None:
        self._parked.take_reply(record, self.topics, self.worker_id, self.committer)

    # -- turns ----------------------------------------------------------------------------

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
            self.committer.add_records(records, wake=False)  # cleanup rides the next commit

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


__all__: Sequence[str] = ["KafkaWorker", "PoisonOptions", "SessionLost", "WorkerOptions"]
