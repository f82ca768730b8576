"""The consumer-group worker: its lifecycle, its group sessions and their commits.

One asyncio loop runs many turns. ``KafkaWorker`` owns one part per kind of work, as
Temporal's worker owns one sub-worker per kind of task: the ``RecordIntake`` polls a
session's readers and hands each record on (``runtime/intake.py``); the
``PartitionHandover`` restores assigned partitions and stops revoked ones, inside the
group consumer's rebalance callbacks (``runtime/handover.py``); ``JournalHousekeeping``
tombstones what nothing reads again (``runtime/housekeeping.py``); which turns run, and
when, is the ``TurnScheduler``'s. The worker itself starts, restarts and stops: it waits
for Kafka, opens the shared stores, runs one ``GroupSession`` after another (a fenced
one is replaced) and drains on stop. What is checked before joining is in ``startup``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import socket
import tempfile
from collections.abc import Collection, Sequence
from functools import partial
from pathlib import Path
from typing import Literal

import httpx

from pyrula_stream.agent.definition import KafkaAgent
from pyrula_stream.errors import ConfigurationError, TurnNotRecorded, UserError
from pyrula_stream.kafka.config import registry_config
from pyrula_stream.kafka.connection_log import is_connection_failure
from pyrula_stream.kafka.consumers import reader_group_id
from pyrula_stream.kafka.group import ConsumerFenced
from pyrula_stream.kafka.stores.memory import KafkaMemory
from pyrula_stream.kafka.transactions import Offsets, ProducerFenced, writer_record_room
from pyrula_stream.llm.base import LLMClient
from pyrula_stream.mcp.pool import MCPPool
from pyrula_stream.objects.resolver import PayloadStores
from pyrula_stream.observability import logs
from pyrula_stream.observability.telemetry import WorkerTelemetry
from pyrula_stream.runtime.background import RunsInBackground
from pyrula_stream.runtime.batch_collector import BatchCollector
from pyrula_stream.runtime.committer import GroupCommitter
from pyrula_stream.runtime.execution import TurnExecutor
from pyrula_stream.runtime.handover import PartitionHandover, keys_file_name
from pyrula_stream.runtime.health import start_health_server
from pyrula_stream.runtime.housekeeping import JournalHousekeeping
from pyrula_stream.runtime.intake import RecordIntake
from pyrula_stream.runtime.options import PoisonOptions, WorkerOptions
from pyrula_stream.runtime.partition import PartitionState
from pyrula_stream.runtime.restarts import SessionRestarts
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
from pyrula_stream.wire.records import OutRecord, undeliverable_letter

log = logging.getLogger(__name__)

_State = Literal["new", "running", "stopped"]


def private_dir(path: Path) -> None:
    """``path`` as a directory only this account may enter (0700): the local tables in it
    hold what turns carry (idempotency keys, memory)."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    path.chmod(0o700)


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
        self.sessions = 0
        self._state: _State = "new"
        self._task: asyncio.Task[None] | None = None
        self._session: GroupSession | None = None
        self._executor: TurnExecutor | None = None
        self._cache: CacheStore = InProcessCacheStore()
        self._memory: KafkaMemory | None = None
        self._parts: dict[int, PartitionState] = {}
        self._record_room = writer_record_room(
            self.options.kafka_config, self.options.producer_config
        )
        """What a record built from outside bytes is fitted to (a dead letter, say)."""
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
        self.batches: BatchCollector | None = None
        """The batch lane's collector (agents with ``batch=``)."""
        if agent.batch is not None:
            self.batches = BatchCollector(
                agent.batch,
                self._parts,
                self.topics.journal,
                committer=lambda: self.committer,
                parked=self._parked,
                metrics=self.metrics.batch,
            )
            self._parked.batch_parked = self.batches.queue
        self._topic_probe = TopicProbe(bootstrap_servers, self.options.kafka_config)
        self._stop_requested = False
        self._ready = False
        self._joined = asyncio.Event()
        self._stopping = asyncio.Event()
        """Set by ``stop()``: ends a wait before rejoining."""
        self._state_dir: Path | None = None  # created by run(): options.state_dir or a temp dir
        self._reader_codec: serde.ValueCodec | None = None
        self._writer_codec: serde.ValueCodec = serde.SCHEMALESS
        self._restarts = SessionRestarts(self.options.poison)
        self._standing: dict[int, int | None] = {}
        """Each owned partition's committed offset at its restore, as the last session ended."""
        self._housekeeping = JournalHousekeeping(
            self.topics.journal, self._parts, self.options, committer=lambda: self.committer
        )
        self._handover = PartitionHandover(
            self.topics,
            self.options,
            self._parts,
            self._scheduler,
            self._housekeeping,
            session=lambda: self._session,
            committer=lambda: self.committer,
            state_dir=lambda: self._state_dir,
            worker_id=self.worker_id,
            group_id=self.group_id,
            metrics=self.metrics,
            restarts=self._restarts,
        )
        self._handover.batches = self.batches
        self._intake = RecordIntake(
            agent,
            self._parts,
            self._scheduler,
            committer=lambda: self.committer,
            worker_id=self.worker_id,
            metrics=self.metrics,
            record_room=self._record_room,
            stopping=lambda: self._stop_requested,
            after_poll=self._handover.raise_if_failed,
            tenant_key=self.options.tenant_key,
        )

    # -- lifecycle ------------------------------------------------------------------------

    @property
    def assigned_partitions(self) -> int:
        return len(self._parts)

    @property
    def restored_records(self) -> int:
        """Changelog records read to restore the partitions this worker was assigned."""
        return self._handover.restored_records

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
    def expired_keys(self) -> int:
        """Idempotency keys this worker expired and tombstoned (the bench reads it)."""
        return self._housekeeping.expired_keys

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
        self._stopping.set()

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
        private_dir(self._state_dir)
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
                keys_files = keys_file_name(self.group_id, self.worker_id, "*")
                for table in self._state_dir.glob(keys_files):
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
                    backlog=self._backlog,
                )
                while not self._stop_requested:
                    try:
                        await self._run_session()
                    except (ProducerFenced, ConsumerFenced, SessionLost) as exc:
                        await self._rejoin_after(exc)
        finally:
            self._cache, self._memory = InProcessCacheStore(), None
            self._close_codecs()

    async def _rejoin_after(self, exc: Exception) -> None:
        """Drop every turn; when sessions keep ending on the same input, wait (doubling,
        capped) before the next one (``runtime/restarts.py``)."""
        repeats = self._restarts.ended(self._standing)
        delay = self._restarts.delay_s(repeats)
        if delay:
            log.warning(
                "%s: dropping turns and rejoining in %.1fs (session %d in a row to end on "
                "the same input)",
                exc,
                delay,
                repeats,
            )
        else:
            log.warning("%s: dropping turns and rejoining", exc)
        self.metrics.was_fenced()
        self.metrics.session_restarted(repeats > 1)
        await self._drop_all_turns()
        if delay and not self._stop_requested:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), delay)

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
        self._standing = {}
        committer = GroupCommitter(
            self._write,
            self._committable_offsets,
            self._scheduler.restart_aborted,
            interval_s=self.options.commit_interval_s,
            linger_s=self.options.commit_linger_s,
            telemetry=self.telemetry,
            on_committed=self._on_committed,
            on_undeliverable=self._scheduler.end_undeliverable,
            dead_letter=partial(
                undeliverable_letter,
                self.topics.dlq,
                worker=self.worker_id,
                max_bytes=self._record_room,
            ),
            max_delivery_attempts=self.options.max_delivery_attempts,
            max_pending_records=self.options.max_pending_records,
            payloads=self._scheduler.payloads,
            finished_offsets=self._committable_offsets,
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
        session.consumer.subscribe(self._handover.on_assign, self._handover.on_revoke)
        self._parked.turns_reader = session.consumer
        committer_task = asyncio.create_task(session.committer.run(), name="committer")
        keys_task = asyncio.create_task(self._housekeeping.run(), name="idempotency-keys")
        batch_task = (
            asyncio.create_task(self.batches.run(), name="batch-lane")
            if self.batches is not None
            else None
        )
        self._ready = True
        self._joined.set()
        try:
            await self._intake.run(session, committer_task)
        finally:
            self._ready = False
            keys_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await keys_task
            if batch_task is not None:
                batch_task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await batch_task
            # Where the session stood when it ended: the drain below forgets partitions.
            self._standing = {p: ps.restored_committed for p, ps in self._parts.items()}
            self._parked.turns_reader = None
            self._parked.turns_read()  # releases what waited on this session's reads
            await self._drain()
            committer_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, ProducerFenced):
                await committer_task
            await asyncio.to_thread(session.close)

    async def _drain(self) -> None:
        """Stop fetching; give running turns ``shutdown_grace`` to finish, then stop them.

        Only a requested stop waits: after fencing the turns are no longer ours to finish.
        """
        tasks = self._scheduler.running_tasks()
        if tasks and self._stop_requested:
            await asyncio.wait(tasks, timeout=self.options.shutdown_grace)
        await self._drop_all_turns(flush=True)

    async def _drop_all_turns(self, *, flush: bool = False) -> None:
        """Stop every turn and leave every partition: cleanly (intake marks tombstoned,
        the buffer flushed) only on a requested stop, not after a session failed."""
        stopped = await self._scheduler.stop_all()
        await self._handover.leave_all(stopped, clean=flush and self._stop_requested)

    # -- turns ----------------------------------------------------------------------------

    def _backlog(self) -> int:
        """Turns read and not finished on this worker (``BatchLane(when="lag")``)."""
        return sum(ps.watermark.unfinished for ps in self._parts.values())

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
                    payloads=self._scheduler.payloads or PayloadStores(),
                )
            )
        except TurnNotRecorded:
            return None

    # -- commit plumbing ------------------------------------------------------------------

    async def _write(self, records: list[OutRecord], offsets: Offsets) -> None:
        session = self._session
        assert session is not None
        consumer = session.consumer
        await asyncio.to_thread(
            session.writer.write, records, offsets, consumer.client, consumer.group_metadata
        )
        consumer.note_committed({p: o for (_, p), o in offsets.items()})

    def _on_committed(self, offsets: Offsets, ended: Collection[str]) -> None:
        """A commit succeeded: what it moved, and the turns whose terminal records it held."""
        self._housekeeping.on_committed(offsets, self._scheduler.inputs_of(ended))

    def _committable_offsets(self, finishing: Collection[str] = ()) -> Offsets:
        """Each owned partition's committable input offset, counting the input of each of
        the ``finishing`` turns (their terminal records are in the commit) as done."""
        done: dict[int, set[int]] = {}
        for _, p, input_offset in self._scheduler.inputs_of(finishing):
            done.setdefault(p, set()).add(input_offset)
        out: Offsets = {}
        for p, ps in self._parts.items():
            offset = ps.watermark.committable_past(done.get(p, ()))
            if offset is not None:
                out[(self.topics.turns, p)] = offset
        return out


__all__: Sequence[str] = ["KafkaWorker", "PoisonOptions", "SessionLost", "WorkerOptions"]
