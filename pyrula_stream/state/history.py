"""Recorded turns: the history record of a finished turn and the exported turn file.

A finished turn's journal steps are tombstoned (restores stay fast). With
``keep_history=True`` the terminal transaction also writes one record to
``<agent>.history`` (keyed by turn id, time retention): the request, every journaled step
and how the turn ended. ``pyrula-stream turn export`` turns that record and the turn's
events into a ``TurnRecording`` file, which offline replay, golden tests and branches read.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pyrula_stream.errors import (
    ConfigurationError,
    MalformedRecordError,
    PayloadTooLarge,
    TurnNotRecorded,
)
from pyrula_stream.objects.resolver import PayloadStores
from pyrula_stream.objects.urls import default_payloads
from pyrula_stream.state.threads import ThreadHandle, ThreadTurn
from pyrula_stream.wire import serde
from pyrula_stream.wire.payload_refs import Offload, StoredValue
from pyrula_stream.wire.records import OutRecord, wire_record
from pyrula_stream.wire.serde import JournalEntry, TurnRequest

log = logging.getLogger(__name__)

FILE_FORMAT = "pyrula.turn.v1"


@dataclass(frozen=True, slots=True)
class TurnHistory:
    """The wire record of ``<agent>.history`` (``schemas/turn_history.avsc``)."""

    turn_id: str
    agent: str
    version: str
    ts_ms: int
    data: dict[str, Any]


@dataclass
class TurnRecording:
    """One recorded turn: what ``turn export`` writes and replay and branches read."""

    request: TurnRequest
    steps: list[JournalEntry]
    terminal: dict[str, Any] = field(default_factory=dict)
    version: str | None = None
    events: list[dict[str, Any]] = field(default_factory=list)
    thread: list[dict[str, Any]] | None = None
    """A thread turn's earlier turns as its model saw them (from the newest compaction)."""

    @property
    def turn_id(self) -> str:
        return self.request.turn_id

    def thread_handle(self) -> ThreadHandle | None:
        """``ctx.thread`` as the recorded turn had it (``None`` outside a thread)."""
        if self.request.thread_id is None or self.thread is None:
            return None
        turns = tuple(ThreadTurn.from_json(t) for t in self.thread)
        return ThreadHandle(self.request.thread_id, turns, turns[-1].n + 1 if turns else 1)

    def to_json(self) -> dict[str, Any]:
        return {
            "format": FILE_FORMAT,
            "turn_id": self.turn_id,
            "agent": self.request.agent,
            "version": self.version,
            "request": asdict(self.request),
            "steps": [_step_json(s) for s in self.steps],
            "terminal": self.terminal,
            "events": self.events,
            **({"thread": self.thread} if self.thread is not None else {}),
        }

    @classmethod
    def from_json(cls, raw: Mapping[str, Any], *, source: str = "turn file") -> TurnRecording:
        if raw.get("format") != FILE_FORMAT:
            raise ConfigurationError(
                f"{source} is not a recorded turn (format {raw.get('format')!r}, expected "
                f"{FILE_FORMAT!r}); write one with `pyrula-stream turn export TURN_ID`"
            )
        try:
            request = TurnRequest(**raw["request"])
            steps = [JournalEntry(turn_id=request.turn_id, **s) for s in raw["steps"]]
        except (KeyError, TypeError) as exc:
            raise ConfigurationError(f"{source} has a bad request or step: {exc}") from None
        return cls(
            request=request,
            steps=steps,
            terminal=dict(raw.get("terminal") or {}),
            version=raw.get("version"),
            events=list(raw.get("events") or []),
            thread=raw.get("thread"),
        )

    @classmethod
    def load(cls, path: str | Path) -> TurnRecording:
        try:
            raw = json.loads(Path(path).read_text())
        except (OSError, ValueError) as exc:
            raise ConfigurationError(f"cannot read recorded turn {path}: {exc}") from None
        return cls.from_json(raw, source=str(path))

    def dump(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_json(), indent=2, ensure_ascii=False) + "\n")


def _step_json(entry: JournalEntry) -> dict[str, Any]:
    return {
        "step": entry.step,
        "kind": entry.kind,
        "name": entry.name,
        "input_hash": entry.input_hash,
        "data": entry.data,
        "attempt": entry.attempt,
        "ts_ms": entry.ts_ms,
    }


def history_record(
    topic: str,
    request: TurnRequest,
    steps: Iterable[JournalEntry],
    terminal: dict[str, Any],
    *,
    version: str | None,
    ts_ms: int,
    max_bytes: int,
    thread: ThreadHandle | None = None,
    offload: Offload | None = None,
) -> OutRecord:
    """The turn's history record. Steps that do not fit in one record are left out (and
    the record says so) rather than failing a turn that has already finished. A thread
    turn keeps the earlier turns its model saw, so a replay or branch sees them too.
    With ``offload`` (an object store), values past its threshold are kept by reference."""
    data: dict[str, Any] = {
        "request": asdict(request),
        "steps": [_step_json(s) for s in sorted(steps, key=lambda s: s.step)],
        "terminal": terminal,
    }
    if thread is not None:
        data["thread"] = [t.to_json() for t in seen_turns(thread)]

    def record() -> OutRecord:
        kept: Any = data
        stored: list[StoredValue] = []
        if offload is not None:
            kept, stored = offload.apply(data, f"the history of turn {request.turn_id}")
        value = TurnHistory(request.turn_id, request.agent, version or "", ts_ms, kept)
        out = wire_record(
            topic,
            request.turn_id.encode(),
            serde.encode("turn_history", value),
            "turn_history",
            max_bytes=max_bytes,
        )
        out.objects = tuple(stored)
        return out

    try:
        return record()
    except PayloadTooLarge as exc:
        log.error("history of turn %s kept without its steps: %s", request.turn_id, exc)
        data["steps"] = []
        data.pop("thread", None)
        data["steps_omitted"] = exc.message
        return record()


def seen_turns(thread: ThreadHandle) -> tuple[ThreadTurn, ...]:
    """The turns ``ThreadHandle.messages`` reads: from the newest compaction on."""
    start = max((i for i, t in enumerate(thread.turns) if t.base is not None), default=0)
    return thread.turns[start:]


def decode_history(
    payload: bytes, headers: Mapping[str, str], payloads: PayloadStores | None = None
) -> TurnRecording:
    """A ``<agent>.history`` record as a recording (without events); the values it holds
    by reference are read back through ``payloads`` (default: ``PYRULA_OBJECT_STORE``'s
    store; without one, a reference raises ``PayloadUnresolved`` naming its store)."""
    body = serde.decode_record("turn_history", payload, headers)
    data = default_payloads(payloads).resolve(body["data"])
    if data.get("steps_omitted"):
        raise MalformedRecordError(
            f"turn {body['turn_id']} was recorded without its steps: {data['steps_omitted']}"
        )
    return TurnRecording.from_json(
        {
            "format": FILE_FORMAT,
            "version": body.get("version") or None,
            "request": data["request"],
            "steps": data["steps"],
            "terminal": data.get("terminal") or {},
            "thread": data.get("thread"),
        },
        source=f"history record of turn {body['turn_id']}",
    )


def load_recording(
    bootstrap_servers: str,
    history_topic: str,
    turn_id: str,
    *,
    kafka_config: Mapping[str, Any] | None = None,
    group_id: str | None = None,
    payloads: PayloadStores | None = None,
) -> TurnRecording:
    """One finished turn from ``<agent>.history`` (blocking: run it in a thread)."""
    from pyrula_stream.kafka.consumers import read_key

    records = read_key(
        bootstrap_servers,
        history_topic,
        turn_id,
        client_id="pyrula-history",
        kafka_config=kafka_config,
        group_id=group_id,
    )
    if not records:
        raise TurnNotRecorded(
            f"turn {turn_id} is not in {history_topic}: only turns that finished while the "
            "agent ran with keep_history=True are recorded (and only within the topic's "
            "retention)"
        )
    last = records[-1]
    assert last.value is not None  # read_key leaves tombstones out
    return decode_history(last.value, last.headers, payloads)


def export_turn(
    bootstrap_servers: str,
    *,
    history_topic: str,
    events_topic: str,
    turn_id: str,
    kafka_config: Mapping[str, Any] | None = None,
    group_id: str | None = None,
    payloads: PayloadStores | None = None,
) -> TurnRecording:
    """One finished turn from ``<agent>.history``, with its events from ``<agent>.events``
    (``group_id``: the readers' group, ``<prefix>.<agent>.readers`` for the ACLs); values
    stored by reference are read back, so the file holds them whole."""
    from pyrula_stream.kafka.consumers import read_key
    from pyrula_stream.wire.events import decode_event

    payloads = default_payloads(payloads)
    recording = load_recording(
        bootstrap_servers,
        history_topic,
        turn_id,
        kafka_config=kafka_config,
        group_id=group_id,
        payloads=payloads,
    )
    records = read_key(
        bootstrap_servers,
        events_topic,
        turn_id,
        client_id="pyrula-export",
        kafka_config=kafka_config,
        group_id=group_id,
    )
    events = [decode_event(r.value, r.headers) for r in records if r.value is not None]
    recording.events = [
        {
            "type": e.type,
            "seq": e.seq,
            "ts_ms": e.ts_ms,
            "attempt": e.attempt,
            "data": payloads.resolve(e.data),
        }
        for e in sorted(events, key=lambda e: e.seq)
    ]
    return recording
