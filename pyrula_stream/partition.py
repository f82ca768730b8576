"""Per-partition bookkeeping of a worker: the input watermark and the per-key queues.

The input offset of a partition is committed only up to its lowest unfinished turn, so a
crash re-reads exactly the turns that had not ended (their journal makes finished ones
no-ops). Turns of one key (thread) run one at a time, in the order they were submitted.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from pyrula_stream.journal import PartitionJournal
from pyrula_stream.serde import TurnRequest
from pyrula_stream.subagents import Park


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

    @property
    def unfinished(self) -> int:
        return len(self._order)


@dataclass
class QueuedTurn:
    offset: int
    request: TurnRequest
    duplicate_of: str | None = None


@dataclass
class PartitionState:
    partition: int
    journal: PartitionJournal
    watermark: OffsetWatermark = field(default_factory=OffsetWatermark)
    queues: dict[str, deque[QueuedTurn]] = field(default_factory=dict)
    finished: set[str] = field(default_factory=set)
    running_keys: dict[str, str] = field(default_factory=dict)
    queued_ids: set[str] = field(default_factory=set)
    parked: dict[str, Park] = field(default_factory=dict)
    """Turns only the journal holds now, waiting for replies or a time."""
    resuming: set[str] = field(default_factory=set)

    def is_finished(self, request: TurnRequest) -> bool:
        """Whether this turn already ended: its re-read request is a no-op."""
        turn = self.journal.turns.get(request.turn_id)
        finished = turn is not None and turn.terminal_ms is not None
        return request.turn_id in self.finished or finished

    def original_turn(self, request: TurnRequest) -> str | None:
        """The turn that already took this request's idempotency key, if another one did."""
        key = request.idempotency_key
        if not key:
            return None
        entry = self.journal.idempotency.get(key)
        original = entry.turn_id if entry is not None else self.running_keys.get(key)
        return original if original != request.turn_id else None

    def enqueue(self, queued: QueuedTurn) -> bool:
        """Queue behind earlier turns of the same key; True when it may start now."""
        q = self.queues.setdefault(queued.request.key, deque())
        q.append(queued)
        self.queued_ids.add(queued.request.turn_id)
        return len(q) == 1

    def dequeue(self, key: str) -> QueuedTurn | None:
        """Remove the finished head of ``key``'s queue; return the next turn to start."""
        q = self.queues.get(key)
        if not q:
            return None
        self.queued_ids.discard(q.popleft().request.turn_id)
        if not q:
            del self.queues[key]
            return None
        return q[0]
