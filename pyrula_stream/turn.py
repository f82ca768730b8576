"""One running turn: its step counter, events, journal writes and replay lookups.

Every durable call goes through ``durable_step``: if the journal already holds the step
(same kind, name and input) its recorded data is returned and nothing runs; otherwise the
live call runs, and its result, with the events it produced, goes to the next commit in
one transaction. The body does not wait for that commit, except at a ``barrier``: before
a tool or ``ctx.step`` runs (an effect outside Kafka must never depend on a result that
could still be lost) and when the turn finishes. Events that are not steps (deltas,
status) ride the next commit too.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from pyrula_stream import serde
from pyrula_stream.errors import PayloadTooLarge, TurnCancelled
from pyrula_stream.journal import IDEMPOTENCY_PREFIX, PROGRESS, TERMINAL, TurnJournal
from pyrula_stream.records import OutRecord
from pyrula_stream.serde import Event, EventType, JournalEntry, TurnRequest

StepData = dict[str, Any]


class TurnOutput(Protocol):
    """Where a turn's records go: the worker's group committer."""

    def add(self, turn: TurnRuntime, records: list[OutRecord]) -> None: ...

    def durable(self, turn: TurnRuntime, records: list[OutRecord]) -> Awaitable[None]: ...


@dataclass
class TurnTopics:
    journal: str
    events: list[str]
    partition: int


@dataclass
class Spend:
    """What the turn has spent on model calls (recorded calls included)."""

    llm_calls: int = 0
    tool_calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cache_creation_input_tokens: int = 0
    cache_read_input_tokens: int = 0
    cost_usd: float = 0.0

    @property
    def billed_tokens(self) -> int:
        return self.input_tokens + self.output_tokens + self.cache_creation_input_tokens

    def as_dict(self) -> dict[str, Any]:
        return {
            "llm_calls": self.llm_calls,
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "cache_creation_input_tokens": self.cache_creation_input_tokens,
            "cache_read_input_tokens": self.cache_read_input_tokens,
            "cost_usd": round(self.cost_usd, 6),
        }


@dataclass
class TurnRuntime:
    """State of one turn on this worker; rebuilt from the journal after a crash."""

    request: TurnRequest
    topics: TurnTopics
    output: TurnOutput
    journal: TurnJournal
    attempt: int = 1
    max_record_bytes: int = 1_000_000
    max_event_count: int | None = None
    codec: serde.ValueCodec = serde.SCHEMALESS  # how event values are framed
    started_at: float = field(default_factory=time.monotonic)
    spend: Spend = field(default_factory=Spend)
    cancel_reason: str | None = None
    next_seq: int = 0
    committed_seq: int = 0
    finished: bool = False
    model_calls: int = 0
    steps_at_start: int = 0
    _unconfirmed: list[asyncio.Future[None]] = field(default_factory=list)
    _written: set[int] = field(default_factory=set)
    _step: int = 0
    _stalled: int = 0

    def __post_init__(self) -> None:
        self.next_seq = self.committed_seq = self.journal.next_seq
        self.steps_at_start = len(self.journal.steps)

    @property
    def turn_id(self) -> str:
        return self.request.turn_id

    @property
    def agent(self) -> str:
        return self.request.agent

    @property
    def cancelled(self) -> bool:
        return self.cancel_reason is not None

    def raise_if_cancelled(self) -> None:
        if self.cancel_reason is not None:
            raise TurnCancelled(f"turn cancelled: {self.cancel_reason}")

    def allocate_steps(self, count: int = 1) -> int:
        """Reserve ``count`` consecutive step indices in program order; returns the first."""
        first = self._step
        self._step += count
        return first

    # -- records -------------------------------------------------------------------------

    def _record(self, topic: str, key: str, value: bytes | None, ctype: str) -> OutRecord:
        rec = OutRecord(
            topic,
            key.encode(),
            value,
            [(serde.CONTENT_TYPE_HEADER, ctype.encode())],
            self.topics.partition if topic == self.topics.journal else None,
        )
        if rec.size > self.max_record_bytes:
            raise PayloadTooLarge(
                f"a record for {topic} would be {rec.size} bytes, over the "
                f"{self.max_record_bytes}-byte limit (max_record_bytes / the broker's "
                "message.max.bytes); shrink the tool result or raise both limits"
            )
        return rec

    def event_records(self, type_: str, data: dict[str, Any]) -> list[OutRecord]:
        """Build one event (taking the next ``seq``) for every events topic."""
        over_limit = self.max_event_count is not None and self.next_seq >= self.max_event_count
        if over_limit and type_ not in (EventType.RUN_COMPLETE, EventType.RUN_ERROR):
            return []
        event = Event(
            type_,
            self.turn_id,
            self.agent,
            self.next_seq,
            int(time.time() * 1000),
            self.attempt,
            data,
        )
        self.next_seq += 1
        framed = [(t, *self.codec.encode("event", event, t)) for t in self.topics.events]
        return [self._record(t, self.turn_id, value, ctype) for t, value, ctype in framed]

    def journal_record(self, entry: JournalEntry | None, key: str) -> OutRecord:
        value = serde.encode("journal_entry", entry) if entry is not None else None
        return self._record(self.topics.journal, key, value, serde.content_type("journal_entry"))

    def progress_record(self) -> OutRecord:
        """The turn's progress (attempt, next seq): rides every commit that touches the turn."""
        entry = JournalEntry(
            self.turn_id,
            -1,
            PROGRESS,
            data={
                "attempt": self.attempt,
                "next_seq": self.next_seq,
                "steps_at_start": self.steps_at_start,
                "stalled": self._stalled,
                "started_ms": int(time.time() * 1000),
            },
            attempt=self.attempt,
            ts_ms=int(time.time() * 1000),
        )
        return self.journal_record(entry, serde.journal_key(self.turn_id, -1, PROGRESS))

    # -- emission ------------------------------------------------------------------------

    def emit(self, type_: str, data: dict[str, Any]) -> None:
        """An event that is not a step (delta, status): rides the next commit."""
        self.output.add(self, self.event_records(type_, data))

    async def begin_attempt(self, stalled: int) -> None:
        """Journal that a new attempt started (poison detection counts these)."""
        self._stalled = stalled
        await self.output.durable(self, [])

    async def durable_step(
        self,
        kind: str,
        name: str,
        input_hash: str,
        live: Callable[[], Awaitable[StepData]],
        events: Callable[[StepData], list[tuple[str, dict[str, Any]]]] | None = None,
        step: int | None = None,
    ) -> tuple[StepData, bool]:
        """Return ``(data, replayed)``: the recorded data, or run ``live`` and journal it."""
        index = self.allocate_steps() if step is None else step
        recorded = self.journal.recorded(index, kind, name, input_hash)
        if recorded is not None:
            return recorded.data, True
        self.raise_if_cancelled()
        data = await live()
        entry = JournalEntry(
            self.turn_id, index, kind, name, input_hash, data, self.attempt, int(time.time() * 1000)
        )
        records = [self.journal_record(entry, entry.key)]
        for type_, event_data in events(data) if events else []:
            records += self.event_records(type_, event_data)
        self._journal_in_background(index, entry, self.output.durable(self, records))
        return data, False

    def _journal_in_background(
        self, index: int, entry: JournalEntry, committed: Awaitable[None]
    ) -> None:
        """The step counts as recorded once its commit succeeds; the body goes on meanwhile."""
        future = asyncio.ensure_future(committed)

        def confirm(done: asyncio.Future[None]) -> None:
            if not done.cancelled() and done.exception() is None:
                self.journal.steps[index] = entry

        future.add_done_callback(confirm)
        self._unconfirmed.append(future)
        self._written.add(index)

    async def barrier(self) -> None:
        """Wait until every step this attempt journaled so far is committed.

        Called before anything with an effect outside Kafka runs (a tool, a ``ctx.step``):
        the effect may depend on a model response, so that response must be durable first.
        """
        pending = [f for f in self._unconfirmed if not f.done()]
        self._unconfirmed = pending
        if pending:
            await asyncio.gather(*pending)

    async def finish(self, type_: str, data: dict[str, Any]) -> None:
        """Publish the terminal event, tombstone the steps, leave a small terminal record."""
        records = self.event_records(type_, data)
        records += self.closing_records(type_, data)
        self.finished = True
        await self.output.durable(self, records)

    def closing_records(self, type_: str, data: dict[str, Any]) -> list[OutRecord]:
        now = int(time.time() * 1000)
        terminal = JournalEntry(
            self.turn_id,
            -1,
            TERMINAL,
            type_,
            data={
                "status": "completed" if type_ == EventType.RUN_COMPLETE else "failed",
                "code": data.get("code"),
                "events": self.next_seq,
                "idempotency_key": self.request.idempotency_key,
            },
            attempt=self.attempt,
            ts_ms=now,
        )
        # Every step key: restored ones and this attempt's, committed or still in flight.
        indices = self.journal.step_indices() | self._written
        keys = [serde.journal_key(self.turn_id, i) for i in sorted(indices)]
        keys.append(serde.journal_key(self.turn_id, -1, PROGRESS))
        records = [self.journal_record(None, k) for k in keys]
        records.append(self.journal_record(terminal, serde.journal_key(self.turn_id, -1, TERMINAL)))
        if self.request.idempotency_key:
            records.append(
                self.journal_record(terminal, IDEMPOTENCY_PREFIX + self.request.idempotency_key)
            )
        return records
