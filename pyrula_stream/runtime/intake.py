"""Record intake: the poll loop of a session, and where each record it reads goes.

The group consumer polls the turns topic in a thread and decodes there (a record that
cannot be decoded comes back as a ``BadRecord``, never as an exception); its rebalance
callbacks run inside that poll. Then the group-less readers are polled: control records
(cancel, terminate) and replies (sub-agents' answers, signals). Each record is handed on:
a turn request is tracked in its partition's watermark, queued behind its key's earlier
turns and admitted to the scheduler; a bad record is dead-lettered with its offset; a
control record goes to the scheduler, a reply to parking. Fetching pauses while enough
turns wait for a slot.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from pyrula_stream.agent.definition import KafkaAgent
from pyrula_stream.errors import ErrorCode
from pyrula_stream.kafka.group import BadRecord, TurnRecord
from pyrula_stream.kafka.offsets import ConsumedRecord
from pyrula_stream.kafka.table import PartitionedTable
from pyrula_stream.observability.metrics import WorkerMetrics
from pyrula_stream.runtime.committer import GroupCommitter
from pyrula_stream.runtime.partition import PartitionState, QueuedTurn
from pyrula_stream.runtime.scheduler import TurnScheduler
from pyrula_stream.runtime.session import GroupSession
from pyrula_stream.runtime.tenant_binding import bind_tenant
from pyrula_stream.wire import serde
from pyrula_stream.wire.journal_keys import DEAD_LETTERED_PREFIX
from pyrula_stream.wire.records import ControlRequest, content_type_header, dead_letter_source
from pyrula_stream.wire.serde import JournalEntry

log = logging.getLogger(__name__)


class RecordIntake:
    """Takes what a session reads into the partitions the worker owns.

    ``parts`` is the worker's map of owned partitions (shared, not copied): a record of a
    partition that is not there (revoked meanwhile) is left for its new owner.
    """

    def __init__(
        self,
        agent: KafkaAgent,
        parts: dict[int, PartitionState],
        scheduler: TurnScheduler,
        *,
        committer: Callable[[], GroupCommitter],
        worker_id: str,
        metrics: WorkerMetrics,
        record_room: int,
        stopping: Callable[[], bool],
        after_poll: Callable[[], None],
        tenant_key: bytes | None = None,
    ) -> None:
        self._agent = agent
        self._record_room = record_room
        """What a dead letter of a record read here is fitted to (``fitting.record_room``)."""
        self._topics = agent.topics
        self._parts = parts
        self._scheduler = scheduler
        self._parked = scheduler.parked
        self._committer = committer
        self._worker_id = worker_id
        self._metrics = metrics
        self._stopping = stopping
        self._after_poll = after_poll
        """Raises when a rebalance callback of the poll failed (the session is lost)."""
        self._journal_table = PartitionedTable(self._topics.journal)
        self._tenant_key = tenant_key

    async def run(self, session: GroupSession, committer_task: asyncio.Task[None]) -> None:
        """Poll until a stop is asked for; raise when the committer failed (fenced) or a
        rebalance callback did."""
        while not self._stopping():
            if committer_task.done():
                committer_task.result()  # re-raises ProducerFenced
            polled = await asyncio.to_thread(session.consumer.poll)
            self._after_poll()
            for item in polled:
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
            self._parked.raise_failure()  # a reply failed: restore, read it again
            session.consumer.set_paused(self._scheduler.fill_slots())

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
                self._topics.dlq,
                bad.source,
                bad.reason,
                ErrorCode.INVALID_REQUEST,
                worker=self._worker_id,
                max_bytes=self._record_room,
            )
            self._committer().add_records([letter, marker])
            ps.journal.dead_lettered.add(bad.offset)
            log.warning("dead-lettered %s: %s", bad.source.source, bad.reason)
        ps.watermark.track(bad.offset)
        ps.watermark.done(bad.offset)
        self._committer().offsets_changed()

    def _on_turn_record(self, record: TurnRecord) -> None:
        p, offset = record.partition, record.offset
        quotas = self._scheduler.quotas
        request = bind_tenant(
            self._agent.name,
            self._agent.tenancy,
            record.request,
            record.headers,
            key=self._tenant_key,
            operator=quotas.operator_limits if quotas is not None else None,
        )
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
            self._committer().offsets_changed()
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
            self._metrics.skipped_record("control")
            log.warning("ignoring unreadable control record: %.200r", value)
            return
        self._scheduler.on_control(control)

    def _on_reply(self, record: ConsumedRecord) -> None:
        self._parked.take_reply(
            record, self._topics, self._worker_id, self._committer(), self._record_room
        )
