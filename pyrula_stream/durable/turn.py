"""One running turn: its step counter, events, journal writes and replay lookups.

Every durable call goes through ``durable_step``: if the journal already holds the step
(same kind, name and input) its recorded data is returned and nothing runs; otherwise the
live call runs, and its result, with the events it produced, goes to the next commit in
one transaction. The body does not wait for that commit, except at a ``barrier``: before
a tool or ``ctx.step`` runs (an effect outside Kafka must never depend on a result that
could still be lost) and when the turn finishes. Events that are not steps (deltas,
status) ride the next commit too.

When the turn finishes, the kernel writes its own closing records (tombstones of its
steps, its terminal record, its result) and the features that kept something for the
turn (its thread, its parent's reply, the replies and signals it took in) add theirs
through the ``TurnCloser``s that the layer wiring the turn registers: the kernel names
no feature.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Protocol

from pyrula_stream.agent.limits import Spend
from pyrula_stream.agent.tenants import TenantMeter
from pyrula_stream.durable.journal import TurnJournal
from pyrula_stream.durable.steps import StepData
from pyrula_stream.errors import ErrorCode, PyrulaError, TurnCancelled
from pyrula_stream.objects.resolver import PayloadStores
from pyrula_stream.observability.telemetry import TurnTelemetry
from pyrula_stream.state.threads import resolved_thread
from pyrula_stream.wire import serde
from pyrula_stream.wire.events import (
    EventRouting,
    Payload,
    RunComplete,
    RunError,
    Terminal,
    TurnEvents,
)
from pyrula_stream.wire.journal_keys import IDEMPOTENCY_PREFIX, PROGRESS, TERMINAL, journal_key
from pyrula_stream.wire.payload_refs import Offload, StoredValue
from pyrula_stream.wire.records import (
    OutRecord,
    result_records,
    shared_headers,
    tombstone,
    wire_record,
)
from pyrula_stream.wire.serde import JournalEntry, TurnRequest, TurnResult

if TYPE_CHECKING:
    from pyrula_stream.durable.branch import Branch
    from pyrula_stream.state.threads import ThreadHandle
    from pyrula_stream.wire.subagents import Park


class TurnOutput(Protocol):
    """Where a turn's records go: the worker's group committer."""

    def add(self, turn: TurnRuntime, records: list[OutRecord]) -> None: ...

    def durable(
        self, turn: TurnRuntime, records: list[OutRecord], *, urgent: bool = True
    ) -> asyncio.Future[None]:
        """A future of the commit that carries ``records``: the same object for every
        call of the turn that joins the same commit."""
        ...

    def hurry(self) -> None: ...

    def room(self, waited_s: float) -> Awaitable[None] | None: ...


class TurnCloser(Protocol):
    """A feature's part of a finishing turn's terminal transaction (its thread, its
    parent's reply, the journal keys it added for the turn). The layer that wires the
    turn registers one per feature (``TurnRuntime.closers``): the kernel names none."""

    def __call__(self, closing: Closing, /) -> None:
        """Add the feature's records to ``closing``."""


@dataclass(slots=True)
class Closing:
    """A finishing turn as its closers see it, and what they add to its terminal
    transaction, by where it goes there. The transaction holds, in this order (the
    journal's compaction and its readers rely on it): the terminal event, the tombstones
    of the turn's steps and progress, those of ``keys``, the terminal record, ``state``,
    the idempotency record, the result, then ``others``."""

    turn: TurnRuntime
    terminal: Terminal
    code: str | None
    """The terminal's error code; ``None`` when the turn completed."""
    entry: JournalEntry
    """The turn's terminal journal entry."""
    now_ms: int
    keys: list[str] = field(default_factory=list)
    """Journal keys the feature added for the turn, to tombstone."""
    state: list[OutRecord] = field(default_factory=list)
    """What outlives the turn (its recorded history, its thread's writes)."""
    others: list[OutRecord] = field(default_factory=list)
    """Records for other turns (the parent's reply, the children's cancels)."""


class _EncodeLater:
    """A journal entry's Avro value, made only if its record is sent (``OutRecord.deferred``);
    one small object, as thousands wait for a commit (a ``partial`` is two)."""

    __slots__ = ("data", "entry")

    def __init__(self, entry: JournalEntry, data: bytes) -> None:
        self.entry = entry
        self.data = data
        """``entry.data`` as JSON (UTF-8), taken when the entry was written."""

    def __call__(self) -> bytes:
        return serde.encode_journal_entry(self.entry, self.data)


_NO_STORES = PayloadStores()
"""The resolver of a worker without a store: a reference raises, naming its store."""

_JOURNAL_HEADERS = shared_headers(serde.CONTENT_TYPE_HEADER, serde.content_type("journal_entry"))
"""The one header list of every journal entry's record (``wire_record``'s too)."""
_JOURNAL_HEADER_BYTES = sum(len(k) + len(v) for k, v in _JOURNAL_HEADERS)


@dataclass(slots=True)
class TurnTopics:
    journal: str
    events: EventRouting
    partition: int


@dataclass(slots=True)
class TurnRuntime:
    """State of one turn on this worker; rebuilt from the journal after a crash. Slots:
    thousands are in flight at once."""

    request: TurnRequest
    topics: TurnTopics
    output: TurnOutput
    journal: TurnJournal
    closers: tuple[TurnCloser, ...]
    """What each feature adds to the terminal transaction, in the order it goes there."""
    attempt: int = 1
    max_record_bytes: int = 1_000_000
    max_event_count: int | None = None
    max_event_payload_bytes: int | None = None
    codec: serde.ValueCodec = serde.SCHEMALESS  # how event values are framed
    spend: Spend = field(default_factory=Spend)
    meter: TenantMeter | None = None
    """The turn's tenant's quotas (agents with ``tenant=``): checked before it starts and
    before each model call; its usage records commit with the steps that incurred it."""
    cancel_reason: str | None = None
    committed_seq: int = 0
    finished: bool = False
    model_calls: int = 0
    steps_at_start: int = 0
    started_ms: int | None = None
    refusal: PyrulaError | None = None
    version: str | None = None
    branch: Branch | None = None
    telemetry: TurnTelemetry = field(default_factory=TurnTelemetry)
    offload: Offload | None = None
    """Values past its threshold leave their records for the object store (``None``: no
    store, a record past ``max_record_bytes`` fails with ``PayloadTooLarge``)."""
    payloads: PayloadStores | None = None
    """What resolves the references in the turn's request and recorded steps."""
    params: dict[str, Any] | None = None
    """The request's parameters with their references resolved (what the body gets);
    ``request`` keeps the references, so records that copy it stay small."""
    resumed: bool = False
    parked: Park | None = None
    children: dict[str, str] = field(default_factory=dict)
    """Child turns this turn called (replayed or live), with their control topics."""
    thread: ThreadHandle | None = None
    thread_messages: list[dict[str, Any]] = field(default_factory=list)
    """The messages this turn added to its thread (what the model saw, minus history)."""
    thread_base: list[dict[str, Any]] | None = None
    """The compacted history this turn used instead of its thread's earlier turns."""
    thread_writes: list[tuple[str, bytes | None]] = field(default_factory=list)
    """What the terminal transaction wrote to the thread (applied locally once committed;
    set by the thread's closer)."""
    events: TurnEvents = field(init=False)
    _unconfirmed: list[asyncio.Future[None]] = field(default_factory=list)
    _written: dict[int, JournalEntry] = field(default_factory=dict)
    _committing: dict[int, asyncio.Future[None]] = field(default_factory=dict)
    _step: int = 0
    _stalled: int = 0
    progress_sent: bool = False
    """A commit (of any outcome) carried this turn's progress record: the key may exist."""

    def __post_init__(self) -> None:
        self.events = TurnEvents(
            self.turn_id,
            self.agent,
            self.topics.events,
            self.attempt,
            next_seq=self.journal.next_seq,
            dropped=self.journal.dropped_events,
            max_count=self.max_event_count,
            max_payload_bytes=self.max_event_payload_bytes,
            max_record_bytes=self.max_record_bytes,
            trace=self.telemetry.event_trace,
            codec=self.codec,
            offload=self.offload,
        )
        self.committed_seq = self.journal.next_seq
        self.steps_at_start = len(self.journal.steps)

    @property
    def turn_id(self) -> str:
        return self.request.turn_id

    @property
    def agent(self) -> str:
        return self.request.agent

    @property
    def partition(self) -> int:
        return self.topics.partition

    @property
    def next_seq(self) -> int:
        return self.events.next_seq

    @property
    def cancelled(self) -> bool:
        return self.cancel_reason is not None

    def raise_if_cancelled(self) -> None:
        if self.cancel_reason is not None:
            raise TurnCancelled(f"turn cancelled: {self.cancel_reason}")

    def refuse(self, error: PyrulaError) -> PyrulaError:
        """Remember an error that ends the turn even if the body catches it; returns it
        to raise (a Kafka limit such as a gated tool must not be talked around)."""
        if self.refusal is None:
            self.refusal = error
        return error

    def allocate_steps(self, count: int = 1) -> int:
        """Reserve ``count`` consecutive step indices in program order; returns the first."""
        first = self._step
        self._step += count
        return first

    def restart_from(self, previous: TurnRuntime) -> None:
        """A rerun after an abort continues ``seq`` where the committed events stopped."""
        self.attempt = previous.attempt + 1
        self.progress_sent = previous.progress_sent
        self.events.attempt = self.attempt
        self.events.next_seq = self.committed_seq = previous.committed_seq

    # -- records -------------------------------------------------------------------------

    def journal_record(
        self, entry: JournalEntry | None, key: str, *, unsent_key: bool = False
    ) -> OutRecord:
        """The entry (``None``: a tombstone) under ``key``; ``unsent_key``: a tombstone of
        a key no commit has carried before (see ``records.latest_only``)."""
        if entry is None:
            return tombstone(self.topics.journal, key, self.topics.partition, unsent_key=unsent_key)
        data = serde.json_bytes(entry.data)  # now: the step's dict may change later
        stored: tuple[StoredValue, ...] = ()
        offload = self.offload
        if offload is not None and len(data) > offload.threshold:
            what = f"journal entry {key} ({entry.kind} {entry.name!r})"
            smaller, values = offload.apply(entry.data, what, data)
            data, stored = serde.json_bytes(smaller), tuple(values)
        # Avro adds at most 10 bytes per field to its strings' UTF-8 (at most 4 per char).
        texts = len(entry.turn_id) + len(entry.kind) + len(entry.name) + len(entry.input_hash)
        bound = len(key) + _JOURNAL_HEADER_BYTES + 4 * texts + len(data) + 80
        if bound > self.max_record_bytes:  # near the limit: encode now to check exactly
            record = wire_record(
                self.topics.journal,
                key.encode(),
                serde.encode_journal_entry(entry, data),
                "journal_entry",
                partition=self.topics.partition,
                max_bytes=self.max_record_bytes,
            )
            record.compacted = True
            record.objects = stored
            return record
        # Encoded only if sent: most entries are replaced or cancelled in their commit.
        return OutRecord(
            self.topics.journal,
            key.encode(),
            None,
            _JOURNAL_HEADERS,
            self.topics.partition,
            True,
            deferred=_EncodeLater(entry, data),
            objects=stored,
        )

    def progress_record(self) -> OutRecord:
        """The turn's progress (attempt, next seq): rides every commit that touches the turn."""
        entry = self.progress_entry()
        return self.journal_record(entry, journal_key(self.turn_id, -1, PROGRESS))

    def progress_entry(self) -> JournalEntry:
        now = int(time.time() * 1000)
        return JournalEntry(
            self.turn_id,
            -1,
            PROGRESS,
            data={
                "attempt": self.attempt,
                "next_seq": self.next_seq,
                "dropped_events": self.events.dropped,
                "steps_at_start": self.steps_at_start,
                "stalled": self._stalled,
            },
            attempt=self.attempt,
            ts_ms=now,
        )

    # -- emission ------------------------------------------------------------------------

    def emit(self, payload: Payload) -> None:
        """An event that is not a step (delta, status): rides the next commit.

        Nothing is published after the terminal event: a late emit is dropped.
        """
        if not self.finished:
            self.output.add(self, self.events.records(payload))

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
        events: Callable[[StepData], Sequence[Payload]] | None = None,
        step: int | None = None,
        effects: Callable[[StepData], Sequence[OutRecord]] | None = None,
    ) -> tuple[StepData, bool]:
        """Return ``(data, replayed)``: the recorded data, or run ``live`` and journal it.

        ``effects`` are records that must commit with the step and never again (a
        sub-agent's turn request, a memory write): a replay takes the recorded data and
        writes nothing.
        """
        index, recorded = self.replayed_step(kind, name, input_hash, step)
        if recorded is not None:
            return recorded, True
        data = await live()
        self.record_step(index, kind, name, input_hash, data, events, effects)
        return data, False

    def replayed_step(
        self, kind: str, name: str, input_hash: str, step: int | None = None
    ) -> tuple[int, StepData | None]:
        """``durable_step``'s first half: the step's index and its recorded data (``None``:
        run it live, then ``record_step``). For a caller that awaits its live call
        itself (a model call: thousands wait in one at once, each holding its frames)."""
        index = self.allocate_steps() if step is None else step
        recorded = self.journal.recorded(index, kind, name, input_hash)
        if recorded is not None:
            return index, recorded.data
        self.raise_if_cancelled()
        return index, None

    def record_step(
        self,
        index: int,
        kind: str,
        name: str,
        input_hash: str,
        data: StepData,
        events: Callable[[StepData], Sequence[Payload]] | None = None,
        effects: Callable[[StepData], Sequence[OutRecord]] | None = None,
    ) -> None:
        """``durable_step``'s second half: journal a live step's data (with its events
        and effects) in the background."""
        if self.finished:  # a step that outlived its turn must not write after the end
            raise asyncio.CancelledError(f"turn {self.turn_id} already finished")
        entry = JournalEntry(
            self.turn_id, index, kind, name, input_hash, data, self.attempt, int(time.time() * 1000)
        )
        out = [self.journal_record(entry, entry.key), *(effects(data) if effects else ())]
        for payload in events(data) if events else ():
            out += self.events.records(payload)
        # No one waits for a step's commit until a barrier does: it may linger.
        self._journal_in_background(index, entry, self.output.durable(self, out, urgent=False))

    def _journal_in_background(
        self, index: int, entry: JournalEntry, committed: asyncio.Future[None]
    ) -> None:
        """The step counts as recorded once its commit succeeds; the body goes on meanwhile.

        Steps that join one commit share its future (``TurnOutput.durable``), and one
        confirmation records them all: no future and no callback per step."""
        self._written[index] = entry
        self._committing[index] = committed
        if self._unconfirmed and self._unconfirmed[-1] is committed:
            return  # the step before rides the same commit: its confirmation covers this
        committed.add_done_callback(self._confirm)
        self._unconfirmed.append(committed)

    def _confirm(self, done: asyncio.Future[None]) -> None:
        """``done`` settled: the steps it carried are recorded if it committed."""
        committed = not done.cancelled() and done.exception() is None
        for index in [i for i, f in self._committing.items() if f is done]:
            del self._committing[index]
            if committed:
                self.journal.steps[index] = self._written[index]
        if not self._committing:  # an emptied dict keeps its table: thousands wait
            self._committing = {}
        if self._unconfirmed and self._unconfirmed[0] is done:  # a barrier skips it now
            self._unconfirmed.pop(0)

    def committing_steps(self) -> list[tuple[JournalEntry, asyncio.Future[None]]]:
        """Steps this attempt wrote whose commit outcome this turn has not recorded yet,
        each with its commit's future. What another process does once the commit is
        durable (a child's reply to a call) can arrive before that future resolves, so
        such a record waits for it rather than judging by ``journal.steps`` alone."""
        return [(self._written[i], f) for i, f in self._committing.items()]

    async def barrier(self) -> None:
        """Wait until every step this attempt journaled so far is committed.

        Called before anything with an effect outside Kafka runs (a tool, a ``ctx.step``):
        the effect may depend on a model response, so that response must be durable first.
        """
        pending = [f for f in self._unconfirmed if not f.done()]
        self._unconfirmed = pending
        if pending:
            self.output.hurry()
        if len(pending) == 1:  # usually the step just before: no gathering future
            await pending[0]
        elif pending:
            await asyncio.gather(*pending)

    async def finish(self, terminal: Terminal) -> None:
        """Publish the terminal event, tombstone the steps, leave a small terminal record.

        From here on the turn writes nothing: ``emit`` drops and ``durable_step`` refuses.
        """
        if self.finished:
            return
        records = self.events.closing_records(terminal)
        closing = self.close(terminal)
        records += self.closing_records(closing)
        records += self.result_records(terminal)
        records += closing.others  # in the same transaction
        self.finished = True
        await self.output.durable(self, records)
        self.telemetry.ended(
            None if isinstance(terminal, RunComplete) else terminal.code, self.started_ms
        )

    async def park(self, park: Park) -> None:
        """Journal what the turn waits for, after every step before it; from then on the
        journal owns the turn (the worker lets go of its task, slot and input offset)."""
        await self.barrier()
        await self.output.durable(
            self, [park.record(self.topics.journal, self.topics.partition, self.attempt)]
        )
        self.parked = park
        self.journal.park = park.data()
        self.journal.progress = self.progress_entry()
        self.journal.raw_progress = None

    def result_records(self, terminal: Terminal) -> list[OutRecord]:
        """The turn's one result record (``<agent>.results`` and routed topics)."""
        routing = self.topics.events
        now = int(time.time() * 1000)
        start = self.journal.steps.get(0)
        started = self.started_ms or (
            int(start.data.get("started_ms") or 0) if start and start.kind == "start" else 0
        )
        usage = self.spend.as_dict()
        failed = terminal if isinstance(terminal, RunError) else None
        result = TurnResult(
            turn_id=self.turn_id,
            agent=self.agent,
            status="failed" if failed else "completed",
            result=None if isinstance(terminal, RunError) else terminal.result,
            error_code=failed.code if failed else None,
            error_message=failed.message if failed else None,
            usage=usage,
            cost_usd=float(usage["cost_usd"]),
            attempt=self.attempt,
            started_ms=started,
            finished_ms=now,
            duration_ms=now - started if started else 0,
            thread_id=self.request.thread_id,
            correlation_id=self.request.correlation_id,
            tenant=self.request.tenant,
        )
        return result_records(
            routing.results_topics(),
            self.request,
            result,
            fmt=routing.format,
            max_bytes=self.max_record_bytes,
            offload=self.offload,
            version=self.version,
        )

    @property
    def body_params(self) -> dict[str, Any]:
        """The parameters the agent body is called with."""
        return self.request.params if self.params is None else self.params

    async def resolved(self, value: Any) -> Any:
        """``value`` with its payload references read back; without a store, a reference
        raises ``PayloadUnresolved`` naming the store it needs."""
        return await (self.payloads or _NO_STORES).resolve_async(value)

    async def resolve_recorded(self) -> None:
        """Read back the values the turn's request and recorded steps hold by reference
        (a resumed, restored or branched turn), before its body runs: replay and the body
        then see whole values, as the live run did. Without a store, a reference fails the
        turn with ``PayloadUnresolved`` naming the store it needs."""
        payloads = self.payloads or _NO_STORES
        self.params = await payloads.resolve_async(self.request.params)
        if self.thread is not None and self.payloads is not None:  # what the model sees again
            self.thread = await resolved_thread(self.thread, payloads.resolve_async)
        for index, entry in list(self.journal.steps.items()):
            data = await payloads.resolve_async(entry.data)
            if data is not entry.data:
                self.journal.steps[index] = replace(entry, data=data)

    def close(self, terminal: Terminal) -> Closing:
        """The turn's terminal entry, with what every closer adds to the transaction."""
        now = int(time.time() * 1000)
        code = None if isinstance(terminal, RunComplete) else terminal.code
        entry = JournalEntry(
            self.turn_id,
            -1,
            TERMINAL,
            terminal.type,
            data={
                "status": "failed" if code else "completed",
                "code": code,
                "events": self.next_seq,
                "idempotency_key": self.request.idempotency_key,
            },
            attempt=self.attempt,
            ts_ms=now,
        )
        closing = Closing(self, terminal, code, entry, now)
        for closer in self.closers:
            closer(closing)
        return closing

    def closing_records(self, closing: Closing) -> list[OutRecord]:
        """The turn's journal records up to its idempotency record (``Closing`` says where
        the closers' records go)."""
        entry = closing.entry
        # Every step key: restored ones and this attempt's, committed or still in flight.
        # A step only this attempt wrote may still ride the commit this tombstone joins:
        # then neither is sent.
        restored = self.journal.step_indices()
        records = [
            self.journal_record(None, journal_key(self.turn_id, i), unsent_key=i not in restored)
            for i in sorted(restored | set(self._written))
        ]
        if self.journal.progress is not None or self.journal.raw_progress or self.progress_sent:
            records.append(self.journal_record(None, journal_key(self.turn_id, -1, PROGRESS)))
        records += [self.journal_record(None, k) for k in closing.keys]
        records.append(self.journal_record(entry, journal_key(self.turn_id, -1, TERMINAL)))
        records += closing.state
        # The key's record names the turn that took the key; a duplicate only points at it.
        if self.request.idempotency_key and closing.code != ErrorCode.DUPLICATE_RUN:
            records.append(
                self.journal_record(entry, IDEMPOTENCY_PREFIX + self.request.idempotency_key)
            )
        return records

    def every_step(self) -> Iterable[JournalEntry]:
        """Every step of the turn: restored ones and this attempt's, committed or still
        in flight (this attempt's entry where both have an index)."""
        return {**self.journal.steps, **self._written}.values()
