"""Offline evaluation: evaluators over recorded turns or a golden set, then the report.

Two sources of turns, no cluster needed:

- recorded turns (``pyrula-stream turn export`` files): each is scored as it ended in
  production, with the version it ran on, so a new evaluator can be tried on last
  week's traffic before it runs online;
- a golden set (JSON lines ``{"id": ..., "params": {...}, "expected": ...}``): every case
  runs on each version named, offline (``runtime/offline.py``: today's code, a live
  model), so two versions are compared before either serves a turn.

Evaluators are functions of the turn, the same functions an agent declares for online
scoring: ``fn(turn)`` returns a bool (pass/fail), a number, a label, a dict of
``passed``/``number``/``score``/``label``/``reason``, or ``None`` (no score). The turn
has the attributes the online evaluators read (``turn_id``, ``status``, ``result``,
``error_code``, ``cost_usd``, ``usage``, ``agent_version``...) and, offline, the case's
``params`` and ``expected``. Judges and deferred outcomes run online only. A function
that raises gives an ``error`` score naming the exception, as online.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from pyrula_stream.agent.definition import KafkaAgent
from pyrula_stream.errors import ConfigurationError
from pyrula_stream.evals.evaluators import ERROR_LABEL, Verdict
from pyrula_stream.evals.turns import ScoredTurn
from pyrula_stream.runtime.offline import at_version, run_offline
from pyrula_stream.runtime.versions import started_version
from pyrula_stream.state.history import TurnRecording
from pyrula_stream.wire.events import Event, EventType
from pyrula_stream.wire.scores import Score
from pyrula_stream.wire.serde import TurnRequest

GOLDEN_NAMESPACE = uuid.UUID("6f1d2c1e-51e0-4f4e-9b0a-0c5a5e0a6d51")


@dataclass(frozen=True)
class OfflineTurn(ScoredTurn):
    """A finished turn as an evaluator reads it offline: the online ``ScoredTurn`` (so an
    online evaluator runs offline unchanged; offline its ``tools`` are always known), and
    a golden case's ``params``, ``expected`` answer (``None`` for a recorded turn) and
    ``case`` id."""

    params: dict[str, Any] = field(default_factory=dict)
    expected: Any = None
    case: str | None = None

    def read(self) -> dict[str, Any]:
        """What a score says its evaluator read."""
        return {
            "status": self.status,
            "result": self.result,
            "error_code": self.error_code,
            "expected": self.expected,
        }


@dataclass(frozen=True)
class OfflineEvaluator:
    """A function evaluator: ``name``, ``version`` and ``fn(turn)``."""

    name: str
    fn: Callable[[Any], Any]
    version: str = "1"

    @classmethod
    def of(cls, thing: Any) -> OfflineEvaluator:
        """From a plain function (named after it), or a declared function evaluator (an
        object with ``name``, ``version`` and ``fn``); judges and outcomes are refused."""
        if isinstance(thing, OfflineEvaluator):
            return thing
        kind = getattr(thing, "kind", "function")
        if kind != "function":
            raise ConfigurationError(
                f"evaluator {getattr(thing, 'name', thing)!r} is a {kind}: offline evaluation "
                "runs function evaluators only (judges and outcomes score online)"
            )
        fn = getattr(thing, "fn", None)
        if fn is not None and hasattr(thing, "name"):
            return cls(str(thing.name), fn, str(getattr(thing, "version", "1")))
        if callable(thing):
            return cls(getattr(thing, "__name__", "evaluator"), thing)
        raise ConfigurationError(f"{thing!r} is not an evaluator (a function of the turn)")


def score_turn(evaluator: OfflineEvaluator, turn: OfflineTurn) -> Score | None:
    """``evaluator``'s score of ``turn``; ``None`` when it does not apply."""
    fields: dict[str, Any]
    try:
        value = evaluator.fn(turn)
        if value is None:
            return None
        fields = verdict_fields(value)
    except Exception as exc:  # an evaluator's bug is a score, as online
        fields = {"label": ERROR_LABEL, "reason": f"{type(exc).__name__}: {exc}"[:2000]}
    return Score(
        turn_id=turn.turn_id,
        agent=turn.agent,
        evaluator=evaluator.name,
        evaluator_version=evaluator.version,
        agent_version=turn.agent_version,
        inputs=turn.read(),
        kind="function",
        scored_ms=int(time.time() * 1000),
        **fields,
    )


def verdict_fields(value: Any) -> dict[str, Any]:
    """The score fields an evaluator's return value gives (as online: ``Verdict.of``)."""
    verdict = Verdict.of(value)
    return {
        "number": verdict.number,
        "label": verdict.label,
        "passed": verdict.passed,
        "reason": verdict.reason,
    }


def evaluate(turns: Iterable[OfflineTurn], evaluators: Sequence[OfflineEvaluator]) -> list[Score]:
    """Every evaluator's score of every turn (those that apply)."""
    return [s for turn in turns for ev in evaluators if (s := score_turn(ev, turn)) is not None]


def recorded_turn(recording: TurnRecording) -> OfflineTurn:
    """A recorded turn as it ended, on the version it ran."""
    terminal = recording.terminal
    kind = terminal.get("type")
    started, version = started_version(_journal_of(recording))
    request = recording.request
    steps = sorted(recording.steps, key=lambda s: s.step)
    start = next((s for s in steps if s.kind == "start"), None)
    return OfflineTurn(
        turn_id=recording.turn_id,
        agent=request.agent,
        status="completed" if kind == "run:complete" else "failed",
        result=terminal.get("result"),
        error_code=terminal.get("code"),
        error_message=terminal.get("message"),
        usage=dict(terminal.get("usage") or {}),
        cost_usd=float(terminal.get("cost_usd") or 0.0),
        thread_id=request.thread_id,
        tenant=request.tenant,
        agent_version=(version if started else None) or recording.version or "",
        started_ms=int((start.data.get("started_ms") or 0) if start is not None else 0),
        tools=tuple(s.name for s in steps if s.kind == "tool"),
        params=dict(request.params),
    )


def _journal_of(recording: TurnRecording) -> Any:
    from pyrula_stream.durable.journal import TurnJournal

    return TurnJournal(recording.turn_id, steps={s.step: s for s in recording.steps})


@dataclass(frozen=True)
class GoldenCase:
    id: str
    params: dict[str, Any]
    expected: Any = None


def load_golden(path: str | Path) -> list[GoldenCase]:
    """A golden set: one JSON object a line, ``{"id", "params", "expected"}`` (``id``
    defaults to the line number)."""
    cases: list[GoldenCase] = []
    for n, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            raw = json.loads(line)
        except ValueError as exc:
            raise ConfigurationError(f"{path}:{n}: not JSON: {exc}") from None
        if not isinstance(raw, dict) or not isinstance(raw.get("params", {}), dict):
            raise ConfigurationError(
                f'{path}:{n}: a case is an object {{"id", "params": {{...}}, "expected"}}'
            )
        cases.append(
            GoldenCase(str(raw.get("id", n)), dict(raw.get("params", {})), raw.get("expected"))
        )
    if not cases:
        raise ConfigurationError(f"{path}: the golden set has no cases")
    return cases


async def golden_turns(
    agent: KafkaAgent, cases: Sequence[GoldenCase], versions: Sequence[str | None]
) -> list[OfflineTurn]:
    """Run every case on every version, offline; the finished turns."""
    turns: list[OfflineTurn] = []
    async with httpx.AsyncClient() as http:
        for version in versions:
            runner = at_version(agent, version)
            for case in cases:
                key = f"{agent.name}\x00{version}\x00{case.id}"
                turn_id = uuid.uuid5(GOLDEN_NAMESPACE, key).hex
                request = TurnRequest(turn_id=turn_id, agent=agent.name, params=case.params)
                events = await run_offline(runner, request, http=http)
                turns.append(_golden_turn(runner, case, events, turn_id))
    return turns


def _golden_turn(
    agent: KafkaAgent, case: GoldenCase, events: list[Event], turn_id: str
) -> OfflineTurn:
    end = events[-1] if events else None
    data = end.data if end is not None else {}
    completed = end is not None and end.type == "run:complete"
    return OfflineTurn(
        turn_id=turn_id,
        agent=agent.name,
        status="completed" if completed else "failed",
        result=data.get("result") if completed else None,
        error_code=None if completed else str(data.get("code") or "no_terminal_event"),
        error_message=None if completed else data.get("message"),
        usage=dict(data.get("usage") or {}),
        cost_usd=float(data.get("cost_usd") or 0.0),
        agent_version=agent.version or "",
        started_ms=events[0].ts_ms if events else 0,
        finished_ms=end.ts_ms if end is not None else 0,
        tools=tuple(str(e.data.get("tool", "")) for e in events if e.type == EventType.TOOL_START),
        params=case.params,
        expected=case.expected,
        case=case.id,
    )
