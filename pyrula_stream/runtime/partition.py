"""Per-partition bookkeeping of a worker: the input watermark and the per-key queues.

The input offset of a partition is committed only up to its lowest unfinished turn, so a
crash re-reads exactly the turns from there on; those that had ended are no-ops (their
terminal records, kept until the committed offset passes them, or their idempotency
key). Turns of one key (thread) run one at a time, in the order they were submitted.
"""

from __future__ import annotations

import asyncio
import heapq
from collections import deque
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

from pyrula_stream.durable.journal import PartitionJournal
from pyrula_stream.runtime.poison import CrashGuard
from pyrula_stream.state.threads import PartitionThreads
from pyrula_stream.wire.journal_keys import DEAD_LETTERED_PREFIX, TERMINAL, journal_key
from pyrula_stream.wire.serde import TurnRequest


@dataclass
class OffsetWatermark:
    """Offsets seen but not finished; ``committable`` is the lowest one (or the next)."""

    _order: deque[int] = field(default_factory=deque)
    _done: set[int] = field(default_factory=set)
    _next: int | None = None

    def start_at(self, offset: int) -> None:
        """The committed position at assignment: committable before any record is read,
        so a commit that must fence (a reply's) always carries this partition's offset."""
        if self._next is None:
            self._next = offset

    def track(self, offset: int) -> None:
        self._order.append(offset)
        self._next = offset + 1

    def done(self, offset: int) -> None:
        self._done.add(offset)
        while self._order and self._order[0] in self._done:
            self._done.discard(self._order.popleft())

    def committable(self) -> int | None:
        if self._order:
            return self._order[0]
        return self._next

    def committable_past(self, skipped: Collection[int]) -> int | None:
        """``committable`` as if the ``skipped`` offsets were done: how far this owner's
        own work has got when it leaves some records unfinished for another worker."""
        if not skipped:
            return self.committable()
        for offset in self._order:
            if offset not in self._done and offset not in skipped:
                return offset
        return self._next

    @property
    def unfinished(self) -> int:
        return len(self._order)


@dataclass(slots=True)
class QueuedTurn:
    offset: int
    request: TurnRequest
    duplicate_of: str | None = None
    trace: dict[str, str] | None = None
    quarantine: str | None = None
    """Set when the record crashed ``max_retries`` processes: dead-letter, do not run."""


@dataclass(frozen=True, slots=True)
class ParkedTurn:
    """What memory keeps of a parked turn: its wake time and the children it waits for
    (its journal waits on disk, ``PartitionJournal.parked``)."""

    wake_at_ms: int | None = None
    children: tuple[str, ...] = ()
    signals: tuple[str, ...] = ()
    """The signal names it waits for (one of them is enough)."""
    batch: str | None = None
    """The custom id of the batch call it waits for."""

    def ready(
        self,
        replies: Mapping[str, object],
        now_ms: int,
        pending: Collection[str] = (),
        results: Collection[str] = (),
    ) -> bool:
        """Whether the turn can resume: every awaited reply is in, a signal it waits for
        is pending (``pending``: the names of the signals no wait took yet), its batch
        call's outcome is journaled (``results``: the custom ids that are), or its time
        has come."""
        if self.wake_at_ms is not None and now_ms >= self.wake_at_ms:
            return True
        if self.batch is not None and self.batch in results:
            return True
        if self.signals and any(name in pending for name in self.signals):
            return True
        return bool(self.children) and all(c in replies for c in self.children)


@dataclass
class PartitionState:
    """One assigned partition: its journal, watermark, queues and what finished lately.

    A finished turn is remembered only while its request can still be read again: until
    the committed input offset passes it (``committed``). Turns restored as finished are
    forgotten once the committed offset reaches ``restored_end``, the input partition's
    end when the journal was restored (every such turn's request lies below it);
    ``restored_committed`` is the committed offset then. Keyed
    turns are also found through their idempotency key, which outlives both.
    """

    partition: int
    journal: PartitionJournal
    restored_end: int = 0
    restored_committed: int | None = None
    watermark: OffsetWatermark = field(default_factory=OffsetWatermark)
    queues: dict[str, list[QueuedTurn]] = field(default_factory=dict)
    """Per key, its turns in order, the running one first. A list, not a deque: most keys
    (a turn without a thread) hold one turn, and an empty deque alone is 600 bytes."""
    finished: dict[str, int] = field(default_factory=dict)  # turn id -> request offset
    _finished_order: list[tuple[int, str]] = field(default_factory=list, repr=False)
    """A heap of ``finished`` by request offset: a commit pops only the turns its offset
    passed, never walks those a long-running turn holds behind it."""
    committed_to: int = -1
    """The highest input offset committed so far: a turn below it that finishes now (its
    offset rode its own terminal commit) is never read again, so it is not remembered."""
    running_keys: dict[str, str] = field(default_factory=dict)
    queued_ids: set[str] = field(default_factory=set)
    threads: PartitionThreads = field(default_factory=PartitionThreads)
    _restored_forgotten: bool = field(default=False, init=False, repr=False)
    parked: dict[str, ParkedTurn] = field(default_factory=dict)
    """Turns only the journal holds now, waiting for replies or a time."""
    wakes: list[tuple[int, str]] = field(default_factory=list)
    """A heap of the parked turns' wake times (an entry whose turn resumed meanwhile is
    skipped): one timer per partition, set for the earliest (``wake_timer``)."""
    wake_timer: asyncio.TimerHandle | None = None
    resuming: set[str] = field(default_factory=set)
    crash_guard: CrashGuard | None = None
    """Counts crashes of the previous owners (``runtime/poison.py``)."""

    def is_finished(self, request: TurnRequest) -> bool:
        """Whether this turn already ended: its re-read request is a no-op."""
        if request.turn_id in self.finished:
            return True
        turn = self.journal.turns.get(request.turn_id)
        if turn is not None and turn.terminal_ms is not None:
            return True
        key = request.idempotency_key
        taken = self.journal.idempotency.get(key) if key else None
        return taken is not None and taken.turn_id == request.turn_id

    def original_turn(self, request: TurnRequest) -> str | None:
        """The turn that already took this request's idempotency key, if another one did."""
        key = request.idempotency_key
        if not key:
            return None
        entry = self.journal.idempotency.get(key)
        original = entry.turn_id if entry is not None else self.running_keys.get(key)
        return original if original != request.turn_id else None

    def turn_finished(self, request: TurnRequest, offset: int, ts_ms: int) -> None:
        """The turn's terminal record committed: remember it until the watermark passes
        (not at all when its own commit passed it; that commit's ``on_committed`` swept
        its terminal record). A resumed turn (offset -1) is remembered until the next
        commit that moves the offset."""
        if not 0 <= offset < self.committed_to:
            self.finished[request.turn_id] = offset
            heapq.heappush(self._finished_order, (offset, request.turn_id))
        self.journal.turns.pop(request.turn_id, None)
        key = request.idempotency_key
        if key and self.running_keys.get(key) == request.turn_id:
            del self.running_keys[key]
            self.journal.idempotency.remember(key, request.turn_id, ts_ms)

    def committed(self, offset: int) -> list[str]:
        """The input offset ``offset`` committed: forget the turns it passed.

        Returns their terminal journal keys: nothing reads those requests again, so the
        records can be tombstoned (by a later commit, never by this one).
        """
        self.committed_to = max(self.committed_to, offset)
        passed: list[str] = []
        order = self._finished_order
        while order and order[0][0] < offset:
            o, turn_id = heapq.heappop(order)
            if self.finished.get(turn_id) == o:
                del self.finished[turn_id]
                passed.append(turn_id)
        keys = [journal_key(turn_id, -1, TERMINAL) for turn_id in passed]
        lettered = [o for o in self.journal.dead_lettered if o < offset]
        for o in lettered:
            self.journal.dead_lettered.discard(o)
        keys += [f"{DEAD_LETTERED_PREFIX}{o}" for o in sorted(lettered)]
        if not self._restored_forgotten and offset >= self.restored_end:
            keys += self.journal.forget_finished()
            self._restored_forgotten = True  # turns finished here never enter the journal
        return keys

    @property
    def remembered_turns(self) -> int:
        """Finished turns held in memory (recent ones and restored terminal records)."""
        return len(self.finished) + len(self.journal.finished_turns())

    def close(self) -> None:
        """The partition left this worker: release its local tables and its timer."""
        if self.wake_timer is not None:
            self.wake_timer.cancel()
            self.wake_timer = None
        self.journal.idempotency.close()
        self.journal.parked.close()

    def enqueue(self, queued: QueuedTurn) -> bool:
        """Queue behind earlier turns of the same key; True when it may start now."""
        q = self.queues.get(queued.request.key)
        if q is None:
            q = self.queues[queued.request.key] = []
        q.append(queued)
        self.queued_ids.add(queued.request.turn_id)
        return len(q) == 1

    def dequeue(self, key: str) -> QueuedTurn | None:
        """Remove the finished head of ``key``'s queue; return the next turn to start."""
        q = self.queues.get(key)
        if not q:
            return None
        self.queued_ids.discard(q.pop(0).request.turn_id)
        if not q:
            del self.queues[key]
            return None
        return q[0]
