"""Which turns run on a worker now: admission, concurrency slots, cancels, restarts.

The worker hands every turn that may start to ``admit``; the scheduler queues it with its
tenant's and starts turns, round-robin across tenants (``runtime/fairness.py``), while a
slot is free (``max_concurrent_turns``). A finished turn frees its
slot, lets its input offset be committed and starts the next turn of its key; a parked
turn frees all of that and leaves only its journal (``ParkedTurns`` wakes it). Cancel and
terminate requests from the control topic land here, as do the turns of an aborted
transaction, which restart from what their journal holds durably.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Collection
from dataclasses import dataclass

from pyrula_stream.agent.definition import KafkaAgent
from pyrula_stream.agent.tenants import DEFAULT_TENANT, TenantLimits
from pyrula_stream.durable.journal import TurnJournal
from pyrula_stream.durable.turn import TurnRuntime, TurnTopics
from pyrula_stream.errors import ErrorCode, TurnCancelled, TurnFailure
from pyrula_stream.objects.resolver import PayloadStores
from pyrula_stream.objects.sweep import object_prefix
from pyrula_stream.objects.urls import store_from_environment
from pyrula_stream.observability.telemetry import WorkerTelemetry
from pyrula_stream.observability.tracing import TraceCarrier
from pyrula_stream.runtime.closing import turn_closers
from pyrula_stream.runtime.committer import GroupCommitter
from pyrula_stream.runtime.execution import TurnExecutor
from pyrula_stream.runtime.fairness import FairQueue, TenantRoom, tenant_of
from pyrula_stream.runtime.options import WorkerOptions
from pyrula_stream.runtime.parking import ParkedTurns, parked_turn
from pyrula_stream.runtime.partition import PartitionState, QueuedTurn
from pyrula_stream.runtime.quotas import TenantQuotas
from pyrula_stream.runtime.versions import known_versions, missing_version
from pyrula_stream.wire import serde
from pyrula_stream.wire.events import RunError
from pyrula_stream.wire.payload_refs import Offload
from pyrula_stream.wire.records import ControlRequest
from pyrula_stream.wire.serde import TurnRequest

log = logging.getLogger(__name__)

MAX_REMEMBERED_CANCELS = 100_000
"""Cancel requests kept for turns this worker has not seen yet (oldest dropped first)."""


@dataclass(slots=True)
class RunningTurn:
    runtime: TurnRuntime
    task: asyncio.Task[None]
    partition: int
    offset: int


class TurnScheduler:
    """Runs the admitted turns of the partitions a worker owns, at most
    ``max_concurrent_turns`` at once.

    ``parts`` is the worker's map of owned partitions (shared, not copied): a turn of a
    partition that is no longer there is not started, and its end changes nothing.
    """

    def __init__(
        self,
        agent: KafkaAgent,
        options: WorkerOptions,
        parts: dict[int, PartitionState],
        *,
        telemetry: WorkerTelemetry,
        committer: Callable[[], GroupCommitter],
        executor: Callable[[], TurnExecutor],
        writer_codec: Callable[[], serde.ValueCodec],
        stopping: Callable[[], bool],
        quotas: TenantQuotas | None = None,
    ) -> None:
        self.agent = agent
        self.options = options
        self.turns_finished = 0
        self._parts = parts
        self._telemetry = telemetry
        self._committer = committer
        self._executor = executor
        self._writer_codec = writer_codec
        self._stopping = stopping
        self._running: dict[str, RunningTurn] = {}
        self._waiting = FairQueue()
        """Ready turns waiting for a slot, served round-robin across tenants."""
        self.quotas = quotas
        """The tenants' shared usage and operators' overrides (agents with ``tenant=``)."""
        self.tenant_limits: Callable[[str], TenantLimits] = (
            quotas.limits_for if quotas is not None else agent.tenancy.limits_for
        )
        self._cancels: OrderedDict[str, tuple[str, str]] = OrderedDict()
        self._undeliverable: dict[str, str] = {}
        """Turns being ended because their records keep failing delivery, with why."""
        store = store_from_environment(options.object_store)
        self.payloads = (
            PayloadStores([store], on_resolved=lambda n, _: telemetry.metrics.resolved_refs(n))
            if store is not None
            else None
        )
        """The object store that values past the offload threshold go to (``None``: none)."""
        self._offload = (
            Offload(
                store.name,
                agent.limits.offload_threshold_bytes or options.offload_threshold_bytes,
                agent.limits.max_payload_bytes,
                object_prefix(agent.prefix, agent.name),
            )
            if store is not None
            else None
        )
        self.parked = ParkedTurns(
            parts,
            self.admit,
            self._cancels.__contains__,
            self.runtime_of,
            max_failures=options.poison.max_retries,
            quarantined=telemetry.metrics.quarantined,
        )
        self._closers = turn_closers(agent)
        """What the agent's features add to a finishing turn's records (built once)."""

    @property
    def running_count(self) -> int:
        return len(self._running)

    @property
    def waiting_count(self) -> int:
        return len(self._waiting)

    def runtime_of(self, turn_id: str) -> TurnRuntime | None:
        """The turn's runtime if it has a task here now."""
        running = self._running.get(turn_id)
        return running.runtime if running is not None else None

    def inputs_of(self, turn_ids: Collection[str]) -> list[tuple[str, int, int]]:
        """``(turn id, partition, input offset)`` of those of ``turn_ids`` that run here
        (a resumed turn, whose offset was released when it parked, has none)."""
        out: list[tuple[str, int, int]] = []
        for turn_id in turn_ids:
            running = self._running.get(turn_id)
            if running is not None and running.offset >= 0:
                out.append((turn_id, running.partition, running.offset))
        return out

    def is_active(self, turn_id: str) -> bool:
        """Whether the turn has a task here now."""
        return turn_id in self._running

    def running_tasks(self) -> list[asyncio.Task[None]]:
        return [r.task for r in self._running.values()]

    # -- admission ------------------------------------------------------------------------

    def admit(self, partition: int, queued: QueuedTurn) -> None:
        """Start the turn now if a slot is free, else queue it for the next free slot."""
        if self._stopping():
            return  # not started, not committed: the next owner of the partition runs it
        ps = self._parts.get(partition)
        if ps is None:
            return  # revoked (a held turn released by its mark's commit): not ours to run
        guard = ps.crash_guard if queued.offset >= 0 else None
        if guard is not None:
            decision = guard.admit(queued)
            if decision == "hold":
                return
            if decision == "quarantine":
                queued.quarantine = (
                    f"the record at {self.agent.topics.turns}[{partition}]@{queued.offset} "
                    f"was running alone when {guard.options.max_retries} worker processes died "
                    "(or their sessions ended)"
                )
                self._telemetry.metrics.quarantined("turns")
        self._waiting.push(partition, queued)  # a free slot goes to the tenants in turn
        if len(self._running) < self.options.max_concurrent_turns:
            self.fill_slots()

    def fill_slots(self) -> bool:
        """Start waiting turns, round-robin across tenants, while slots are free; whether
        the worker has read far enough ahead (and its consumer should pause fetching)."""
        limit = self.options.max_concurrent_turns
        room = self._room()
        while self._waiting and len(self._running) < limit:
            item = self._waiting.pop(room.has_room)
            if item is None:
                break  # every waiting tenant is at its max_concurrent_turns
            p, queued = item
            if p in self._parts:
                room.started(tenant_of(queued))
                self._start(p, queued)
        return len(self._waiting) >= max(self.options.max_queued_turns, 1)

    def _room(self) -> TenantRoom:
        return TenantRoom(self.tenant_limits, self._running_tenants)

    def _running_tenants(self) -> list[str]:
        return [r.runtime.request.tenant or DEFAULT_TENANT for r in self._running.values()]

    def _start(self, partition: int, queued: QueuedTurn) -> None:
        ps = self._parts[partition]
        turn_id = queued.request.turn_id
        restored = ps.journal.turns.get(turn_id)
        journal = restored.materialize() if restored else TurnJournal(turn_id)
        version = missing_version(self.agent, journal, queued.request)
        if version is not None:  # pinned elsewhere: not started, offset not committed
            log.warning(
                "turn %s is pinned to version %s, which this worker lacks (it has %s); "
                "left for a worker that has it",
                turn_id,
                version,
                known_versions(self.agent),
            )
            self._declined(ps, queued)
            return
        ps.journal.turns[turn_id] = journal  # replies land here while the turn runs
        runtime = self._new_runtime(partition, queued.request, journal, queued.trace, queued.offset)
        runtime.resumed = ps.parked.pop(turn_id, None) is not None
        ps.resuming.discard(turn_id)
        self._spawn(runtime, queued, partition)

    def _spawn(self, runtime: TurnRuntime, queued: QueuedTurn, partition: int) -> None:
        task = asyncio.create_task(self._run(runtime, queued), name=runtime.turn_id)
        self._running[runtime.turn_id] = RunningTurn(runtime, task, partition, queued.offset)

    def _new_runtime(
        self,
        partition: int,
        request: TurnRequest,
        journal: TurnJournal,
        trace: TraceCarrier | None = None,
        offset: int = -1,
    ) -> TurnRuntime:
        agent, limits = self.agent, self.agent.limits
        topics = agent.topics
        runtime = TurnRuntime(
            request=request,
            topics=TurnTopics(topics.journal, agent.event_routing, partition),
            output=self._committer(),
            journal=journal,
            closers=self._closers,
            attempt=journal.attempt + 1,
            max_record_bytes=self.options.max_record_bytes,
            max_event_count=limits.max_event_count_per_turn,
            max_event_payload_bytes=limits.max_event_payload_bytes,
            telemetry=self._telemetry.for_turn(request, partition, offset, journal.steps, trace),
            codec=self._writer_codec(),
            offload=self._offload,
            payloads=self.payloads,
        )
        ps = self._parts.get(partition)
        if request.thread_id is not None and ps is not None:
            runtime.thread = ps.threads.handle(request.thread_id)
        cancel = self._cancels.get(request.turn_id)
        if cancel is not None:
            runtime.cancel_reason = cancel[1]
        if agent.tenancy.enabled:  # every event of the turn says whose it is
            tenant = request.tenant or DEFAULT_TENANT
            runtime.events.common["tenant"] = runtime.telemetry.tenant = tenant
            if self.quotas is not None:
                runtime.meter = self.quotas.meter(tenant, request.turn_id, agent.tenancy.on_quota)
        return runtime

    # -- a turn's end ---------------------------------------------------------------------

    async def _run(self, runtime: TurnRuntime, queued: QueuedTurn) -> None:
        """The turn's task: one attempt inside its telemetry (spans, metrics, log fields),
        entered here rather than by a coroutine wrapping this one: a frame fewer per turn."""
        with runtime.telemetry.attempt(runtime.attempt):
            executor = self._executor()
            try:
                if queued.duplicate_of is not None:
                    await executor.finish_duplicate(runtime, queued.duplicate_of)
                elif queued.quarantine is not None:
                    await executor.quarantine(runtime, queued.quarantine)
                else:
                    await executor.execute(runtime)
            except asyncio.CancelledError:
                if (
                    self._cancels.get(runtime.turn_id, ("",))[0] == "terminate"
                    and not runtime.finished
                ):
                    with contextlib.suppress(Exception):
                        await runtime.finish(
                            RunError.of(TurnCancelled(f"turn terminated: {runtime.cancel_reason}"))
                        )
                        self._finished(runtime, queued)
                    return
                raise
            if runtime.parked is not None:
                self._parked(runtime, queued)
            else:
                self._finished(runtime, queued)

    def _parked(self, runtime: TurnRuntime, queued: QueuedTurn) -> None:
        """The journal owns the turn now: free its slot, its key and its input offset."""
        self._running.pop(runtime.turn_id, None)
        ps = self._parts.get(runtime.topics.partition)
        if ps is None or runtime.parked is None:
            return
        park = runtime.parked
        ps.parked[runtime.turn_id] = parked_turn(park)
        self._release(ps, queued)
        self.parked.arm(ps.partition, runtime.turn_id)
        if park.batch is not None and runtime.turn_id in ps.parked:
            self.parked.batch_parked(ps.partition, runtime.turn_id, park.batch)

    def _finished(self, runtime: TurnRuntime, queued: QueuedTurn) -> None:
        self._running.pop(runtime.turn_id, None)
        ps = self._parts.get(runtime.topics.partition)
        if ps is None:
            return
        for key, value in runtime.thread_writes:  # committed with the terminal event
            ps.threads.apply(key, value)
        ps.turn_finished(runtime.request, queued.offset, int(time.time() * 1000))
        self.turns_finished += 1
        self._release(ps, queued)

    def _release(self, ps: PartitionState, queued: QueuedTurn) -> None:
        """The turn's input offset may be committed and its key's next turn may start;
        a resumed turn (offset -1) was released when it parked."""
        if queued.offset < 0:
            return
        ps.watermark.done(queued.offset)
        self._committer().offsets_changed()
        guard = ps.crash_guard
        if guard is not None:
            guard.ended(queued.offset, ps.watermark.committable_past(guard.left))
        nxt = ps.dequeue(queued.request.key)
        if nxt is not None:
            self.admit(ps.partition, nxt)

    def _declined(self, ps: PartitionState, queued: QueuedTurn) -> None:
        """A turn admitted here will not start (its offset stays uncommitted, its key's
        later turns behind it): careful mode must not wait for it to end."""
        guard = ps.crash_guard
        if guard is None or queued.offset < 0:
            return
        guard.left.add(queued.offset)
        guard.ended(queued.offset, ps.watermark.committable_past(guard.left))

    # -- cancel, revoke, abort ------------------------------------------------------------

    def on_control(self, control: ControlRequest) -> None:
        """A cancel or terminate request: remembered (the turn may not have arrived yet),
        and passed to the turn if it runs here or is parked here."""
        reason = control.reason or control.action
        self._cancels[control.turn_id] = (control.action, reason)
        self._cancels.move_to_end(control.turn_id)
        while len(self._cancels) > MAX_REMEMBERED_CANCELS:  # the control topic is replayed
            self._cancels.popitem(last=False)
        running = self._running.get(control.turn_id)
        if running is None:
            self.parked.wake_to_cancel(control.turn_id)
            return
        running.runtime.cancel_reason = reason
        if control.action == "terminate":
            running.task.cancel(msg="terminate")

    def stop_partitions(self, partitions: set[int]) -> dict[str, asyncio.Task[None]]:
        """Cancel the partitions' turns and forget their waiting ones (a revoke); the
        cancelled tasks, by turn id, for the caller to wait on."""
        self._waiting.drop_partitions(partitions)
        lost = {t: r.task for t, r in self._running.items() if r.partition in partitions}
        for turn_id, task in lost.items():
            task.cancel()
            del self._running[turn_id]
        return lost

    async def stop_all(self) -> set[str]:
        """Cancel every turn and wait for the tasks to end; the ids of those turns."""
        ids = set(self._running)
        for running in list(self._running.values()):
            running.task.cancel()
        for running in list(self._running.values()):
            with contextlib.suppress(BaseException):
                await running.task
        self._running.clear()
        self._waiting.clear()
        return ids

    def restart_aborted(self, turn_ids: set[str]) -> None:
        """A transaction aborted: restart its turns from what is durably journaled (a turn
        being ended as undeliverable tries its ending again)."""
        for turn_id in turn_ids:
            self._rerun(turn_id, self._undeliverable.get(turn_id))

    def end_undeliverable(self, turn_id: str, reason: str) -> None:
        """The turn's records failed delivery commit after commit: end it with
        ``record_undeliverable`` instead of rerunning it. When even its ending cannot be
        delivered, it is dropped (its input offset moves on) with an error in the log."""
        running = self._running.get(turn_id)
        if running is None:
            return
        if turn_id in self._undeliverable:
            log.error(
                "turn %s dropped: not even its ending could be delivered (%s)", turn_id, reason
            )
            running.task.cancel()
            del self._running[turn_id]
            self._undeliverable.pop(turn_id, None)
            ps = self._parts.get(running.partition)
            if ps is not None:
                self._release(ps, QueuedTurn(running.offset, running.runtime.request))
            return
        log.error("turn %s ends with record_undeliverable: %s", turn_id, reason)
        self._undeliverable[turn_id] = reason
        self._rerun(turn_id, reason)

    def _rerun(self, turn_id: str, undeliverable: str | None) -> None:
        running = self._running.get(turn_id)
        if running is None:
            return
        running.task.cancel()
        if running.partition not in self._parts:  # revoked meanwhile: not ours to rerun
            del self._running[turn_id]
            self._undeliverable.pop(turn_id, None)
            return
        old = running.runtime
        journal = TurnJournal(
            turn_id,
            steps=dict(old.journal.steps),
            progress=old.journal.progress,
            replies=old.journal.replies,
            park=old.journal.park,
            signals=old.journal.signals,
            batch_results=old.journal.batch_results,
        )
        self._parts[running.partition].journal.turns[turn_id] = journal
        queued = QueuedTurn(running.offset, old.request)
        runtime = self._new_runtime(
            running.partition, old.request, journal, old.telemetry.trace, running.offset
        )
        runtime.restart_from(old)
        if undeliverable is None:
            self._spawn(runtime, queued, running.partition)
        else:
            self._spawn_ending(runtime, queued, running.partition, undeliverable)

    def _spawn_ending(
        self, runtime: TurnRuntime, queued: QueuedTurn, partition: int, reason: str
    ) -> None:
        async def end() -> None:
            failure = TurnFailure(
                f"the turn's records could not be delivered: {reason}",
                code=ErrorCode.RECORD_UNDELIVERABLE,
            )
            await runtime.finish(RunError.of(failure))
            self._undeliverable.pop(runtime.turn_id, None)
            self._finished(runtime, queued)

        task = asyncio.create_task(end(), name=f"{runtime.turn_id}-undeliverable")
        self._running[runtime.turn_id] = RunningTurn(runtime, task, partition, queued.offset)
