"""What the UI shows, folded from the events topic: one ``TurnView`` per turn, one
``DeadLetter`` per DLQ record, and a bounded ``UIState`` holding the recent ones.

Events arrive in ``seq`` order per turn (one key, one partition, ``read_committed``), so
folding is a plain left fold; a repeated ``seq`` (at-least-once mode) is dropped.
Steps a later attempt took from the journal publish no new events: the steps recorded by
an earlier attempt are marked ``replayed`` once a later attempt shows up. A new attempt is
either a restart (a worker stopped mid-turn) or a parent resuming when a sub-agent's reply
arrived (it parked meanwhile); the ``attempt`` step says which.
"""

from __future__ import annotations

import json
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pyrula_stream.redaction import REDACTED, is_credential_header
from pyrula_stream.wire.events import Event, EventType

MAX_TEXT = 20_000  # characters of a model call's text or a tool's output kept per step
PREVIEW_BYTES = 512  # bytes of a dead letter's value shown

RUNNING = "running"
COMPLETED = "completed"
FAILED = "failed"
CANCELLED = "cancelled"


def _clip(text: str, limit: int = MAX_TEXT) -> str:
    return text if len(text) <= limit else text[:limit] + f"… [{len(text) - limit} more]"


@dataclass
class TurnView:
    """One turn as the page shows it: a summary plus its timeline of steps."""

    turn_id: str
    agent: str
    status: str = RUNNING
    attempt: int = 1
    started_ms: int | None = None
    ended_ms: int | None = None
    last_ms: int = 0
    thread_id: str | None = None
    tenant: str | None = None  # agents with tenant=: every event names it
    agent_version: str | None = None  # agents with version=: every event names it
    worker: str | None = None
    parent: dict[str, str] | None = None  # a sub-agent's caller, from its lineage only
    params: dict[str, Any] | None = None
    model_calls: int = 0
    tool_calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float = 0.0
    result: Any = None
    error: dict[str, Any] | None = None
    partial: bool = False  # the first events were older than what the UI read
    next_seq: int = 0
    steps: list[dict[str, Any]] = field(default_factory=list)
    version: int = 0

    @property
    def finished(self) -> bool:
        return self.status != RUNNING

    def apply(self, event: Event) -> bool:
        """Fold one event in; False when it was a repeat (already seen ``seq``)."""
        if event.seq < self.next_seq:
            return False
        if self.next_seq == 0 and event.seq > 0:
            self.partial = True
        self.next_seq = event.seq + 1
        tenant = event.data.get("tenant")
        if isinstance(tenant, str):
            self.tenant = tenant
        agent_version = event.data.get("version")
        if isinstance(agent_version, str):
            self.agent_version = agent_version
        if event.attempt > self.attempt:
            self._new_attempt(event)
        handler = _HANDLERS.get(event.type)
        if handler is not None:
            handler(self, event)
        self.last_ms = event.ts_ms
        return True

    def _new_attempt(self, event: Event) -> None:
        """Steps an earlier attempt finished are replayed from the journal; a running
        sub-agent call means the turn was parked for the reply (its call is journaled, so
        it is replayed too); any other running step was cut off and runs again."""
        parked = False
        for step in self.steps:
            if step.get("attempt", 1) >= event.attempt or step["kind"] in ("attempt", "status"):
                continue
            if step["kind"] == "subagent":
                step["replayed"] = True
                parked = parked or step["state"] == "running"
            elif step["state"] == "done":
                step["replayed"] = True
            elif step["state"] == "running":
                step["state"] = "interrupted"
        self.attempt = event.attempt
        self.steps.append(
            {
                "kind": "attempt",
                "attempt": event.attempt,
                "ts_ms": event.ts_ms,
                "cause": "reply" if parked else "restart",
            }
        )

    def _model_step(self, call: int, event: Event) -> dict[str, Any]:
        for found in self.steps[::-1]:
            if found["kind"] == "model" and found["call"] == call and found["state"] == "running":
                return found
        # Events do not say when a model call began; it began after the turn's previous
        # event (run:start, a tool's result), which is the closest known time.
        step: dict[str, Any] = {
            "kind": "model",
            "call": call,
            "attempt": event.attempt,
            "state": "running",
            "text": "",
            "started_ms": self.last_ms or event.ts_ms,
            "ended_ms": None,
        }
        self.steps.append(step)
        return step

    def _tool_step(self, call_key: str, event: Event) -> dict[str, Any]:
        for found in self.steps[::-1]:
            if found["kind"] == "tool" and found["call_key"] == call_key:
                if found["state"] == "running":
                    return found
                break
        step: dict[str, Any] = {
            "kind": "tool",
            "call_key": call_key,
            "attempt": event.attempt,
            "state": "running",
            "started_ms": event.ts_ms,
            "ended_ms": None,
        }
        self.steps.append(step)
        return step

    def summary(self) -> dict[str, Any]:
        """The row of the turns list."""
        return {
            "turn_id": self.turn_id,
            "agent": self.agent,
            "status": self.status,
            "attempt": self.attempt,
            "started_ms": self.started_ms,
            "ended_ms": self.ended_ms,
            "last_ms": self.last_ms,
            "thread_id": self.thread_id,
            "tenant": self.tenant,
            "agent_version": self.agent_version,
            "model_calls": self.model_calls,
            "tool_calls": self.tool_calls,
            "tokens": self.input_tokens + self.output_tokens,
            "cost_usd": self.cost_usd,
            "error_code": (self.error or {}).get("code"),
            "partial": self.partial,
            "version": self.version,
        }

    def detail(self) -> dict[str, Any]:
        """The whole turn, for its timeline page."""
        return {
            **self.summary(),
            "worker": self.worker,
            "parent": self.parent,
            "params": self.params,
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "result": self.result,
            "error": self.error,
            "steps": self.steps,
        }


def _run_start(turn: TurnView, event: Event) -> None:
    turn.started_ms = event.ts_ms
    turn.params = event.data.get("params")
    turn.thread_id = event.data.get("thread_id")
    turn.worker = event.data.get("worker")
    parent = event.data.get("parent")  # the worker's, from lineage headers
    if isinstance(parent, dict) and parent.get("turn_id"):
        turn.parent = {
            "agent": str(parent.get("agent") or ""),
            "turn_id": str(parent["turn_id"]),
        }


def _llm_delta(turn: TurnView, event: Event) -> None:
    step = turn._model_step(int(event.data.get("call", 0)), event)
    step["text"] = _clip(step["text"] + str(event.data.get("text", "")))


def _llm_complete(turn: TurnView, event: Event) -> None:
    data = event.data
    step = turn._model_step(int(data.get("call", 0)), event)
    usage = data.get("usage") or {}
    step.update(
        state="done",
        text=_clip(str(data.get("text") or step["text"])),
        model=data.get("model"),
        tool_calls=data.get("tool_calls") or [],
        stop_reason=data.get("stop_reason"),
        usage=usage,
        ended_ms=event.ts_ms,
        by_batch=bool(data.get("batch")),
    )
    total = data.get("total") or {}
    turn.model_calls = int(total.get("llm_calls", turn.model_calls + 1))
    turn.input_tokens = int(total.get("input_tokens", turn.input_tokens))
    turn.output_tokens = int(total.get("output_tokens", turn.output_tokens))
    turn.cost_usd = float(total.get("cost_usd", turn.cost_usd))


def _tool_start(turn: TurnView, event: Event) -> None:
    step = turn._tool_step(str(event.data.get("call_key", "")), event)
    step.update(tool=event.data.get("tool"), input=event.data.get("input"))


def _tool_result(turn: TurnView, event: Event) -> None:
    data = event.data
    step = turn._tool_step(str(data.get("call_key", "")), event)
    step.update(
        state="done",
        tool=data.get("tool"),
        status=data.get("status"),
        output=_clip(str(data.get("output", ""))),
        attempts=data.get("attempts"),
        error_code=data.get("error_code"),
        cached=bool(data.get("cached")),
        ended_ms=event.ts_ms,
    )
    turn.tool_calls += 1


def _subagent_start(turn: TurnView, event: Event) -> None:
    data = event.data
    turn.steps.append(
        {
            "kind": "subagent",
            "call_key": data.get("call_key"),
            "attempt": event.attempt,
            "state": "running",
            "child_agent": data.get("agent"),
            "child_turn_id": data.get("child_turn_id"),
            "depth": data.get("depth"),
            "input": data.get("input"),
            "started_ms": event.ts_ms,
            "ended_ms": None,
        }
    )


def _subagent_result(turn: TurnView, event: Event) -> None:
    data = event.data
    for step in turn.steps[::-1]:
        if step["kind"] == "subagent" and step["child_turn_id"] == data.get("child_turn_id"):
            break
    else:  # its start was older than what the UI read
        step = {
            "kind": "subagent",
            "attempt": event.attempt,
            "child_agent": data.get("agent"),
            "child_turn_id": data.get("child_turn_id"),
            "started_ms": event.ts_ms,
        }
        turn.steps.append(step)
    step.update(
        state="done",
        status=data.get("status"),
        result=_clip(json.dumps(data.get("result"), default=str)),
        error_code=data.get("error_code"),
        usage=data.get("usage") or {},
        ended_ms=event.ts_ms,
    )


def _status(turn: TurnView, event: Event) -> None:
    turn.steps.append(
        {
            "kind": "status",
            "attempt": event.attempt,
            "state": "done",
            "text": str(event.data.get("text", "")),
            "tool": event.data.get("tool"),
            "waiting": event.data.get("waiting"),
            "ts_ms": event.ts_ms,
        }
    )


def _run_end(turn: TurnView, event: Event) -> None:
    turn.ended_ms = event.ts_ms
    for step in turn.steps:
        if step.get("state") == "running":
            step["state"] = "interrupted"
    usage = event.data.get("usage") or {}
    if usage:
        turn.model_calls = int(usage.get("llm_calls", turn.model_calls))
        turn.input_tokens = int(usage.get("input_tokens", turn.input_tokens))
        turn.output_tokens = int(usage.get("output_tokens", turn.output_tokens))
        turn.cost_usd = float(usage.get("cost_usd", turn.cost_usd))
    if event.type == EventType.RUN_COMPLETE:
        turn.status = COMPLETED
        turn.result = event.data.get("result")
    else:
        turn.error = dict(event.data)
        turn.status = CANCELLED if event.data.get("code") == "cancelled" else FAILED


def _interrupted(turn: TurnView, event: Event) -> None:
    """A question for a person: a step of the timeline (the Waiting view lists them)."""
    data = event.data
    what = data.get("tool_name") or data.get("question")
    turn.steps.append(
        {
            "kind": "status",
            "attempt": event.attempt,
            "state": "done",
            "text": f"waiting for a person: {data.get('reason')} {data.get('key')} ({what})",
            "tool": data.get("tool_name"),
            "ts_ms": event.ts_ms,
        }
    )


_HANDLERS: dict[str, Callable[[TurnView, Event], None]] = {
    EventType.RUN_INTERRUPTED: _interrupted,
    EventType.RUN_START: _run_start,
    EventType.LLM_DELTA: _llm_delta,
    EventType.LLM_COMPLETE: _llm_complete,
    EventType.TOOL_START: _tool_start,
    EventType.TOOL_RESULT: _tool_result,
    EventType.SUBAGENT_START: _subagent_start,
    EventType.SUBAGENT_RESULT: _subagent_result,
    EventType.STATUS: _status,
    EventType.RUN_COMPLETE: _run_end,
    EventType.RUN_ERROR: _run_end,
}


@dataclass(frozen=True)
class DeadLetter:
    """One DLQ record: why it was dead-lettered, where from, and its original headers."""

    agent: str
    partition: int
    offset: int
    ts_ms: int
    key: str | None
    reason: str
    code: str
    source: str
    original_headers: dict[str, str]
    headers: dict[str, str]
    value_preview: str
    value_bytes: int
    version: int

    @classmethod
    def from_record(
        cls,
        agent: str,
        partition: int,
        offset: int,
        ts_ms: int,
        key: bytes | None,
        value: bytes | None,
        headers: dict[str, str],
        version: int,
    ) -> DeadLetter:
        original = {  # a letter written before dead letters were redacted, too
            name: REDACTED if is_credential_header(name) else v
            for k, v in headers.items()
            if k.startswith("pyrula.original.")
            for name in (k.removeprefix("pyrula.original."),)
        }
        other = {
            k: v
            for k, v in headers.items()
            if not k.startswith("pyrula.original.")
            and k not in ("pyrula.dlq.reason", "pyrula.dlq.code", "pyrula.dlq.source")
        }
        raw = value or b""
        return cls(
            agent=agent,
            partition=partition,
            offset=offset,
            ts_ms=ts_ms,
            key=key.decode("utf-8", "replace") if key is not None else None,
            reason=headers.get("pyrula.dlq.reason", ""),
            code=headers.get("pyrula.dlq.code", ""),
            source=headers.get("pyrula.dlq.source", ""),
            original_headers=original,
            headers=other,
            value_preview=_preview(raw[:PREVIEW_BYTES]),
            value_bytes=len(raw),
            version=version,
        )

    def as_json(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__dataclass_fields__}


def _preview(raw: bytes) -> str:
    """Text when the bytes are text, else escaped bytes (``\\x00``)."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return repr(raw)[2:-1]
    return text if text.isprintable() or _is_json(text) else repr(raw)[2:-1]


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


class UIState:
    """The recent turns and dead letters of every followed agent, bounded in memory.

    At most ``max_turns`` turns per agent are kept (the oldest finished ones go first;
    running turns are kept until they finish, up to twice that) and ``max_dead_letters``
    DLQ records per agent. Every change bumps ``version``; each item carries the version
    of its last change, so a live stream sends only what changed since it last sent.
    """

    def __init__(self, *, max_turns: int = 200, max_dead_letters: int = 200) -> None:
        self.max_turns = max_turns
        self.max_dead_letters = max_dead_letters
        self.version = 0
        self.agents: set[str] = set()
        self.turns: dict[str, OrderedDict[str, TurnView]] = {}
        self.dead_letters: dict[str, deque[DeadLetter]] = {}

    def touch(self) -> None:
        """Something the page shows besides turns changed (the feed's error)."""
        self.version += 1

    def add_agent(self, agent: str) -> None:
        self.agents.add(agent)
        self.turns.setdefault(agent, OrderedDict())
        self.dead_letters.setdefault(agent, deque(maxlen=self.max_dead_letters))

    def apply(self, event: Event) -> TurnView | None:
        """Fold an event into its turn; the turn when it changed."""
        self.add_agent(event.agent)
        turns = self.turns[event.agent]
        turn = turns.get(event.turn_id)
        if turn is None:
            turn = turns[event.turn_id] = TurnView(event.turn_id, event.agent)
            self._evict(turns)
        if not turn.apply(event):
            return None
        self.version += 1
        turn.version = self.version
        return turn

    def replace(self, turn: TurnView) -> None:
        """Put a turn loaded on demand (by id) in place of what the live feed had."""
        self.add_agent(turn.agent)
        turns = self.turns[turn.agent]
        turns[turn.turn_id] = turn
        self._evict(turns)
        self.version += 1
        turn.version = self.version

    def add_dead_letter(
        self,
        agent: str,
        partition: int,
        offset: int,
        ts_ms: int,
        key: bytes | None,
        value: bytes | None,
        headers: dict[str, str],
    ) -> DeadLetter:
        self.add_agent(agent)
        self.version += 1
        letter = DeadLetter.from_record(
            agent, partition, offset, ts_ms, key, value, headers, self.version
        )
        self.dead_letters[agent].append(letter)
        return letter

    def _evict(self, turns: OrderedDict[str, TurnView]) -> None:
        excess = len(turns) - self.max_turns
        if excess <= 0:
            return
        finished = [tid for tid, t in turns.items() if t.finished][:excess]
        for tid in finished:
            del turns[tid]
        # Turns that never finish (their worker is gone for good) cannot grow it forever.
        while len(turns) > 2 * self.max_turns:
            turns.popitem(last=False)

    def find(self, agent: str, turn_id: str) -> TurnView | None:
        turns = self.turns.get(agent)
        return None if turns is None else turns.get(turn_id)

    def all_turns(self) -> list[TurnView]:
        return [t for turns in self.turns.values() for t in turns.values()]

    def all_dead_letters(self) -> list[DeadLetter]:
        return [d for letters in self.dead_letters.values() for d in letters]


def turn_from_events(agent: str, turn_id: str, events: list[Event]) -> TurnView | None:
    """A turn folded from all its events (loaded by id); None when it has none."""
    if not events:
        return None
    turn = TurnView(turn_id, agent)
    for event in sorted(events, key=lambda e: e.seq):
        turn.apply(event)
    return turn
