"""Sub-agent calls as records: the child's turn request, its reply, and the parent's
journal records that make a call exactly once.

The call is a durable step of the parent whose records include the child's turn request,
so both commit in one transaction. The child's id is derived from the parent turn, the
call's key and the fingerprint of its parameters, so a replay finds the step recorded and
produces nothing, and a rerun of the same call names the same child; a request re-read on
the child's side is a no-op because its turn id is already running or finished. With the
parameters in it, the id cannot be guessed from the parent's turn id alone.

A parent takes a reply only if its journal holds a call step naming that child turn and
that agent, not yet answered, of a turn that has not ended (``refusal``); any other record
on its replies topic goes to its DLQ with the reason (code ``unsolicited_reply``).

The reply is written by the child's worker in the child's terminal transaction, to the
parent agent's ``replies`` topic at the parent's partition. The worker that owns that
partition journals it (``turn_id/reply:<child>``) together with its read position
(``cursor/replies``) in one transaction, so a reply is taken exactly once by whichever
worker owns the parent then. A parent waiting for replies is parked: a ``turn_id/park``
record says what it waits for, and nothing else of it stays in memory or in a slot.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from typing import Any

from pyrula_stream.errors import MalformedRecordError
from pyrula_stream.wire import caps, guard, serde
from pyrula_stream.wire.events import RunComplete, Terminal
from pyrula_stream.wire.journal_keys import PARK, REPLY_CURSOR_KEY, park_key, reply_key
from pyrula_stream.wire.lineage import Lineage
from pyrula_stream.wire.payload_refs import Offload, StoredValue
from pyrula_stream.wire.records import JSON_CONTENT_TYPE, OutRecord, wire_record
from pyrula_stream.wire.serde import JournalEntry, TurnRequest

CALL_KIND = "agent"
"""Journal kind of a call step (its data: the child's turn id)."""
REPLY_KIND = "reply"
"""Journal kind of the step that takes a reply (its data: the child's outcome)."""
CHILD_TURN_HEADER = "pyrula-child-turn-id"

_NAMESPACE = uuid.UUID("6f1d3c2e-6b0f-4f7e-9a53-2b8f0c6f7a11")


def child_turn_id(parent_turn_id: str, call_key: str, input_hash: str) -> str:
    """The same call (key and parameters) of the same parent turn always names the same
    child turn. A replay reads the id from the journal, so turns recorded with an earlier
    derivation go on with theirs."""
    return str(uuid.uuid5(_NAMESPACE, f"{parent_turn_id}|{call_key}|{input_hash}"))


def call_record(request: TurnRequest, turns_topic: str, max_bytes: int) -> OutRecord:
    """The child's turn request with its lineage headers, for the parent's transaction."""
    return wire_record(
        turns_topic,
        request.key.encode(),
        serde.encode("turn_request", request),
        "turn_request",
        max_bytes=max_bytes,
        headers=request.lineage.headers() if request.lineage is not None else (),
    )


@dataclass(frozen=True, slots=True)
class Reply:
    """A child turn's outcome as its parent reads it."""

    parent_turn_id: str
    child_turn_id: str
    agent: str
    status: str  # "completed" or "failed"
    result: Any = None
    code: str | None = None
    message: str | None = None
    usage: dict[str, Any] | None = None

    def data(self) -> dict[str, Any]:
        return {
            "parent_turn_id": self.parent_turn_id,
            "child_turn_id": self.child_turn_id,
            "agent": self.agent,
            "status": self.status,
            "result": self.result,
            "code": self.code,
            "message": self.message,
            "usage": self.usage or {},
        }

    @classmethod
    def from_data(cls, data: dict[str, Any]) -> Reply:
        """A reply from its JSON object; a missing or mistyped field is malformed."""
        what = "reply"
        for name in ("parent_turn_id", "child_turn_id", "agent", "status"):
            if name not in data:
                raise MalformedRecordError(f"reply is missing a field: {name!r}")
            if not isinstance(data[name], str):
                raise MalformedRecordError(f"reply: field {name!r} must be text")
        return cls(
            parent_turn_id=data["parent_turn_id"],
            child_turn_id=data["child_turn_id"],
            agent=data["agent"],
            status=data["status"],
            result=data.get("result"),
            code=guard.text_field(data, "code", what),
            message=guard.text_field(data, "message", what),
            usage=guard.dict_field(data, "usage", what),
        )


def reply_record(
    request: TurnRequest,
    terminal: Terminal,
    usage: dict[str, Any],
    offload: Offload | None = None,
) -> OutRecord:
    """The child's outcome for its parent, at the parent's partition, keyed by its turn; a
    result past ``offload``'s threshold goes by reference."""
    lineage = request.lineage
    assert lineage is not None
    stored: list[StoredValue] = []
    if isinstance(terminal, RunComplete):
        result = terminal.result
        if offload is not None:
            result, stored = offload.apply(result, f"the result of turn {request.turn_id}")
        reply = Reply(lineage.parent_turn_id, request.turn_id, request.agent, "completed", result)
    else:
        reply = Reply(
            lineage.parent_turn_id,
            request.turn_id,
            request.agent,
            "failed",
            code=terminal.code,
            message=terminal.message,
        )
    reply = Reply(**{**reply.data(), "usage": usage})
    return OutRecord(
        lineage.replies_topic,
        lineage.parent_turn_id.encode(),
        json.dumps(reply.data(), separators=(",", ":"), default=str).encode(),
        [JSON_CONTENT_TYPE, (CHILD_TURN_HEADER, request.turn_id.encode())],
        partition=lineage.parent_partition,
        objects=tuple(stored),
    )


def parse_reply(value: bytes | None) -> Reply:
    """A reply record's value; whatever it holds, the only error is
    ``MalformedRecordError``."""
    if not value:
        raise MalformedRecordError("reply has an empty value")
    data = guard.loads_object(value, "reply")
    reply = guard.decode("reply", lambda: Reply.from_data(data))
    for name in ("parent_turn_id", "child_turn_id"):
        turn_id: str = getattr(reply, name)
        caps.check_text(turn_id, caps.MAX_TURN_ID_CHARS, f"reply: {name}", "MAX_TURN_ID_CHARS")
    caps.check_text(reply.agent, caps.MAX_AGENT_NAME_CHARS, "reply: agent", "MAX_AGENT_NAME_CHARS")
    return reply


# -- the parent's journal records -------------------------------------------------------------


def _journal(topic: str, partition: int, key: str, entry: JournalEntry) -> OutRecord:
    return wire_record(
        topic,
        key.encode(),
        serde.encode("journal_entry", entry),
        "journal_entry",
        partition=partition,
    )


def reply_journal_record(topic: str, partition: int, reply: Reply) -> OutRecord:
    entry = JournalEntry(
        reply.parent_turn_id,
        -1,
        REPLY_KIND,
        reply.child_turn_id,
        data=reply.data(),
        ts_ms=int(time.time() * 1000),
    )
    return _journal(topic, partition, reply_key(reply.parent_turn_id, reply.child_turn_id), entry)


def cursor_record(topic: str, partition: int, next_offset: int, kind: str = "replies") -> OutRecord:
    """The read position in the agent's ``kind`` topic (replies, signals or answers)."""
    entry = JournalEntry("", -1, "cursor", data={"offset": next_offset})
    key = REPLY_CURSOR_KEY if kind == "replies" else f"cursor/{kind}"
    return _journal(topic, partition, key, entry)


@dataclass(frozen=True, slots=True)
class Park:
    """What a parked turn waits for: every listed child's reply, a signal of one of the
    listed names, or a wake time."""

    request: TurnRequest
    children: tuple[str, ...] = ()
    wake_at_ms: int | None = None
    signals: tuple[str, ...] = ()
    question: dict[str, Any] | None = None
    """The question for a person the turn waits on (``approvals.Question``)."""
    batch: dict[str, Any] | None = None
    """The model call the turn waits for in a batch: its custom id, provider, model,
    request and deadline (``context/batch_calls.py``)."""

    def data(self) -> dict[str, Any]:
        req = self.request
        return {
            "request": {
                "turn_id": req.turn_id,
                "agent": req.agent,
                "params": req.params,
                "metadata": req.metadata,
                "thread_id": req.thread_id,
                "idempotency_key": req.idempotency_key,
                "submitted_ms": req.submitted_ms,
                "lineage": req.lineage.as_dict() if req.lineage else None,
                # what the result record echoes: a resumed turn rebuilds its request here
                "correlation_id": req.correlation_id,
                "reply_headers": [list(h) for h in req.reply_headers],
                "record_key": req.record_key,
                "tenant": req.tenant,
            },
            "children": list(self.children),
            "wake_at_ms": self.wake_at_ms,
            "signals": list(self.signals),
            "question": self.question,
            **({"batch": self.batch} if self.batch is not None else {}),
        }

    @classmethod
    def from_data(cls, data: dict[str, Any]) -> Park:
        r = data["request"]
        request = TurnRequest(
            turn_id=r["turn_id"],
            agent=r["agent"],
            params=r["params"],
            metadata=r.get("metadata") or {},
            thread_id=r.get("thread_id"),
            idempotency_key=r.get("idempotency_key"),
            submitted_ms=int(r.get("submitted_ms") or 0),
            lineage=Lineage.from_headers(r["lineage"]) if r.get("lineage") else None,
            correlation_id=r.get("correlation_id"),
            reply_headers=tuple((str(k), str(v)) for k, v in r.get("reply_headers") or ()),
            record_key=r.get("record_key"),
            tenant=r.get("tenant"),
        )
        wake = data.get("wake_at_ms")
        return cls(
            request,
            tuple(data.get("children") or ()),
            int(wake) if wake else None,
            tuple(str(n) for n in data.get("signals") or ()),
            data.get("question") if isinstance(data.get("question"), dict) else None,
            data.get("batch") if isinstance(data.get("batch"), dict) else None,
        )

    def ready(self, replies: dict[str, Any], now_ms: int) -> bool:
        """Whether the turn can resume: every awaited reply is in, or its time has come."""
        if self.wake_at_ms is not None and now_ms >= self.wake_at_ms:
            return True
        return bool(self.children) and all(c in replies for c in self.children)

    def record(self, topic: str, partition: int, attempt: int) -> OutRecord:
        entry = JournalEntry(
            self.request.turn_id,
            -1,
            PARK,
            data=self.data(),
            attempt=attempt,
            ts_ms=int(time.time() * 1000),
        )
        return _journal(topic, partition, park_key(self.request.turn_id), entry)


class TurnParked(BaseException):
    """Raised in the body when it needs a reply (or a time) that is not there yet: the
    executor journals ``park`` and the worker lets go of the turn. A ``BaseException`` so
    an agent's ``except Exception`` cannot swallow it."""

    def __init__(
        self,
        children: tuple[str, ...] = (),
        wake_at_ms: int | None = None,
        signals: tuple[str, ...] = (),
        question: dict[str, Any] | None = None,
        batch: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(f"parked for {children or signals or wake_at_ms}")
        self.children = children
        self.wake_at_ms = wake_at_ms
        self.signals = signals
        self.question = question
        self.batch = batch
