"""A turn's events: their types, one typed payload per type, and where each is routed.

Every site that publishes an event builds one of the payload classes below and hands it
to the turn (``TurnRuntime.emit`` / a step's events / ``finish``); ``TurnEvents`` numbers
it, applies the per-turn caps, encodes it once and routes it to ``<agent>.events`` plus
any output topics routed for its type. Adding an event type means a payload class here,
the site that emits it, the doc string of ``schemas/event.avsc`` and the table in
``docs/pipelines.md`` (``tests/wire/test_wire_contract.py`` fails until both name it).

Caps (``AgentLimits``):

- ``max_event_count_per_turn``: events past the cap are dropped, never the terminal
  event; one ``status`` event just before the terminal one says how many were dropped.
- ``max_event_payload_bytes``: the text of an ``llm:delta`` and the output of a
  ``tool:result`` are cut at a UTF-8 boundary with a marker; the journal keeps the whole
  value.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any, ClassVar, Protocol

from pyrula_stream.errors import ErrorCode, PyrulaError
from pyrula_stream.wire import serde
from pyrula_stream.wire.avro_writer import avro_string, event_value
from pyrula_stream.wire.payload_refs import Offload
from pyrula_stream.wire.records import OutRecord, shared_headers, wire_record
from pyrula_stream.wire.text import truncate_utf8


class EventType(StrEnum):
    RUN_START = "run:start"
    LLM_DELTA = "llm:delta"
    LLM_COMPLETE = "llm:complete"
    TOOL_START = "tool:start"
    TOOL_RESULT = "tool:result"
    SUBAGENT_START = "subagent:start"
    SUBAGENT_RESULT = "subagent:result"
    STATUS = "status"
    RUN_INTERRUPTED = "run:interrupted"
    RUN_COMPLETE = "run:complete"
    RUN_ERROR = "run:error"
    RUN_DEFERRED = "run:deferred"

    @property
    def is_terminal(self) -> bool:
        return self in _TERMINAL_TYPES


_TERMINAL_TYPES = frozenset({EventType.RUN_COMPLETE, EventType.RUN_ERROR})
"""Read on every event: a set of members, not two enum lookups each time."""

_TYPE_BYTES = {t: avro_string(t) for t in EventType}
"""Each event type as the Avro string that starts its events' values."""


@dataclass(frozen=True, slots=True)
class Event:
    """One event as it travels on the events topic (``schemas/event.avsc``)."""

    type: str
    turn_id: str
    agent: str
    seq: int
    ts_ms: int
    attempt: int = 1
    data: dict[str, Any] = field(default_factory=dict)

    @property
    def is_terminal(self) -> bool:
        return self.type in _TERMINAL_TYPES


def decode_event(
    payload: bytes, headers: Mapping[str, str], codec: serde.ValueCodec | None = None
) -> Event:
    """An event record's value (its ``content-type`` header says the framing; ``codec``
    reads registry-framed values)."""
    return Event(**serde.decode_record("event", payload, headers, codec))


# --- payloads: one class per event type ----------------------------------------------------


class Payload(Protocol):
    """What every payload class offers: its event type and its ``data`` dict."""

    type: ClassVar[EventType]

    def data(self) -> dict[str, Any]: ...


@dataclass(frozen=True, slots=True)
class RunStart:
    type: ClassVar[EventType] = EventType.RUN_START
    params: dict[str, Any]
    metadata: dict[str, Any]
    thread_id: str | None
    worker: str
    started_ms: int
    parent: dict[str, str] | None = None
    """A sub-agent turn's caller (``agent``, ``turn_id``), from its request's lineage
    headers: never from ``metadata``, which any submitter writes."""

    def data(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "params": self.params,
            "metadata": self.metadata,
            "thread_id": self.thread_id,
            "worker": self.worker,
            "started_ms": self.started_ms,
        }
        if self.parent is not None:
            data["parent"] = self.parent
        return data


@dataclass(frozen=True, slots=True)
class LlmDelta:
    type: ClassVar[EventType] = EventType.LLM_DELTA
    call: int
    text: str

    def data(self) -> dict[str, Any]:
        return {"call": self.call, "text": self.text}

    def cut(self, max_bytes: int) -> LlmDelta:
        return replace(self, text=truncate_utf8(self.text, max_bytes))


@dataclass(frozen=True, slots=True)
class LlmComplete:
    type: ClassVar[EventType] = EventType.LLM_COMPLETE
    call: int
    model: str
    text: str
    tool_calls: list[dict[str, Any]]
    stop_reason: str | None
    usage: dict[str, Any]
    total: dict[str, Any]
    batch: dict[str, Any] | None = None
    """Set when the call went by batch: its custom id and batch id (priced at the batch
    price)."""

    def data(self) -> dict[str, Any]:
        data = {
            "call": self.call,
            "model": self.model,
            "text": self.text,
            "tool_calls": self.tool_calls,
            "stop_reason": self.stop_reason,
            "usage": self.usage,
            "total": self.total,
        }
        if self.batch is not None:
            data["batch"] = self.batch
        return data


@dataclass(frozen=True, slots=True)
class ToolStart:
    """A tool call about to run; ``described`` adds what the tool says of itself (an MCP
    tool: ``mcp_server``, ``mcp_tool``, ``destructive``)."""

    type: ClassVar[EventType] = EventType.TOOL_START
    call_key: str
    tool: str
    input: Mapping[str, Any]
    tool_use_id: str | None
    described: Mapping[str, Any] = field(default_factory=dict)

    def data(self) -> dict[str, Any]:
        return {
            "call_key": self.call_key,
            "tool": self.tool,
            "tool_use_id": self.tool_use_id,
            "input": dict(self.input),
            **self.described,
        }


@dataclass(frozen=True, slots=True)
class ToolResult:
    """A finished tool call as watchers see it; ``output`` is what the model read."""

    type: ClassVar[EventType] = EventType.TOOL_RESULT
    call_key: str
    tool: str
    tool_use_id: str | None
    status: str
    output: str
    attempts: int
    error_code: str | None = None
    cached: bool = False
    approval: Mapping[str, Any] | None = None
    """A gated call's ``approval`` ("approved", "rejected" or "expired"), ``approval_key``,
    ``answered_by`` and ``approval_reason``."""

    def data(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "call_key": self.call_key,
            "tool": self.tool,
            "tool_use_id": self.tool_use_id,
            "status": self.status,
            "output": self.output,
            "attempts": self.attempts,
        }
        if self.error_code:
            data["error_code"] = self.error_code
        if self.cached:
            data["cached"] = True
        if self.approval:
            data.update(self.approval)
        return data

    def cut(self, max_bytes: int) -> ToolResult:
        return replace(self, output=truncate_utf8(self.output, max_bytes))


@dataclass(frozen=True, slots=True)
class Status:
    """An ephemeral line for watchers: published, never journaled."""

    type: ClassVar[EventType] = EventType.STATUS
    text: str
    tool: str | None = None
    dropped_events: int | None = None
    waiting: str | None = None
    """What a turn that parks waits for (``"batch"``: its model call's batch)."""
    custom_id: str | None = None
    """The batch call it waits for."""

    def data(self) -> dict[str, Any]:
        data: dict[str, Any] = {"text": self.text}
        if self.tool:
            data["tool"] = self.tool
        if self.dropped_events is not None:
            data["dropped_events"] = self.dropped_events
        if self.waiting is not None:
            data["waiting"] = self.waiting
        if self.custom_id is not None:
            data["custom_id"] = self.custom_id
        return data


@dataclass(frozen=True, slots=True)
class RunInterrupted:
    """The turn parked on a question for a person: a tool approval or ``ctx.interrupt``.
    ``key`` is what the answer names (``pyrula-stream approve AGENT TURN KEY``)."""

    type: ClassVar[EventType] = EventType.RUN_INTERRUPTED
    reason: str
    key: str
    question: Any = None
    tool_name: str | None = None
    tool_use_id: str | None = None
    tool_input: Mapping[str, Any] | None = None
    deadline_ms: int | None = None

    def data(self) -> dict[str, Any]:
        data: dict[str, Any] = {"reason": self.reason, "key": self.key}
        if self.question is not None:
            data["question"] = self.question
        if self.tool_name is not None:
            data["tool_name"] = self.tool_name
            data["tool_use_id"] = self.tool_use_id
            data["tool_input"] = dict(self.tool_input or {})
        if self.deadline_ms is not None:
            data["deadline_ms"] = self.deadline_ms
        return data


@dataclass(frozen=True, slots=True)
class RunDeferred:
    """The turn's tenant is over a quota: the turn waits, parked with a durable timer,
    until ``resume_at`` (epoch milliseconds), when its tenant's window has room."""

    type: ClassVar[EventType] = EventType.RUN_DEFERRED
    reason: str
    tenant: str
    resume_at: int

    def data(self) -> dict[str, Any]:
        return {"reason": self.reason, "tenant": self.tenant, "resume_at": self.resume_at}


@dataclass(frozen=True, slots=True)
class SubagentStart:
    """A ``call_agent``: the child's turn request committed with this event."""

    type: ClassVar[EventType] = EventType.SUBAGENT_START
    call_key: str
    agent: str
    child_turn_id: str
    depth: int
    input: Mapping[str, Any]

    def data(self) -> dict[str, Any]:
        return {
            "call_key": self.call_key,
            "agent": self.agent,
            "child_turn_id": self.child_turn_id,
            "depth": self.depth,
            "input": dict(self.input),
        }


@dataclass(frozen=True, slots=True)
class SubagentResult:
    """The child's outcome, as the parent took it from its reply."""

    type: ClassVar[EventType] = EventType.SUBAGENT_RESULT
    agent: str
    child_turn_id: str
    status: str
    result: Any
    error_code: str | None
    usage: Mapping[str, Any]

    def data(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "agent": self.agent,
            "child_turn_id": self.child_turn_id,
            "status": self.status,
            "result": self.result,
            "usage": dict(self.usage),
        }
        if self.error_code is not None:
            data["error_code"] = self.error_code
        return data


@dataclass(frozen=True, slots=True)
class RunComplete:
    type: ClassVar[EventType] = EventType.RUN_COMPLETE
    result: Any
    usage: dict[str, Any]

    def data(self) -> dict[str, Any]:
        return {"result": self.result, "usage": self.usage}


@dataclass(frozen=True, slots=True)
class RunError:
    type: ClassVar[EventType] = EventType.RUN_ERROR
    code: str
    message: str
    error_type: str | None = None
    detail: Any = None
    original_turn_id: str | None = None

    @classmethod
    def of(cls, exc: PyrulaError) -> RunError:
        """What ``run:error`` carries for one of our errors."""
        return cls(
            code=str(exc.code or ErrorCode.INTERNAL),
            message=exc.message,
            error_type=getattr(exc, "error_type", None) or type(exc).__name__,
            detail=getattr(exc, "detail", None),
        )

    def data(self) -> dict[str, Any]:
        data: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.error_type is not None:
            data["error_type"] = self.error_type
        if self.detail is not None:
            data["detail"] = self.detail
        if self.original_turn_id is not None:
            data["original_turn_id"] = self.original_turn_id
        return data


Terminal = RunComplete | RunError

_TERMINAL_PAYLOADS = frozenset({RunComplete, RunError})
"""Asked of every event by its class: a set lookup, not an enum property and hash (an
enum member's hash is a Python call)."""

_HEAD_OF_CLASS: dict[type, bytes] = {
    cls: _TYPE_BYTES[cls.type]
    for cls in (
        RunStart,
        LlmDelta,
        LlmComplete,
        ToolStart,
        ToolResult,
        Status,
        RunInterrupted,
        RunDeferred,
        SubagentStart,
        SubagentResult,
        RunComplete,
        RunError,
    )
}
"""``_TYPE_BYTES`` by payload class, for the same reason."""


_EVENT_HEADERS = shared_headers(serde.CONTENT_TYPE_HEADER, serde.content_type("event"))
"""The one header list of every schemaless Avro event record."""
_EVENT_HEADER_BYTES = sum(len(k) + len(v) for k, v in _EVENT_HEADERS)


# --- routing and numbering -----------------------------------------------------------------


RESULTS = "results"
"""The ``output_topics`` key that routes each turn's result record (not an event type)."""

ROUTABLE = frozenset({*EventType, "*", RESULTS})
"""The keys ``output_topics`` accepts."""


@dataclass(frozen=True)
class EventRouting:
    """``<agent>.events`` for every event, plus the output topics routed per event type
    (``"*"`` routes every type); ``<agent>.results`` for the result record, plus the
    topics routed under ``"results"``. ``format`` is how both are written."""

    events_topic: str
    output_topics: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    results_topic: str | None = None
    format: serde.WireFormat = "avro"

    def topics_for(self, type_: EventType) -> list[str]:
        if not self.output_topics:  # the usual case, asked for every event
            return [self.events_topic]
        routed = [*self.output_topics.get(type_, ()), *self.output_topics.get("*", ())]
        extra = [t for t in dict.fromkeys(routed) if t != self.events_topic]
        return [self.events_topic, *extra]

    def results_topics(self) -> list[str]:
        routed = self.output_topics.get(RESULTS, ())
        own = [self.results_topic] if self.results_topic else []
        return list(dict.fromkeys([*own, *routed]))

    def all_topics(self) -> set[str]:
        return {self.events_topic, *(t for ts in self.output_topics.values() for t in ts)}


DROP_NOTICE_SLOTS = 2
"""Seqs kept free under the count cap: the drop notice and the terminal event."""


@dataclass(slots=True)
class TurnEvents:
    """Numbers, caps, encodes and routes one turn's events (see the module docstring)."""

    turn_id: str
    agent: str
    routing: EventRouting
    attempt: int
    next_seq: int = 0
    dropped: int = 0
    max_count: int | None = None
    max_payload_bytes: int | None = None
    max_record_bytes: int | None = None
    common: dict[str, Any] = field(default_factory=dict)
    """Fields every event of the turn carries in ``data``: ``version``, ``branch_of``."""
    trace: Callable[[], Mapping[str, str] | None] | None = None
    """The W3C trace context each event record carries in its headers."""
    codec: serde.ValueCodec = serde.SCHEMALESS
    """How Avro event values are framed (a registry's codec for ``serialization=
    "schema_registry"``); JSON events (``event_format="json"``) are never registry-framed."""
    offload: Offload | None = None
    """Event data past its threshold is stored by reference (``None``: no object store)."""
    _trace_of: Mapping[str, str] | None = None
    _trace_headers: list[tuple[str, bytes]] = field(default_factory=list)
    """``_trace_of`` encoded as headers: the same context for most of a turn's events."""
    _key: bytes | None = None
    """The turn id as every event record's key: encoded once, shared by the records
    waiting for a commit (thousands when as many turns step at once)."""
    _ident: bytes | None = None
    """The turn id and agent as Avro strings: the middle of every event value's head."""
    _plain: str | None = None
    """``_plain_topic``, once asked."""

    @property
    def key(self) -> bytes:
        if self._key is None:
            self._key = self.turn_id.encode()
        return self._key

    def records(self, payload: Payload) -> list[OutRecord]:
        """The payload's records (taking the next ``seq``), or none once over the cap."""
        if type(payload) in _TERMINAL_PAYLOADS:
            raise ValueError("a terminal event goes through closing_records")
        if self.max_count is not None and self.next_seq >= self.max_count - DROP_NOTICE_SLOTS:
            self.dropped += 1
            return []
        if self.max_payload_bytes is not None and isinstance(payload, LlmDelta | ToolResult):
            payload = payload.cut(self.max_payload_bytes)
        return self._encode(payload)

    def closing_records(self, terminal: Terminal) -> list[OutRecord]:
        """The drop notice (when events were dropped), then the terminal event."""
        records: list[OutRecord] = []
        if self.dropped:
            notice = Status(
                f"{self.dropped} events were dropped: the turn reached "
                f"max_event_count_per_turn={self.max_count}",
                dropped_events=self.dropped,
            )
            records += self._encode(notice)
        return records + self._encode(terminal)

    def _encode(self, payload: Payload) -> list[OutRecord]:
        data = {**payload.data(), **self.common} if self.common else payload.data()
        raw: bytes | None = None
        stored: tuple[Any, ...] = ()
        if self.offload is not None:
            raw = serde.json_bytes(data)
            if len(raw) > self.offload.threshold:
                data, values = self.offload.apply(data, f"the data of a {payload.type} event", raw)
                raw, stored = serde.json_bytes(data), tuple(values)
        seq, ts_ms = self.next_seq, int(time.time() * 1000)
        self.next_seq = seq + 1
        plain = self._plain
        if plain is None:
            plain = self._plain = self._plain_topic()
        if plain:  # the usual case, every step: one topic, schemaless Avro
            if raw is None:
                raw = serde.json_bytes(data)
            records = [self._plain_record(plain, payload, seq, ts_ms, raw)]
        else:
            records = self._routed(payload, seq, ts_ms, data)
        if stored:
            records[0].objects = stored
        trace = self.trace() if self.trace is not None else None
        if trace:
            if trace is not self._trace_of:
                self._trace_of = trace
                self._trace_headers = [(k, v.encode()) for k, v in trace.items()]
            for record in records:  # a new list: the record's own may be shared
                record.headers = record.headers + self._trace_headers
        return records

    def _plain_topic(self) -> str:
        """The events topic when every event goes there alone as schemaless Avro (what
        ``_plain_record`` writes), else ``""``: asked once per turn, not per event."""
        routing = self.routing
        if routing.output_topics or routing.format != "avro" or self.codec is not serde.SCHEMALESS:
            return ""
        return routing.events_topic

    def _plain_record(
        self, topic: str, payload: Payload, seq: int, ts_ms: int, data: bytes
    ) -> OutRecord:
        """One event record from its data's JSON to its Avro value in one pass: the head
        (type, turn id, agent) built once, the shared header list, the size checked
        without a second walk (``wire_record`` when near the limit, to refuse it)."""
        ident = self._ident
        if ident is None:
            ident = self._ident = avro_string(self.turn_id) + avro_string(self.agent)
        key = self._key
        if key is None:
            key = self._key = self.turn_id.encode()
        head = _HEAD_OF_CLASS.get(type(payload)) or _TYPE_BYTES[payload.type]
        value = event_value(head + ident, seq, ts_ms, self.attempt, data)
        limit = self.max_record_bytes
        if limit is not None and len(key) + len(value) + _EVENT_HEADER_BYTES > limit:
            return wire_record(topic, key, value, "event", max_bytes=limit)
        return OutRecord(topic, key, value, _EVENT_HEADERS)

    def _routed(
        self, payload: Payload, seq: int, ts_ms: int, data: dict[str, Any]
    ) -> list[OutRecord]:
        """An event routed to more topics, written as JSON or registry-framed."""
        fmt = self.routing.format
        topics = self.routing.topics_for(payload.type)
        if fmt == "avro" and self.codec is serde.SCHEMALESS:
            if self._ident is None:
                self._ident = avro_string(self.turn_id) + avro_string(self.agent)
            head = _TYPE_BYTES[payload.type] + self._ident
            value = event_value(head, seq, ts_ms, self.attempt, serde.json_bytes(data))
            return [
                wire_record(t, self.key, value, "event", max_bytes=self.max_record_bytes)
                for t in topics
            ]
        event = Event(payload.type, self.turn_id, self.agent, seq, ts_ms, self.attempt, data)
        if fmt == "avro":  # registry-framed
            return [self._framed(t, event) for t in topics]
        value = serde.encode("event", event, fmt)
        return [
            wire_record(t, self.key, value, "event", max_bytes=self.max_record_bytes, fmt=fmt)
            for t in topics
        ]

    def _framed(self, topic: str, event: Event) -> OutRecord:
        """One registry-framed event (the codec names its content-type)."""
        value, ctype = self.codec.encode("event", event, topic)
        return wire_record(
            topic,
            self.key,
            value,
            "event",
            max_bytes=self.max_record_bytes,
            content_type=ctype,
        )
