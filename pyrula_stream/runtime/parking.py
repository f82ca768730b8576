"""Parked turns of a worker: turns that only their journal holds, waiting for sub-agent
replies or a wake time, and the timers that wake them.

A parked turn has no task, no concurrency slot and no pin on its partition's input
offset; what it waits for is its ``park`` journal record. At assignment the owner re-arms
every parked turn of the partition from the restored journal (its timers live in this
worker's event loop, rebuilt at each assignment from the journal, so a timer survives
crashes and rebalances). A turn resumes by replay when the last reply it waits for is
journaled, when its time comes, or when it is cancelled.

A reply is taken only for a call its parent's journal holds. A running parent counts a
call step as journaled once this process hears that its commit succeeded, but the child
can read its request, run and reply as soon as the broker has the commit, before then.
A reply to a call whose commit is still in flight here therefore waits for that commit
(and the partition's later replies wait behind it, so the read position stays in order):
if it committed the reply is taken, if it aborted the reply was not genuine (an aborted
transaction aborts the child's request too) and is dead-lettered.

A signal for a turn the partition does not know waits the same way, for the turns
consumer to read as far as the turns partition reached when the signal was read (at most
``SIGNAL_HOLD_S``): its sender wrote the request first, but another consumer reads it.

A reply whose parse succeeded is never charged for this worker's own failures (a local
table that cannot be read, a bug): deciding or applying it that fails ends the session
(``failure``), so the partition is restored from its journal and the reply read again
from the journaled position, instead of being logged and passed. A reply that fails
``max_failures`` times in a row is quarantined: dead-lettered with code
``poison_quarantine``, and the position moves past it.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
import time
from collections.abc import Callable
from functools import partial
from typing import Any, Protocol

from pyrula_stream.agent.definition import AgentTopics
from pyrula_stream.context.approvals import question_expired
from pyrula_stream.durable.journal import TurnJournal
from pyrula_stream.durable.turn import TurnRuntime
from pyrula_stream.errors import ErrorCode
from pyrula_stream.kafka.offsets import ConsumedRecord
from pyrula_stream.runtime.committer import GroupCommitter
from pyrula_stream.runtime.partition import ParkedTurn, PartitionState, QueuedTurn
from pyrula_stream.runtime.session import SessionLost
from pyrula_stream.runtime.taking import (
    call_committing,
    misplaced_signal,
    pending_names,
    pending_over_cap,
    refusal,
    refusal_letter,
    signal_size,
    too_large_reply,
    topic_kind,
)
from pyrula_stream.wire.caps import check_headers
from pyrula_stream.wire.fitting import fits, wire_size
from pyrula_stream.wire.guard import bad_record_reason
from pyrula_stream.wire.signals import (
    Signal,
    is_signal,
    parse_signal,
    signal_journal_record,
    signal_refusal,
)
from pyrula_stream.wire.subagents import (
    Park,
    Reply,
    cursor_record,
    parse_reply,
    reply_journal_record,
)

log = logging.getLogger(__name__)


SIGNAL_HOLD_S = 10.0
"""How long a signal for a turn not read yet waits for the turns to be read that far."""


class TurnsReader(Protocol):
    """What parking asks of the turns consumer."""

    def position(self, partition: int) -> int: ...

    def end_offset(self, partition: int) -> int: ...


def _now_ms() -> int:
    return int(time.time() * 1000)


def replies_owner(partition: int) -> str:
    """The committer's owner tag of a partition's reply records (not a turn id)."""
    return f"~replies/{partition}"


class ParkedTurns:
    """Re-arms, wakes and resumes the parked turns of the partitions a worker owns."""

    def __init__(
        self,
        parts: dict[int, PartitionState],
        admit: Callable[[int, QueuedTurn], None],
        cancelled: Callable[[str], bool],
        running: Callable[[str], TurnRuntime | None],
        *,
        max_failures: int = 3,
        quarantined: Callable[[str], None] = lambda source: None,
    ) -> None:
        self._parts = parts
        self._max_failures = max_failures
        self._quarantined = quarantined
        self._failures: dict[tuple[str, int, int], int] = {}
        """Per (topic, partition, offset), how often deciding that reply failed in a row."""
        self._admit = admit
        self._cancelled = cancelled
        self._running = running
        self.turns_reader: TurnsReader | None = None
        """The worker's turns consumer (set per session): how far it has read."""
        self._holds: list[tuple[int, int, float, asyncio.Future[None]]] = []
        """Signals waiting for the turns partition to be read to an offset: (partition,
        offset, give-up time, released)."""
        self._deciding: dict[int, tuple[PartitionState, asyncio.Future[None]]] = {}
        """Per partition, the last reply still waiting for its call's commit (with the
        partition state it was read for: a reassigned partition does not wait on it)."""
        self.failure: SessionLost | None = None
        """Set when a reply could not be decided or applied: no later reply is decided,
        and the worker's poll loop ends the session (``raise_failure``)."""
        self.batch_parked: Callable[[int, str, dict[str, Any]], None] = lambda p, t, b: None
        """Told of each turn that parks for its batch call (the lane's collector queues
        the call): partition, turn id and the park record's ``batch``."""
        self._taking: dict[tuple[int, str], dict[str, int]] = {}
        """Signals taken per (partition, turn) whose commit is not confirmed yet, by id,
        with their size: what the pending-signal caps count beside the journal."""

    def raise_failure(self) -> None:
        """End the session if a reply failed here (the partition is restored again)."""
        failure, self.failure = self.failure, None
        if failure is not None:
            raise failure

    def _failed(self, record: ConsumedRecord | None, partition: int, exc: BaseException) -> None:
        where = f"offset {record.offset}" if record is not None else "a reply"
        if record is not None:
            at = (record.topic, partition, record.offset)
            self._failures = {at: self._failures.get(at, 0) + 1}  # in a row: forget others
        log.error(
            "replies partition %d: %s could not be decided or applied (%r); restoring the "
            "partition from its journal to read it again",
            partition,
            where,
            exc,
            exc_info=exc,
        )
        if self.failure is None:
            self.failure = SessionLost(f"a reply of partition {partition} failed: {exc!r}")

    @property
    def count(self) -> int:
        return sum(len(ps.parked) for ps in self._parts.values())

    def rearm(self, partition: int) -> None:
        """After restore: every turn whose journal ends in a park record is parked again;
        one whose cancel this worker read before it owned the partition resumes to end."""
        ps = self._parts.get(partition)
        if ps is None:
            return
        for turn_id, journal in list(ps.journal.turns.items()):
            if journal.park is None or journal.terminal_ms is not None:
                continue
            try:
                park = Park.from_data(journal.park)
            except Exception as exc:  # a journal record we cannot read: leave it parked
                log.error("park record of %s unreadable, turn left parked: %s", turn_id, exc)
                continue
            ps.parked[turn_id] = parked_turn(park)
            if self._cancelled(turn_id):
                self.resume(partition, turn_id)
            else:
                self.arm(partition, turn_id)
            if park.batch is not None and turn_id in ps.parked:
                self.batch_parked(partition, turn_id, park.batch)

    def arm(self, partition: int, turn_id: str) -> None:
        """A turn just parked: resume it if it can go on now, else move its journal to
        disk and, if it has a wake time, put it on the partition's timer."""
        ps = self._parts.get(partition)
        parked = ps.parked.get(turn_id) if ps is not None else None
        if ps is None or parked is None:
            return
        journal = ps.journal.turns.get(turn_id)
        if journal is not None and parked.ready(
            journal.replies,
            _now_ms(),
            pending_names(journal) if parked.signals else (),
            journal.batch_results,
        ):
            self.resume(partition, turn_id)
            return
        if journal is None and parked.ready({}, _now_ms()):
            self.resume(partition, turn_id)
            return
        if journal is not None:
            del ps.journal.turns[turn_id]
            ps.journal.parked.put(journal)
        if parked.wake_at_ms is not None:
            heapq.heappush(ps.wakes, (parked.wake_at_ms, turn_id))
            if ps.wake_timer is None or ps.wakes[0] == (parked.wake_at_ms, turn_id):
                self._set_timer(ps)

    def _set_timer(self, ps: PartitionState) -> None:
        """One timer per partition, for its earliest wake time. Its callback names the
        partition, not its state: a timer outliving a revoke holds nothing of it."""
        if ps.wake_timer is not None:
            ps.wake_timer.cancel()
            ps.wake_timer = None
        if ps.wakes:
            delay = max(0.0, ps.wakes[0][0] / 1000 - time.time())
            loop = asyncio.get_running_loop()
            ps.wake_timer = loop.call_later(delay, self._wake, ps.partition)

    def _wake(self, partition: int) -> None:
        """Resume every parked turn whose time has come; set the timer for the next."""
        ps = self._parts.get(partition)
        if ps is None:
            return
        ps.wake_timer = None
        now = _now_ms()
        while ps.wakes and ps.wakes[0][0] <= now:
            at, turn_id = heapq.heappop(ps.wakes)
            parked = ps.parked.get(turn_id)
            if parked is not None and parked.wake_at_ms == at:  # else: resumed meanwhile
                self.resume(partition, turn_id)
        self._set_timer(ps)

    def resume(self, partition: int, turn_id: str) -> None:
        """Run the turn again by replay (once, however many wake-ups arrive); its journal
        comes back from disk and its request from its park record."""
        ps = self._parts.get(partition)
        if ps is None or turn_id not in ps.parked or turn_id in ps.resuming:
            return
        journal = ps.journal.turns.get(turn_id)
        if journal is None:
            journal = ps.journal.parked.take(turn_id)
            if journal is None:
                log.error("parked turn %s has no journal here, left parked", turn_id)
                return
            ps.journal.turns[turn_id] = journal  # replies land here from now on
        if journal.park is None:
            log.error("parked turn %s has no park record, left parked", turn_id)
            return
        ps.resuming.add(turn_id)
        self._admit(partition, QueuedTurn(-1, Park.from_data(journal.park).request))

    def wake_to_cancel(self, turn_id: str) -> None:
        """A cancel for a parked turn: resume it so it ends with ``cancelled`` (and its
        running children are cancelled in its terminal transaction)."""
        for partition, ps in self._parts.items():
            if turn_id in ps.parked:
                self.resume(partition, turn_id)

    def take_reply(
        self,
        record: ConsumedRecord,
        topics: AgentTopics,
        worker_id: str,
        committer: GroupCommitter,
        room: int,
    ) -> None:
        """A child's outcome or a signal: journal it with the replies position in one
        transaction that also carries the input offsets (a worker that lost the partition
        is fenced). A record that is not the reply to a call the parent made and still
        waits for is dead-lettered in that transaction instead, with the reason; so is one
        whose journal copy would not fit in ``room`` bytes (a reply's parent then reads a
        failed reply that says so). Dead letters are fitted to ``room`` too. A reply
        to a call whose commit is still in flight here, and a signal for a turn whose
        request this worker has not read yet, are decided later (in order)."""
        p = record.partition
        ps = self._parts.get(p)
        if ps is None or self.failure is not None:
            return  # a failure ends the session: read again from the journaled position
        decide = partial(self._decide, ps, record, topics, worker_id, committer, room)
        earlier = self._deciding.get(p)
        ahead = earlier[1] if earlier is not None and earlier[0] is ps else None
        if ahead is None and self._call_commit(record) is None and not self._unread(ps, record):
            decide()
            return
        waiting = asyncio.ensure_future(self._decide_later(ps, record, ahead, decide))
        self._deciding[p] = (ps, waiting)
        waiting.add_done_callback(partial(self._decided, p))

    def _call_commit(self, record: ConsumedRecord) -> asyncio.Future[None] | None:
        if is_signal(record.headers):  # a signal answers no call: nothing to wait for
            return None
        try:
            reply = parse_reply(record.value)
        except Exception:  # an unreadable reply is refused without waiting, by _decide
            return None
        return call_committing(self._running(reply.parent_turn_id), reply)

    def _unread(self, ps: PartitionState, record: ConsumedRecord) -> bool:
        """Whether the record is a signal for a turn this partition does not know: its
        request may still be unread (a client sends the request first, but another
        consumer reads the turns)."""
        if self.turns_reader is None or not is_signal(record.headers):
            return False
        try:
            turn_id = parse_signal(record.value, record.offset).turn_id
        except Exception:  # refused without waiting, by _decide
            return False
        return (
            _journal_of(ps, turn_id) is None
            and turn_id not in ps.finished
            and turn_id not in ps.queued_ids
        )

    async def _decide_later(
        self,
        ps: PartitionState,
        record: ConsumedRecord,
        ahead: asyncio.Future[None] | None,
        decide: Callable[[], None],
    ) -> None:
        if ahead is not None:  # an earlier reply of the partition decides first
            await asyncio.wait([ahead])
        commit = self._call_commit(record)
        if commit is not None:
            log.debug("reply at offset %d waits for the commit of its call", record.offset)
            await asyncio.wait([commit])
        if self._parts.get(record.partition) is ps and self._unread(ps, record):
            await self._read_turns_to_end(record.partition)
        if self._parts.get(record.partition) is ps:  # else revoked: the new owner reads it
            decide()

    async def _read_turns_to_end(self, partition: int) -> None:
        """Wait until this worker has read the turns partition as far as it reached now
        (at most ``SIGNAL_HOLD_S``): a request sent before the signal is then known."""
        reader = self.turns_reader
        if reader is None:
            return
        try:
            end = await asyncio.to_thread(reader.end_offset, partition)
        except Exception as exc:  # the broker did not say: decide on what is known
            log.warning("end of turns partition %d unknown: %s", partition, exc)
            return
        held = asyncio.get_running_loop().create_future()
        self._holds.append((partition, end, time.monotonic() + SIGNAL_HOLD_S, held))
        await held

    @property
    def held(self) -> int:
        """Signals waiting for the turns to be read (``turns_read`` releases them)."""
        return len(self._holds)

    def turns_read(self) -> None:
        """The worker has handled all it polled from the turns topic: release the signals
        held for a partition read as far as they wait for (or held long enough)."""
        reader, now = self.turns_reader, time.monotonic()
        keep: list[tuple[int, int, float, asyncio.Future[None]]] = []
        for hold in self._holds:
            partition, end, give_up, held = hold
            gone = reader is None or partition not in self._parts
            if gone or now >= give_up or (reader is not None and reader.position(partition) >= end):
                if not held.done():
                    held.set_result(None)
            else:
                keep.append(hold)
        self._holds = keep

    def _decided(self, partition: int, done: asyncio.Future[None]) -> None:
        last = self._deciding.get(partition)
        if last is not None and last[1] is done:
            del self._deciding[partition]
        error = None if done.cancelled() else done.exception()
        if error is not None:
            self._failed(None, partition, error)

    def _decide(
        self,
        ps: PartitionState,
        record: ConsumedRecord,
        topics: AgentTopics,
        worker_id: str,
        committer: GroupCommitter,
        room: int,
    ) -> None:
        """Take the reply or signal, or dead-letter it, with the replies position, in the
        next commit."""
        p = record.partition
        if self.failure is not None:
            return  # an earlier reply failed: this one is read again after the restore
        at = (record.topic, p, record.offset)
        failures = self._failures.get(at, 0)
        if failures >= self._max_failures:
            del self._failures[at]
            self._quarantine(record, topics, worker_id, committer, room, failures)
            return
        kind = topic_kind(record, topics)
        taken: Reply | Signal | None
        why: str | None = None
        try:
            check_headers(record.headers, "signal" if is_signal(record.headers) else "reply")
            if is_signal(record.headers):
                taken = parse_signal(record.value, record.offset)
            elif kind != "replies":
                taken, why = None, f"a sub-agent's reply comes on {topics.replies}, not {kind}"
            else:
                taken = parse_reply(record.value)
        except Exception as exc:  # any flaw of outside bytes: dead-letter, never crash
            taken, why = None, bad_record_reason(exc)
        try:  # from here on a failure is this worker's, not the record's
            if isinstance(taken, Signal):
                why = misplaced_signal(taken, kind, topics) or self._signal_refusal(ps, taken)
            elif isinstance(taken, Reply):
                parent = taken.parent_turn_id
                why = refusal(_journal_of(ps, parent), parent in ps.finished, taken)
            records = [cursor_record(topics.journal, p, record.offset + 1, kind)]
            copy = None
            if why is None and isinstance(taken, Signal):
                copy = signal_journal_record(topics.journal, p, taken)
            elif why is None and isinstance(taken, Reply):
                copy = reply_journal_record(topics.journal, p, taken)
            if copy is not None and not fits(copy.key, copy.value, copy.headers, room):
                why = (
                    f"too_large: its journal copy would be "
                    f"{wire_size(copy.key, copy.value, copy.headers)} bytes, over the "
                    f"{room}-byte room of a record (the producer's message.max.bytes)"
                )
                taken, copy = too_large_reply(topics, p, taken, why, room)
            if why is not None and copy is None:
                taken = None
            if copy is not None:
                records.append(copy)
            if why is not None:
                records.append(refusal_letter(record, topics, worker_id, str(why), room))
            committed = committer.durable_records(replies_owner(p), records)
        except Exception as exc:
            self._failed(record, p, exc)
            return
        self._failures.pop(at, None)
        if taken is not None:
            committed.add_done_callback(partial(self._on_taken, p, taken))

    def _quarantine(
        self,
        record: ConsumedRecord,
        topics: AgentTopics,
        worker_id: str,
        committer: GroupCommitter,
        room: int,
        failures: int,
    ) -> None:
        """Deciding this reply failed ``failures`` sessions in a row: dead-letter it as
        poison and move the position past it (it can be redriven once the cause is fixed)."""
        p = record.partition
        why = f"deciding it ended {failures} sessions of this worker in a row"
        letter = refusal_letter(record, topics, worker_id, why, room, ErrorCode.POISON_QUARANTINE)
        kind = topic_kind(record, topics)
        records = [cursor_record(topics.journal, p, record.offset + 1, kind), letter]
        committer.durable_records(replies_owner(p), records)
        self._quarantined("replies")

    def _signal_refusal(self, ps: PartitionState, signal: Signal) -> str | None:
        journal = _journal_of(ps, signal.turn_id)
        ended = signal.turn_id in ps.finished or (
            journal is not None and journal.terminal_ms is not None
        )
        if journal is None and signal.turn_id in ps.queued_ids:
            # Read, waiting for a slot: kept, within the caps (its journal starts empty).
            refused = signal_refusal({}, ended, signal)
            if refused is not None:
                return refused
            return self._within_caps(ps.partition, TurnJournal(signal.turn_id), signal)
        question = (journal.park or {}).get("question") if journal is not None else None
        asked = question.get("key") if isinstance(question, dict) else None
        expired = journal is not None and question_expired(journal, signal.name, _now_ms())
        signals = None if journal is None else journal.signals
        refused = signal_refusal(signals, ended, signal, asked, expired and signal.answer)
        if refused is not None or journal is None:
            return refused
        return self._within_caps(ps.partition, journal, signal)

    def _within_caps(self, partition: int, journal: TurnJournal, signal: Signal) -> str | None:
        """Why taking ``signal`` would hold its turn past the pending-signal caps, or
        ``None`` (then it counts as taking until its commit). Signals taken but not
        committed yet count too: a batch is decided before the journal holds any of it."""
        taking = self._taking.setdefault((partition, signal.turn_id), {})
        for signal_id in [s for s in taking if s in journal.signals]:
            del taking[signal_id]
        refused = pending_over_cap(journal, signal, taking)
        if refused is None:
            taking[signal.signal_id] = signal_size(signal)
        return refused

    def _on_taken(self, partition: int, taken: Reply | Signal, fut: asyncio.Future[None]) -> None:
        if fut.cancelled() or fut.exception() is not None:
            return  # aborted: the record is read again
        try:
            if isinstance(taken, Signal):
                self.signal_committed(partition, taken)
            else:
                self.reply_committed(partition, taken)
        except Exception as exc:  # durable in the journal: a restore applies it
            self._failed(None, partition, exc)

    def signal_committed(self, partition: int, signal: Signal) -> None:
        """The signal is durable in the turn's journal: record it and wake the turn if it
        waits for that name."""
        ps = self._parts.get(partition)
        if ps is None:
            return
        turn_id = signal.turn_id
        taking = self._taking.get((partition, turn_id))
        if taking is not None and taking.pop(signal.signal_id, None) is not None and not taking:
            del self._taking[(partition, turn_id)]
        journal = ps.journal.turns.get(turn_id)
        if journal is None and turn_id in ps.queued_ids and turn_id not in ps.parked:
            journal = ps.journal.turns[turn_id] = TurnJournal(turn_id)  # it starts on this
        if journal is not None:
            journal.signals[signal.signal_id] = signal.data()
        elif turn_id in ps.parked:
            # One row more, not the parked journal rewritten (a turn may hold many).
            if not ps.journal.parked.add_signal(turn_id, signal.signal_id, signal.data()):
                return
        else:
            return
        parked = ps.parked.get(turn_id)
        if parked is not None and signal.name in parked.signals:
            self.resume(partition, turn_id)

    def reply_committed(self, partition: int, reply: Reply) -> None:
        """The reply is durable in the parent's journal: record it and wake the parent."""
        ps = self._parts.get(partition)
        if ps is None:
            return
        parent = reply.parent_turn_id
        journal = ps.journal.turns.get(parent)
        if journal is not None:
            journal.replies[reply.child_turn_id] = reply.data()
        elif parent in ps.parked:
            journal = ps.journal.parked.get(parent)
            if journal is None:
                return
            journal.replies[reply.child_turn_id] = reply.data()
            ps.journal.parked.put(journal)
        else:
            return
        parked = ps.parked.get(parent)
        if parked is not None and parked.ready(journal.replies, _now_ms()):
            self.resume(partition, parent)

    def batch_committed(self, partition: int, turn_id: str, custom_id: str, data: Any) -> None:
        """A batch call's outcome is durable in its turn's journal: record it there and
        resume the turn if it waits for that call."""
        ps = self._parts.get(partition)
        if ps is None:
            return
        journal = ps.journal.turns.get(turn_id)
        if journal is not None:
            journal.batch_results[custom_id] = data
        elif turn_id in ps.parked:
            journal = ps.journal.parked.get(turn_id)
            if journal is None:
                return
            journal.batch_results[custom_id] = data
            ps.journal.parked.put(journal)
        parked = ps.parked.get(turn_id)
        if parked is not None and parked.batch == custom_id:
            self.resume(partition, turn_id)


def parked_turn(park: Park) -> ParkedTurn:
    """What memory keeps of a turn parked by ``park``."""
    batch = park.batch.get("custom_id") if park.batch is not None else None
    return ParkedTurn(
        park.wake_at_ms,
        park.children,
        park.signals,
        str(batch) if batch is not None else None,
    )


def _journal_of(ps: PartitionState, turn_id: str) -> TurnJournal | None:
    """The turn's journal: in memory, or on disk while it is parked."""
    journal = ps.journal.turns.get(turn_id)
    if journal is None and turn_id in ps.parked:
        journal = ps.journal.parked.get(turn_id)
    return journal
