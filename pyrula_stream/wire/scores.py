"""Scores as records: what an evaluator said of one turn, on ``<agent>.scores``.

A score is a JSON record keyed by the scored turn's id, so every score of a turn lands on
one partition and a stream processor (Flink, ksqlDB, a notebook) aggregates them by key.
It names the evaluator and its version, the agent's version that answered (the
experiment's variant), the value (a number, a label or pass/fail), the reason and what
the evaluator read. ``score_id`` is deterministic (turn, evaluator, evaluator version), so
a consumer can tell a second copy of the same score, and the evaluators write each score
exactly once in the transaction that records the scoring.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from pyrula_stream.errors import MalformedRecordError
from pyrula_stream.wire import guard
from pyrula_stream.wire.records import JSON_CONTENT_TYPE, OutRecord

SCORE_RECORD_TYPE = "score"
SCORES_TOPIC_SUFFIX = "scores"
"""The topic is ``<agent>.scores`` (``<prefix><agent>.scores`` under a tenant prefix)."""


@dataclass(frozen=True, slots=True)
class Score:
    """One evaluator's verdict on one turn. Exactly one of ``number``, ``label`` and
    ``passed`` is usually set; a judge may give a number and a pass together."""

    turn_id: str
    agent: str
    evaluator: str
    evaluator_version: str = "1"
    agent_version: str = ""
    number: float | None = None
    label: str | None = None
    passed: bool | None = None
    reason: str = ""
    inputs: dict[str, Any] = field(default_factory=dict)
    """What the evaluator read (the result, the tools called, the outcome event...)."""
    kind: str = "function"
    """``function``, ``judge`` or ``outcome`` (a deferred business outcome)."""
    scored_ms: int = 0
    timed_out: bool = False
    """A deferred outcome whose window closed without the event."""

    @property
    def score_id(self) -> str:
        return score_id(self.turn_id, self.evaluator, self.evaluator_version)

    def data(self) -> dict[str, Any]:
        return {
            "score_id": self.score_id,
            "turn_id": self.turn_id,
            "agent": self.agent,
            "agent_version": self.agent_version,
            "evaluator": self.evaluator,
            "evaluator_version": self.evaluator_version,
            "kind": self.kind,
            "number": self.number,
            "label": self.label,
            "passed": self.passed,
            "reason": self.reason,
            "inputs": self.inputs,
            "scored_ms": self.scored_ms,
            "timed_out": self.timed_out,
        }

    @classmethod
    def from_data(cls, data: dict[str, Any]) -> Score:
        """A score from its JSON object; a missing or mistyped field is malformed."""
        what = "score"
        for name in ("turn_id", "agent", "evaluator"):
            value = data.get(name)
            if not isinstance(value, str) or not value:
                raise MalformedRecordError(f"score: field {name!r} must be non-empty text")
        number = data.get("number")
        if number is not None and (isinstance(number, bool) or not isinstance(number, int | float)):
            raise MalformedRecordError("score: field 'number' must be a number or null")
        passed = data.get("passed")
        if passed is not None and not isinstance(passed, bool):
            raise MalformedRecordError("score: field 'passed' must be true, false or null")
        inputs = data.get("inputs") or {}
        if not isinstance(inputs, dict):
            raise MalformedRecordError("score: field 'inputs' must be an object")
        return cls(
            turn_id=data["turn_id"],
            agent=data["agent"],
            evaluator=data["evaluator"],
            evaluator_version=guard.text_field(data, "evaluator_version", what) or "1",
            agent_version=guard.text_field(data, "agent_version", what) or "",
            number=float(number) if number is not None else None,
            label=guard.text_field(data, "label", what),
            passed=passed,
            reason=guard.text_field(data, "reason", what) or "",
            inputs=inputs,
            kind=guard.text_field(data, "kind", what) or "function",
            scored_ms=guard.int_field(data, "scored_ms", what),
            timed_out=bool(data.get("timed_out", False)),
        )


def score_id(turn_id: str, evaluator: str, evaluator_version: str) -> str:
    """The same for every copy of one evaluator version's score of one turn."""
    text = f"{turn_id}\x00{evaluator}\x00{evaluator_version}"
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def score_record(topic: str, score: Score) -> OutRecord:
    """The score on ``<agent>.scores``, keyed by the scored turn's id."""
    return OutRecord(
        topic,
        score.turn_id.encode(),
        json.dumps(score.data(), separators=(",", ":")).encode(),
        [JSON_CONTENT_TYPE, ("pyrula-record-type", SCORE_RECORD_TYPE.encode())],
    )


def parse_score(value: bytes | None) -> Score:
    """A score record's value; the only error is ``MalformedRecordError``."""
    if value is None:
        raise MalformedRecordError("score: empty record")
    try:
        data = json.loads(value)
    except ValueError as exc:
        raise MalformedRecordError(f"score: not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise MalformedRecordError("score: not a JSON object")
    return Score.from_data(data)
