"""Questions for a person: tool approvals and ``ctx.interrupt`` (``human_in_the_loop=True``).

A question has a key: ``tool_approval:<tool>#<position>`` (``#id=<id>`` for a direct
call made with ``id=``) or ``interrupt#<n>``. Asking publishes ``run:interrupted`` and
parks the turn with the question in its park record (when it was asked and until when
it may wait: an ``approval_timeout`` or interrupt timeout is the park's durable timer).
The answer is a signal named by the key (``signals.py``), journaled exactly once with
its read position; a second answer to the key is refused to its sender.

A gated tool call takes its answer inside its own tool step, before ``tool:start``: only
``approve`` runs the tool; a rejection, an expired deadline or any other answer is
journaled as a denied result (``approval``: ``rejected`` or ``expired``) that the model
reads, and a direct call raises ``ToolCallRejected``. If the arguments at that key differ
from those the question was asked with, the turn fails with ``replay_input_changed``.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from pyrula_stream.durable.journal import TurnJournal
from pyrula_stream.durable.steps import StepData, TurnSteps
from pyrula_stream.errors import ErrorCode, ReplayInputChanged
from pyrula_stream.tools.contract import ToolCallable
from pyrula_stream.wire.events import RunInterrupted
from pyrula_stream.wire.journal_keys import TAKE_SIGNAL_KIND
from pyrula_stream.wire.signals import Signal
from pyrula_stream.wire.subagents import TurnParked

TOOL_APPROVAL = "tool_approval"
INTERRUPT = "interrupt"
APPROVE = "approve"
REJECT = "reject"


def approval_key(tool_name: str, call_key: str) -> str:
    """``tool_approval:<tool>#<position>``: a direct call's per-name counter or ``id=``
    (``direct:refund#0`` -> ``#0``), a model call's place (``2.0``: call 2, first in
    its batch)."""
    position = call_key.rpartition("#")[2] if call_key.startswith("direct:") else call_key
    if call_key.startswith("direct:") and "#id=" in call_key:
        position = "id=" + call_key.partition("#id=")[2]
    return f"{TOOL_APPROVAL}:{tool_name}#{position}"


@dataclass(frozen=True, slots=True)
class Question:
    """What a parked turn asks, as its park record and ``pending`` show it."""

    key: str
    reason: str
    asked_ms: int
    deadline_ms: int | None = None
    question: Any = None
    tool_name: str | None = None
    tool_use_id: str | None = None
    tool_input: dict[str, Any] | None = None
    input_hash: str | None = None

    def data(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_data(cls, data: Mapping[str, Any]) -> Question:
        names = cls.__dataclass_fields__
        return cls(**{k: v for k, v in data.items() if k in names})


def asked_before(journal: TurnJournal, key: str) -> Question | None:
    """The question the turn parked on last, if it is this one (its ask time holds)."""
    data = (journal.park or {}).get("question")
    if isinstance(data, dict) and data.get("key") == key:
        return Question.from_data(data)
    return None


def new_question(journal: TurnJournal, key: str, reason: str, **fields: Any) -> Question:
    """The question, asked now, or when it was first asked if the turn parked on it
    (so a timeout counts from the first ask, on any worker)."""
    before = asked_before(journal, key)
    if before is not None:
        return before
    timeout_s = fields.pop("timeout_s", None)
    now = int(time.time() * 1000)
    deadline = None if timeout_s is None else now + int(timeout_s * 1000)
    return Question(key, reason, now, deadline, **fields)


def question_expired(journal: TurnJournal, key: str, now_ms: int) -> bool:
    """Whether the question ``key`` timed out: its deadline has passed (the timer may not
    have fired yet) or a step journaled the expiry. An answer after that changes nothing."""
    asked = (journal.park or {}).get("question")
    if isinstance(asked, dict) and asked.get("key") == key:
        deadline = asked.get("deadline_ms")
        if isinstance(deadline, int) and now_ms >= deadline:
            return True
    journal.materialize()
    for entry in journal.steps.values():
        data = entry.data if isinstance(entry.data, dict) else {}
        if data.get("approval_key") == key and data.get("approval") == "expired":
            return True
        if entry.kind == TAKE_SIGNAL_KIND and entry.name == key and data.get("timeout"):
            return True
    return False


def answer_for(journal: TurnJournal, key: str) -> Signal | None:
    """The journaled answer to ``key`` (one at most: a second one is refused)."""
    for data in journal.signals.values():
        if data.get("answer") and data.get("name") == key:
            return Signal.from_data(data)
    return None


def ask(turn: TurnSteps, question: Question) -> TurnParked:
    """Publish ``run:interrupted`` (once per question) and return the park to raise."""
    if asked_before(turn.journal, question.key) is None:
        turn.emit(
            RunInterrupted(
                question.reason,
                question.key,
                question.question,
                question.tool_name,
                question.tool_use_id,
                question.tool_input,
                question.deadline_ms,
            )
        )
    return TurnParked(
        wake_at_ms=question.deadline_ms, signals=(question.key,), question=question.data()
    )


class QuestionPending(Exception):
    """A gated call of a model's batch has no answer yet: the tool loop asks, in call
    order, once the batch's other calls are journaled."""

    def __init__(self, question: Question) -> None:
        super().__init__(question.key)
        self.question = question


def approval_decision(
    journal: TurnJournal, tool: ToolCallable, call_key: str, arguments_hash: str, **fields: Any
) -> tuple[Question, Signal | None, bool]:
    """``(question, answer, expired)`` for a gated call; raises ``replay_input_changed``
    when the question was asked with other arguments."""
    key = approval_key(tool.name, call_key)
    question = new_question(
        journal,
        key,
        TOOL_APPROVAL,
        timeout_s=tool.spec.approval_timeout,
        tool_name=tool.name,
        input_hash=arguments_hash,
        **fields,
    )
    if question.input_hash != arguments_hash:
        raise ReplayInputChanged(
            f"tool approval {key}: the call's arguments changed since the question was asked",
            detail={"key": key, "tool": tool.name},
        )
    answer = answer_for(journal, key)
    expired = (
        answer is None
        and question.deadline_ms is not None
        and time.time() * 1000 >= question.deadline_ms
    )
    return question, answer, expired


def approval_fields(question: Question, answer: Signal | None) -> dict[str, Any]:
    """What ``tool:result`` and the journal keep of the decision (who answered, why)."""
    payload = answer.payload if answer is not None and isinstance(answer.payload, dict) else {}
    if answer is None:
        verdict = "expired"
    else:
        verdict = "approved" if payload.get("answer") == APPROVE else "rejected"
    return {
        "approval": verdict,
        "approval_key": question.key,
        "answered_by": answer.sender if answer is not None else None,
        "approval_reason": payload.get("reason") if answer is not None else None,
    }


def denied_data(call_key: str, name: str, fields: Mapping[str, Any]) -> StepData:
    """The journaled result of a call that was not approved: what the model reads."""
    if fields["approval"] == "expired":
        why = "nobody answered before its approval_timeout"
    else:
        who = fields.get("answered_by") or "a reviewer"
        why = f"rejected by {who}" + (
            f": {fields['approval_reason']}" if fields.get("approval_reason") else ""
        )
    text = f"call to tool '{name}' was not approved ({why})"
    return {
        "call_key": call_key,
        "status": "error",
        "text": text,
        "message": text,
        "error_code": str(ErrorCode.TOOL_ERROR),
        "error_type": "ToolCallRejected",
        "attempts": 0,
        **fields,
    }
