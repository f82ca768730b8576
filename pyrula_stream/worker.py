"""The consumer-group worker: assignment, restore, per-turn tasks, commit, cancel, poison.

One asyncio loop runs many turns. The group consumer polls in a thread; its rebalance
callbacks hand over to the loop and wait, so a partition is restored from its journal
before any of its turns runs, and revoked turns stop before the partition moves on.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import socket
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from pyrula_stream import serde
from pyrula_stream.agent import KafkaAgent
from pyrula_stream.committer import GroupCommitter
from pyrula_stream.errors import (
    ErrorCode,
    MalformedRecordError,
    TopicDriftError,
    TurnCancelled,
)
from pyrula_stream.execution import TurnExecutor, error_data
from pyrula_stream.health import start_health_server
from pyrula_stream.journal import IdempotencyRecord, PartitionJournal, TurnJournal
from pyrula_stream.kafka.admin import apply_topics
from pyrula_stream.kafka.cache_store import KafkaCacheStore
from pyrula_stream.kafka.config import registry_config
from pyrula_stream.kafka.consumers import (
    assign_from_beginning,
    group_consumer,
    raise_if_denied,
    read_partition_to_end,
    reader_consumer,
    reader_group_id,
)
from pyrula_stream.kafka.transactions import BatchWriter, Offsets, ProducerFenced
from pyrula_stream.llm.fake import FakeLLM
from pyrula_stream.options import PoisonOptions, WorkerOptions
from pyrula_stream.partition import PartitionState, QueuedTurn
from pyrula_stream.records import OutRecord
from pyrula_stream.serde import EventType, TurnRequest
from pyrula_stream.tool_cache import CacheStore, InProcessCacheStore
from pyrula_stream.turn import TurnRuntime, TurnTopics

log = logging.getLogger(__name__)

REVOKE_COMMIT_WAIT_S = 10.0

MAX_REMEMBERED_CANCELS = 100_000
"""Cancel requests kept for turns this worker has not seen yet (oldest dropped first)."""
"""How long a revoke waits for a transaction in flight (the transaction timeout)."""


class SessionLost(Exception):
    """The worker's clients must be recreated: it drops its turns and rejoins the group."""


@dataclass
class _Running:
    runtime: TurnRuntime
    task: asyncio.Task[None]
    partition: int
    offset: int


class KafkaWorker:
    """Runs one agent's turns as a member of the agent's consumer group."""

    def __init__(
        self, agent: KafkaAgent, *, bootstrap_servers: str, options: WorkerOptions | None = None
    ) -> None:
        self.agent = agent
        self.bootstrap_servers = bootstrap_servers
        self.options = options or WorkerOptions()
        self.topics = agent.topics
        self.worker_id = self.options.worker_id or f"{socket.gethostname()}-{os.getpid()}"
        self.group_id = self.options.group_id or f"{agent.prefix}.{agent.name}.workers"
        self.llm = agent.llm or FakeLLM()
        self._parts: dict[int, PartitionState] = {}
        self._running: dict[str, _Running] = {}
        self._cancels: OrderedDict[str, tuple[str, str]] = OrderedDict()
        self._waiting: list[tuple[int, QueuedTurn]] = []
        self._paused = False
        self._stop_requested = False
        self._ready = False
        self.turns_finished = 0
        self.restored_records = 0
        self.sessions = 0
        self._callback_error: Exception | None = None
        self._reader_codec: serde.ValueCodec | None = None
        self._writer_codec: serde.ValueCodec = serde.SCHEMALESS

    # -- lifecycle ------------------------------------------------------------------------

    @property
    def assigned_partitions(self) -> int:
        return len(self._parts)

    @property
    def ready(self) -> bool:
        return self._ready and not self._stop_requested

    def stop(self) -> None:
        """Ask the worker to stop: stop fetching, let turns reach a step boundary, leave."""
        self._stop_requested = True

    async def run(self) -> None:
        """Run until ``stop()``; recreates the clients after a fatal (fenced) error."""
        if self.options.apply_topics:
            report = await asyncio.to_thread(
                functools.partial(
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
        await asyncio.to_thread(self._open_codecs)
        self._cache: CacheStore = InProcessCacheStore()
        if self.options.shared_tool_cache:
            shared = KafkaCacheStore(
                self.bootstrap_servers,
                prefix=self.agent.prefix,
                client_id=f"{self.worker_id}-cache",
                kafka_config=self.options.kafka_config,
            )
            await asyncio.to_thread(shared.start)
            self._cache = shared
        try:
            async with httpx.AsyncClient() as http:
                self._executor = TurnExecutor(
                    self.agent,
                    self.llm,
                    http=http,
                    cache=self._cache,
                    options=self.options,
                    worker_id=self.worker_id,
                    add_records=lambda records: self.committer.add_records(records),
                )
                while not self._stop_requested:
                    try:
                        await self._session()
                    except (ProducerFenced, SessionLost) as exc:
                        log.warning("%s: dropping turns and rejoining", exc)
                        await self._drop_all_turns()
        finally:
            if isinstance(self._cache, KafkaCacheStore):
                await asyncio.to_thread(self._cache.close)
            if self._reader_codec is not None:
                self._reader_codec.close()

    def _raise_if_denied(self, err: Any) -> None:
        """A denied group or topic fails the worker naming it, instead of a warning loop."""
        conf = {
            "bootstrap.servers": self.bootstrap_servers,
            "group.id": self.group_id,
            "sasl.username": (self.options.kafka_config or {}).get("sasl.username"),
        }
        raise_if_denied(conf, err, self.topics.turns, group_operation="READ")

    def _open_codecs(self) -> None:
        """Schema Registry framing (opt-in; see ``kafka/schema_registry.py``)."""
        if registry_config(self.options.kafka_config) is not None:
            from pyrula_stream.kafka.schema_registry import event_codecs

            outputs = {t for topics in self.agent.output_topics.values() for t in topics}
            self._reader_codec, self._writer_codec = event_codecs(
                self.options.kafka_config,
                self.options.serialization,
                sorted({self.topics.events, *outputs}),
            )

    async def _session(self) -> None:
        self.sessions += 1
        loop = asyncio.get_running_loop()
        self._loop = loop
        exactly_once = self.options.processing_guarantee == "exactly_once_v2"
        self._writer = BatchWriter(
            self.bootstrap_servers,
            transactional_id=f"{self.agent.prefix}.{self.agent.name}.{self.worker_id}",
            exactly_once=exactly_once,
            extra=self.options.producer_config,
            kafka_config=self.options.kafka_config,
        )
        await asyncio.to_thread(self._writer.start)
        self._consumer = group_consumer(
            self.bootstrap_servers,
            self.group_id,
            client_id=self.worker_id,
            exactly_once=exactly_once,
            extra=self.options.consumer_config,
            kafka_config=self.options.kafka_config,
        )
        self._group_metadata = self._consumer.consumer_group_metadata()
        self._restorer = reader_consumer(
            self.bootstrap_servers,
            client_id=f"{self.worker_id}-restore",
            kafka_config=self.options.kafka_config,
            group_id=reader_group_id(self.agent.prefix, self.agent.name),
        )
        self._control = reader_consumer(
            self.bootstrap_servers,
            client_id=f"{self.worker_id}-control",
            kafka_config=self.options.kafka_config,
            group_id=reader_group_id(self.agent.prefix, self.agent.name),
        )
        assign_from_beginning(self._control, self.topics.control)
        self.committer = GroupCommitter(
            self._write,
            self._committable_offsets,
            self._on_abort,
            interval_s=self.options.commit_interval_s,
        )
        self._consumer.subscribe(
            [self.topics.turns],
            on_assign=self._on_assign_cb,
            on_revoke=self._on_revoke_cb,
            on_lost=self._on_revoke_cb,
        )
        committer_task = asyncio.create_task(self.committer.run(), name="committer")
        health = None
        if self.options.health_port is not None:
            health = await start_health_server(
                self.options.health_host, self.options.health_port, lambda: self.ready
            )
        self._ready = True
        try:
            await self._poll_loop(committer_task)
        finally:
            self._ready = False
            await self._drain()
            committer_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, ProducerFenced):
                await committer_task
            await asyncio.to_thread(self._consumer.close)
            self._restorer.close()
            self._control.close()
            self._writer.close()
            if health is not None:
                health.close()

    async def _poll_loop(self, committer_task: asyncio.Task[None]) -> None:
        while not self._stop_requested:
            if committer_task.done():
                committer_task.result()  # re-raises ProducerFenced
            msgs = await asyncio.to_thread(self._fetch)
            # Read here, never inside a rebalance callback: there it blocks until the
            # rebalance ends, and the revoke waits for the commit that needs it.
            self._group_metadata = self._consumer.consumer_group_metadata()
            if self._callback_error is not None:
                error, self._callback_error = self._callback_error, None
                raise SessionLost(f"rebalance handling failed: {error!r}") from error
            for msg in msgs:
                err = msg.error()
                if err is not None:
                    if err.fatal():
                        raise ProducerFenced(f"consumer fatal error: {err.str()}")
                    self._raise_if_denied(err)
                    log.warning("consumer error: %s", err.str())
                    continue
                self._on_turn_record(msg)
            for msg in self._control.consume(100, 0):
                if msg.error() is None:
                    self._on_control_record(msg.value())
            self._apply_backpressure()

    def _fetch(self) -> list[Any]:
        """Wait up to 50 ms for the first record, then take what is already buffered.

        ``consume(n, timeout)`` alone waits for a full batch or the whole timeout, which
        added ~25 ms to every turn on an idle worker.
        """
        first = self._consumer.poll(0.05)
        if first is None:
            return []
        return [first, *self._consumer.consume(255, 0)]

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
        if hasattr(self, "committer"):
            self.committer.purge(ids)
            if flush:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(self.committer.flush(), self.options.cancel_timeout)
        self._parts.clear()
        self._waiting.clear()

    # -- rebalance (called in the consumer thread) ----------------------------------------

    def _on_assign_cb(self, consumer: Any, partitions: list[Any]) -> None:
        try:
            restored = {tp.partition: self._restore(tp.partition) for tp in partitions}
            asyncio.run_coroutine_threadsafe(self._install(restored), self._loop).result()
            if self._paused and partitions:
                consumer.pause(partitions)
        except Exception as exc:  # an exception must not die inside librdkafka's callback
            self._callback_error = exc

    def _on_revoke_cb(self, consumer: Any, partitions: list[Any]) -> None:
        lost = {tp.partition for tp in partitions}
        try:
            asyncio.run_coroutine_threadsafe(self._revoke(lost), self._loop).result()
        except Exception as exc:
            self._callback_error = exc

    def _restore(self, partition: int) -> PartitionJournal:
        journal = PartitionJournal(partition)
        for key, value, ts_ms in read_partition_to_end(
            self._restorer, self.topics.journal, partition
        ):
            journal.apply(key, value, ts_ms)
        self.restored_records += journal.records_read
        return journal

    async def _install(self, restored: dict[int, PartitionJournal]) -> None:
        ttl_ms = int(self.options.idempotency_ttl_s * 1000)
        for p, journal in restored.items():
            self._parts[p] = PartitionState(p, journal)
            expired = journal.expire(int(time.time() * 1000), ttl_ms)
            if expired:  # housekeeping: terminal records past the idempotency TTL
                self.committer.add_records([self._tombstone(p, key) for key in expired])

    def _tombstone(self, partition: int, key: str) -> OutRecord:
        ctype = serde.content_type("journal_entry").encode()
        return OutRecord(
            self.topics.journal, key.encode(), None, [(serde.CONTENT_TYPE_HEADER, ctype)], partition
        )

    async def _revoke(self, partitions: set[int]) -> None:
        """Stop the partitions' turns and let a commit in flight end before they move on."""
        for p in partitions:  # first, so nothing starts or restarts on them from now on
            self._parts.pop(p, None)
        self._waiting = [(p, q) for p, q in self._waiting if p not in partitions]
        lost = {t: r.task for t, r in self._running.items() if r.partition in partitions}
        for turn_id, task in lost.items():
            task.cancel()
            del self._running[turn_id]
        if lost:
            await asyncio.wait(lost.values(), timeout=self.options.cancel_timeout)
        self.committer.purge(set(lost))
        if self.options.processing_guarantee == "exactly_once_v2":
            try:
                await asyncio.wait_for(self.committer.wait_idle(), REVOKE_COMMIT_WAIT_S)
            except TimeoutError:
                log.error(
                    "a commit was still in flight %ss after partitions %s were revoked",
                    REVOKE_COMMIT_WAIT_S,
                    sorted(partitions),
                )
        self.committer.forget_offsets({(self.topics.turns, p) for p in partitions})

    # -- records --------------------------------------------------------------------------

    def _on_turn_record(self, msg: Any) -> None:
        p, offset = msg.partition(), msg.offset()
        ps = self._parts.get(p)
        if ps is None:
            return
        ps.watermark.track(offset)
        headers = serde.headers_dict(msg.headers())
        try:
            request = serde.decode_turn_request(msg.value(), headers, self._reader_codec)
            if request.agent != self.agent.name:
                raise MalformedRecordError(
                    f"turn is for agent {request.agent!r}, this topic belongs to "
                    f"{self.agent.name!r}"
                )
        except MalformedRecordError as exc:
            self._dead_letter(msg, str(exc), ErrorCode.INVALID_REQUEST)
            ps.watermark.done(offset)
            self.committer.offsets_changed()
            return
        if (
            ps.is_finished(request)
            or request.turn_id in self._running
            or request.turn_id in ps.queued_ids
        ):
            ps.watermark.done(offset)
            self.committer.offsets_changed()
            return
        queued = QueuedTurn(offset, request, ps.original_turn(request))
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

    def _apply_backpressure(self) -> None:
        while self._waiting and len(self._running) < self.options.max_concurrent_turns:
            p, queued = self._waiting.pop(0)
            if p in self._parts:
                self._start_turn(p, queued)
        full = len(self._running) + len(self._waiting) >= self.options.max_concurrent_turns
        if full != self._paused:
            assignment = self._consumer.assignment()
            if full:
                self._consumer.pause(assignment)
            else:
                self._consumer.resume(assignment)
            self._paused = full

    def _dead_letter(self, msg: Any, reason: str, code: ErrorCode) -> None:
        headers = [
            ("pyrula.dlq.reason", reason.encode()),
            ("pyrula.dlq.code", str(code).encode()),
            ("pyrula.dlq.source", f"{msg.topic()}[{msg.partition()}]@{msg.offset()}".encode()),
            ("pyrula.dlq.worker", self.worker_id.encode()),
            *[(f"pyrula.original.{k}", v or b"") for k, v in (msg.headers() or [])],
        ]
        self.committer.add_records(
            [OutRecord(self.topics.dlq, msg.key() or b"", msg.value(), headers)]
        )
        log.warning(
            "dead-lettered %s[%d]@%d: %s", msg.topic(), msg.partition(), msg.offset(), reason
        )

    def _on_control_record(self, value: bytes | None) -> None:
        import json

        try:
            body = json.loads(value or b"")
            turn_id, action = str(body["turn_id"]), str(body["action"])
        except (ValueError, KeyError, TypeError):
            log.warning("ignoring unreadable control record: %r", value)
            return
        reason = str(body.get("reason") or action)[:500]
        self._cancels[turn_id] = (action, reason)
        self._cancels.move_to_end(turn_id)
        while len(self._cancels) > MAX_REMEMBERED_CANCELS:  # the control topic is replayed
            self._cancels.popitem(last=False)
        running = self._running.get(turn_id)
        if running is None:
            return
        running.runtime.cancel_reason = reason
        if action == "terminate":
            running.task.cancel(msg="terminate")

    # -- turns ----------------------------------------------------------------------------

    def _start_turn(self, partition: int, queued: QueuedTurn) -> None:
        ps = self._parts[partition]
        restored = ps.journal.turns.get(queued.request.turn_id)
        journal = restored.materialize() if restored else TurnJournal(queued.request.turn_id)
        runtime = self._new_runtime(partition, queued.request, journal)
        task = asyncio.create_task(self._run_turn(runtime, queued), name=runtime.turn_id)
        self._running[runtime.turn_id] = _Running(runtime, task, partition, queued.offset)

    def _new_runtime(
        self, partition: int, request: TurnRequest, journal: TurnJournal
    ) -> TurnRuntime:
        events = self.agent.topics.events
        runtime = TurnRuntime(
            request=request,
            topics=TurnTopics(self.topics.journal, [events], partition),
            output=self.committer,
            journal=journal,
            attempt=journal.attempt + 1,
            max_record_bytes=self.options.max_record_bytes,
            max_event_count=self.agent.limits.max_event_count_per_turn,
            codec=self._writer_codec,
        )
        cancel = self._cancels.get(request.turn_id)
        if cancel is not None:
            runtime.cancel_reason = cancel[1]
        return runtime

    async def _run_turn(self, runtime: TurnRuntime, queued: QueuedTurn) -> None:
        try:
            if queued.duplicate_of is not None:
                await self._executor.finish_duplicate(runtime, queued.duplicate_of)
            else:
                await self._executor.execute(runtime)
        except asyncio.CancelledError:
            if self._cancels.get(runtime.turn_id, ("",))[0] == "terminate" and not runtime.finished:
                with contextlib.suppress(Exception):
                    await runtime.finish(
                        EventType.RUN_ERROR,
                        error_data(TurnCancelled(f"turn terminated: {runtime.cancel_reason}")),
                    )
                    self._turn_done(runtime, queued)
                return
            raise
        self._turn_done(runtime, queued)

    def _turn_done(self, runtime: TurnRuntime, queued: QueuedTurn) -> None:
        self._running.pop(runtime.turn_id, None)
        ps = self._parts.get(runtime.topics.partition)
        if ps is None:
            return
        ps.finished.add(runtime.turn_id)
        ps.journal.turns.pop(runtime.turn_id, None)
        idem = runtime.request.idempotency_key
        if idem and ps.running_keys.get(idem) == runtime.turn_id:
            del ps.running_keys[idem]
            ps.journal.idempotency[idem] = IdempotencyRecord(
                runtime.turn_id, int(time.time() * 1000)
            )
        ps.watermark.done(queued.offset)
        self.turns_finished += 1
        self.committer.offsets_changed()
        nxt = ps.dequeue(queued.request.key)
        if nxt is not None:
            self._admit(runtime.topics.partition, nxt)

    # -- commit plumbing ------------------------------------------------------------------

    async def _write(self, records: list[OutRecord], offsets: Offsets) -> None:
        await asyncio.to_thread(
            self._writer.write, records, offsets, self._consumer, self._group_metadata
        )

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
                turn_id, steps=dict(old.journal.steps), progress=old.journal.progress
            )
            queued = QueuedTurn(running.offset, old.request)
            runtime = self._new_runtime(running.partition, old.request, journal)
            runtime.attempt = old.attempt + 1
            runtime.next_seq = runtime.committed_seq = old.committed_seq
            task = asyncio.create_task(self._run_turn(runtime, queued), name=turn_id)
            self._running[turn_id] = _Running(runtime, task, running.partition, running.offset)


def run_worker(
    agent: KafkaAgent,
    bootstrap_servers: str,
    options: WorkerOptions | None = None,
    *,
    handle_signals: bool = True,
) -> None:
    """Run a worker until SIGTERM/SIGINT (graceful: drain, commit, leave the group)."""
    import signal

    worker = KafkaWorker(agent, bootstrap_servers=bootstrap_servers, options=options)

    async def main() -> None:
        if handle_signals:
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, worker.stop)
        await worker.run()

    asyncio.run(main())


__all__: Sequence[str] = ["KafkaWorker", "PoisonOptions", "WorkerOptions", "run_worker"]
