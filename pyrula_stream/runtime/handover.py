"""The hand-over of partitions: what a worker does when its group assigns it partitions,
revokes them, or when it leaves them all (a stop, a session that failed).

librdkafka calls the rebalance callbacks in the group consumer's thread, inside ``poll``;
they hand over to the event loop and wait. So an assigned partition is restored from its
changelogs (``runtime/restore.py``) and gets its crash guard before any of its turns
runs, and a revoked partition's turns stop, and a commit in flight ends, before the
partition moves on. The intake marks of ``runtime/poison.py`` are written here: one when
a partition is taken over, a tombstone when it is handed over cleanly.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

from pyrula_stream.agent.definition import AgentTopics
from pyrula_stream.kafka.table import PartitionedTable
from pyrula_stream.kafka.transactions import ProducerFenced
from pyrula_stream.observability.metrics import WorkerMetrics
from pyrula_stream.runtime.batch_collector import BatchCollector, batch_owner
from pyrula_stream.runtime.committer import GroupCommitter
from pyrula_stream.runtime.housekeeping import JournalHousekeeping, keys_owner
from pyrula_stream.runtime.options import WorkerOptions
from pyrula_stream.runtime.parking import replies_owner
from pyrula_stream.runtime.partition import PartitionState
from pyrula_stream.runtime.poison import CrashGuard, IntakeMark, intake_owner
from pyrula_stream.runtime.restarts import SessionRestarts
from pyrula_stream.runtime.restore import restore_partition
from pyrula_stream.runtime.scheduler import TurnScheduler
from pyrula_stream.runtime.session import GroupSession, SessionLost
from pyrula_stream.wire.journal_keys import INTAKE_MARK_KEY
from pyrula_stream.wire.records import OutRecord

log = logging.getLogger(__name__)

REVOKE_COMMIT_WAIT_S = 10.0
"""How long a revoke waits for a transaction in flight (the transaction timeout)."""


def keys_file_name(group_id: str, worker_id: str, partition: str) -> str:
    """The file of a partition's idempotency keys: one per group, worker and partition."""
    return f"{group_id}.{worker_id}.journal-{partition}.sqlite"


class PartitionHandover:
    """Takes partitions over from their previous owner and hands them on to the next.

    ``parts`` is the worker's map of owned partitions (shared, not copied): a partition
    is in it from its restore to its revoke. ``session``, ``committer`` and ``state_dir``
    are read when a rebalance comes: they change with each session and start.
    """

    def __init__(
        self,
        topics: AgentTopics,
        options: WorkerOptions,
        parts: dict[int, PartitionState],
        scheduler: TurnScheduler,
        housekeeping: JournalHousekeeping,
        *,
        session: Callable[[], GroupSession | None],
        committer: Callable[[], GroupCommitter],
        state_dir: Callable[[], Path | None],
        worker_id: str,
        group_id: str,
        metrics: WorkerMetrics,
        restarts: SessionRestarts,
    ) -> None:
        self.restored_records = 0
        self._restarts = restarts
        self._topics = topics
        self._options = options
        self._parts = parts
        self._scheduler = scheduler
        self._housekeeping = housekeeping
        self._session = session
        self._committer = committer
        self._state_dir = state_dir
        self._worker_id = worker_id
        self._group_id = group_id
        self._metrics = metrics
        self._journal_table = PartitionedTable(topics.journal)
        self._threads_table = PartitionedTable(topics.threads)
        self._callback_error: Exception | None = None
        self.batches: BatchCollector | None = None
        """The batch lane's collector (agents with ``batch=``): told of each hand-over."""

    # -- rebalance (called in the consumer thread) ----------------------------------------

    def on_assign(self, partitions: list[int]) -> None:
        session = self._session()
        assert session is not None
        try:
            restored = {p: self._restore(p) for p in partitions}
            asyncio.run_coroutine_threadsafe(self._install(restored), session.loop).result()
        except Exception as exc:  # an exception must not die inside librdkafka's callback
            self._callback_error = exc

    def on_revoke(self, partitions: list[int]) -> None:
        session = self._session()
        assert session is not None
        try:
            asyncio.run_coroutine_threadsafe(self._revoke(set(partitions)), session.loop).result()
        except Exception as exc:
            self._callback_error = exc

    def raise_if_failed(self) -> None:
        """Raise ``SessionLost`` once for an error a rebalance callback kept (after a poll)."""
        if self._callback_error is not None:
            error, self._callback_error = self._callback_error, None
            raise SessionLost(f"rebalance handling failed: {error!r}") from error

    # -- taking a partition over ----------------------------------------------------------

    def _restore(self, partition: int) -> PartitionState:
        """Rebuild a partition's state from its changelogs (runs in the assign callback)."""
        state_dir = self._state_dir()
        assert state_dir is not None, "run() sets the state dir"
        session = self._session()
        assert session is not None
        started = time.monotonic()
        state, records = restore_partition(
            partition,
            reader=session.restorer,
            group_client=session.consumer.client,
            turns_topic=self._topics.turns,
            journal_table=self._journal_table,
            threads_table=self._threads_table,
            keys_file=state_dir / keys_file_name(self._group_id, self._worker_id, str(partition)),
        )
        self.restored_records += records
        self._metrics.restored(time.monotonic() - started, state.journal.records_read)
        return state

    async def _install(self, restored: dict[int, PartitionState]) -> None:
        for p, state in restored.items():
            self._parts[p] = state
            # Replies and parked turns need the watermark to start at the committed offset.
            state.watermark.start_at(state.restored_committed or 0)
            self._housekeeping.assigned(p, state)
            state.crash_guard = self._crash_guard(p, state)
        session = self._session()
        assert session is not None
        session.replies.assign({p: self._cursors(s) for p, s in restored.items()})
        for p in restored:
            if self.batches is not None:  # its batches first: re-armed turns queue calls
                self.batches.assigned(p)
            self._scheduler.parked.rearm(p)

    def _cursors(self, state: PartitionState) -> dict[str, int | None]:
        """Where to read each followed topic (replies, signals, answers) from, by name."""
        topics = self._topics
        names = {"replies": topics.replies, "signals": topics.signals, "answers": topics.answers}
        return {name: state.journal.cursors.get(kind) for kind, name in names.items()}

    def _crash_guard(self, p: int, state: PartitionState) -> CrashGuard:
        """Count a crash of the previous owner and commit this owner's intake mark before
        any turn of the partition starts (``runtime/poison.py``)."""
        stored = state.journal.intake_mark
        mark = IntakeMark.from_entry(*stored) if stored is not None else None
        committed = -1 if state.restored_committed is None else state.restored_committed
        return CrashGuard.restored(
            p,
            mark,
            committed,
            state.restored_end,
            options=self._options.poison,
            worker=self._worker_id,
            write_mark=partial(self._write_mark, p),
            release=partial(self._scheduler.admit, p),
            restarts=self._restarts.repeats(p, state.restored_committed),
        )

    def _write_mark(self, p: int, mark: IntakeMark) -> asyncio.Future[None]:
        return self._committer().durable_records(
            intake_owner(p), [mark.record(self._topics.journal, p)]
        )

    # -- handing partitions on ------------------------------------------------------------

    def _closing_marks(self, partitions: set[int]) -> list[OutRecord]:
        """A clean handover tombstones the intake marks: the next owner counts no crash,
        and compaction keeps nothing of a partition that was left cleanly."""
        return [
            self._housekeeping.tombstone(p, INTAKE_MARK_KEY)
            for p in sorted(partitions)
            if p in self._parts and self._parts[p].crash_guard is not None
        ]

    async def _revoke(self, partitions: set[int]) -> None:
        """Stop the partitions' turns and let a commit in flight end before they move on."""
        closing = self._closing_marks(partitions)
        for p in partitions:  # first, so nothing starts or restarts on them from now on
            self._parts.pop(p, None)
        session = self._session()
        if session is not None:
            session.replies.unassign(partitions)
        lost = self._scheduler.stop_partitions(partitions)
        if lost:
            await asyncio.wait(lost.values(), timeout=self._options.cancel_timeout)
        if self.batches is not None:
            await self.batches.revoked(partitions)
        # Buffered replies of these partitions are the new owner's to take now (purged
        # again after the commit in flight: an abort puts its replies back); so are the
        # batch lane's records.
        replies = {replies_owner(p) for p in partitions} | {batch_owner(p) for p in partitions}
        # The intake marks, and the expired keys' tombstones: the new owner may take such
        # a key again before a late tombstone of ours would land.
        marks = {intake_owner(p) for p in partitions} | {keys_owner(p) for p in partitions}
        self._committer().purge(set(lost) | replies | marks)
        if closing:
            await self._commit_closing(closing)
        if self._options.processing_guarantee == "exactly_once_v2":
            try:
                await asyncio.wait_for(self._committer().wait_idle(), REVOKE_COMMIT_WAIT_S)
            except TimeoutError:
                log.error(
                    "a commit was still in flight %ss after partitions %s were revoked",
                    REVOKE_COMMIT_WAIT_S,
                    sorted(partitions),
                )
        self._committer().purge(replies | marks)
        self._committer().forget_offsets({(self._topics.turns, p) for p in partitions})

    async def _commit_closing(self, records: list[OutRecord]) -> None:
        """Commit the clean-handover marks before the partitions move on; a handover that
        cannot commit them only makes the next owner count a crash if nothing progressed."""
        try:
            await asyncio.wait_for(
                self._committer().durable_records("pyrula.closing", records),
                self._options.cancel_timeout,
            )
        except (TimeoutError, asyncio.CancelledError, ProducerFenced):
            self._committer().purge({"pyrula.closing"})
            log.warning("the intake marks of a clean handover did not commit in time")

    async def leave_all(self, stopped: set[str], *, clean: bool) -> None:
        """Every partition leaves this worker (its turns, ``stopped``, were stopped): drop
        what the committer holds of them; a clean stop (``clean``) tombstones the intake
        marks and commits what is buffered, within ``cancel_timeout``."""
        if self.batches is not None:
            await self.batches.revoked(set(self._parts))
        if self._session() is not None:
            committer = self._committer()
            committer.purge(stopped | {intake_owner(p) for p in self._parts})
            if clean:
                committer.add_records(self._closing_marks(set(self._parts)))
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(committer.flush(), self._options.cancel_timeout)
        self._parts.clear()
