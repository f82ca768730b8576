"""Signals as records: what a person (or any producer) sends a waiting turn, and the
journal records that make each signal taken exactly once.

A signal is a record on the agent's ``signals`` topic (an answer: on its ``answers``
topic, which only reviewers write), keyed like the turn's request (its thread id or its
turn id) so it lands on the turn's partition, with the header
``pyrula-record-type: signal``. The worker that owns the partition journals it under
``<turn_id>/signal:<signal id>`` with that topic's read position, in one transaction that
also carries the partition's input offset (as a sub-agent's reply is taken): a crash
before that commit reads it again, after it the signal is in the journal.

A signal the turn is not waiting for yet stays in the journal (pending) until a wait for
its name takes it or the turn ends (the terminal transaction tombstones it); that holds
once the worker has read the turn's request (a signal for a turn not read yet waits for
the read, ``runtime/parking.py``). A signal for a turn this partition does not know, or
that has ended, is dead-lettered with code
``signal_refused`` and the reason, where its sender looks for the outcome
(``client_signals``). An *answer* (to an interrupt or a tool approval) is a signal whose
name is the question's key; a second answer to the same key, one after the question's
deadline, or one on any topic but ``answers`` (``wrong_topic``) is refused the same way.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from pyrula_stream.errors import MalformedRecordError
from pyrula_stream.wire import caps, guard, serde
from pyrula_stream.wire.journal_keys import signal_key
from pyrula_stream.wire.records import JSON_CONTENT_TYPE, OutRecord, wire_record
from pyrula_stream.wire.serde import JournalEntry

RECORD_TYPE_HEADER = "pyrula-record-type"
SIGNAL_RECORD_TYPE = "signal"
SIGNAL_ID_HEADER = "pyrula-signal-id"
SIGNAL_KIND = "signal"
"""Journal kind of a taken-in signal's record (``<turn_id>/signal:<id>``)."""
MAX_SIGNAL_NAME = 200


@dataclass(frozen=True, slots=True)
class Signal:
    """A signal as the body receives it: its ``name``, JSON ``payload``, when it was sent
    and by whom. ``answer`` marks the answer to a question (interrupt or approval):
    one per question key. ``position`` is the replies offset it was read at."""

    name: str
    payload: Any = None
    sent_ms: int = 0
    sender: str | None = None
    signal_id: str = ""
    turn_id: str = ""
    answer: bool = False
    position: int = -1

    def data(self) -> dict[str, Any]:
        return {
            "turn_id": self.turn_id,
            "signal_id": self.signal_id,
            "name": self.name,
            "payload": self.payload,
            "sent_ms": self.sent_ms,
            "sender": self.sender,
            "answer": self.answer,
            "position": self.position,
        }

    @classmethod
    def from_data(cls, data: Mapping[str, Any]) -> Signal:
        """A signal from its JSON object; a missing or mistyped field is malformed."""
        body = dict(data)
        what = "signal"
        for name in ("turn_id", "signal_id", "name"):
            value = body.get(name)
            if not isinstance(value, str) or not value:
                raise MalformedRecordError(f"signal: field {name!r} must be non-empty text")
        if len(body["name"]) > MAX_SIGNAL_NAME:
            raise MalformedRecordError(f"signal: name is longer than {MAX_SIGNAL_NAME}")
        answer = body.get("answer", False)
        if not isinstance(answer, bool):
            raise MalformedRecordError("signal: field 'answer' must be true or false")
        return cls(
            name=body["name"],
            payload=body.get("payload"),
            sent_ms=guard.int_field(body, "sent_ms", what),
            sender=guard.text_field(body, "sender", what),
            signal_id=body["signal_id"],
            turn_id=body["turn_id"],
            answer=answer,
            position=guard.int_field(body, "position", what, default=-1),
        )


def new_signal(
    turn_id: str, name: str, payload: Any = None, *, sender: str | None, answer: bool = False
) -> Signal:
    """A signal stamped now with a fresh id (its sender looks for the outcome by it)."""
    if not name or len(name) > MAX_SIGNAL_NAME:
        raise MalformedRecordError(f"a signal name is 1 to {MAX_SIGNAL_NAME} characters")
    json.dumps(payload)  # fails here, not on a worker, if the payload is not JSON
    return Signal(
        name,
        payload,
        int(time.time() * 1000),
        sender,
        uuid.uuid4().hex,
        turn_id,
        answer,
    )


def signal_record(topic: str, key: str, signal: Signal) -> OutRecord:
    """The signal on ``topic`` (``<agent>.signals`` or ``.answers``), keyed like the
    turn's request (its partition)."""
    return OutRecord(
        topic,
        key.encode(),
        json.dumps(signal.data(), separators=(",", ":")).encode(),
        [
            JSON_CONTENT_TYPE,
            (RECORD_TYPE_HEADER, SIGNAL_RECORD_TYPE.encode()),
            (SIGNAL_ID_HEADER, signal.signal_id.encode()),
        ],
    )


def is_signal(headers: Mapping[str, str]) -> bool:
    """Whether a record of the replies, signals or answers topic is a signal (else: a
    sub-agent's reply)."""
    return headers.get(RECORD_TYPE_HEADER) == SIGNAL_RECORD_TYPE


def parse_signal(value: bytes | None, position: int) -> Signal:
    """A signal record's value, read at ``position``; the only error is
    ``MalformedRecordError``."""
    if not value:
        raise MalformedRecordError("signal has an empty value")
    data = guard.loads_object(value, "signal")
    signal = guard.decode("signal", lambda: Signal.from_data(data))
    caps.check_text(signal.turn_id, caps.MAX_TURN_ID_CHARS, "signal: turn_id", "MAX_TURN_ID_CHARS")
    caps.check_text(
        signal.signal_id, caps.MAX_SIGNAL_ID_CHARS, "signal: signal_id", "MAX_SIGNAL_ID_CHARS"
    )
    return Signal(**{**signal.data(), "position": position})


def signal_journal_record(topic: str, partition: int, signal: Signal) -> OutRecord:
    entry = JournalEntry(
        signal.turn_id,
        -1,
        SIGNAL_KIND,
        signal.name,
        data=signal.data(),
        ts_ms=int(time.time() * 1000),
    )
    return wire_record(
        topic,
        signal_key(signal.turn_id, signal.signal_id).encode(),
        serde.encode("journal_entry", entry),
        "journal_entry",
        partition=partition,
    )


REFUSAL_REASONS = (
    "unknown",
    "ended",
    "already_answered",
    "expired",
    "not_asked",
    "duplicate",
    "malformed",
    "too_large",
    "too_many",
    "wrong_topic",
)
"""What ``SignalRefused.reason`` can say (the dead letter's reason starts with it)."""


def signal_refusal(
    signals: Mapping[str, Mapping[str, Any]] | None,
    ended: bool,
    signal: Signal,
    asked: str | None = None,
    expired: bool = False,
) -> str | None:
    """Why ``signal`` must not be taken, as ``"<reason>: <words>"`` (``None``: take it).
    ``signals``: the turn's journaled signals, ``None`` when this partition knows no
    such turn; ``asked``: the key of the question the turn last parked on; ``expired``:
    that question's deadline has passed (its timeout answers it). An answer names that
    question: one to a question not asked (yet) is refused, so nothing is approved
    before a reviewer could see what."""
    turn = signal.turn_id
    if ended:
        return f"ended: turn {turn} has ended"
    if signals is None:
        return f"unknown: turn {turn} is unknown on its partition (never read, or long ended)"
    if signal.signal_id in signals:
        return f"duplicate: signal {signal.signal_id} was already taken"
    if signal.answer and any(
        s.get("answer") and s.get("name") == signal.name for s in signals.values()
    ):
        return f"already_answered: question {signal.name} of turn {turn} was already answered"
    if signal.answer and expired:
        return f"expired: question {signal.name} of turn {turn} expired before this answer"
    if signal.answer and signal.name != asked:
        return f"not_asked: turn {turn} has not asked {signal.name} (its question: {asked})"
    return None


def refusal_reason(dlq_reason: str) -> str:
    """The reason code of a signal's dead letter (``signal refused: <reason>: ...``)."""
    words = dlq_reason.removeprefix("signal refused: ")
    code = words.partition(":")[0]
    return code if code in REFUSAL_REASONS else "malformed"


def pending(signals: Mapping[str, Mapping[str, Any]], taken: Iterable[str]) -> list[Signal]:
    """The journaled signals no wait has taken yet, in the order they were read."""
    done = set(taken)
    found = [Signal.from_data(s) for sid, s in signals.items() if sid not in done]
    return sorted(found, key=lambda s: (s.position, s.signal_id))
