"""The evaluator contract: a name and version, a sampling rate, and a verdict per turn.

Sampling is deterministic: whether a turn is scored depends only on the evaluator's name
and the turn id, so a rerun (or a second evaluator group, or offline evaluation) samples
the same turns. A plain function evaluator returns a verdict (``Verdict``, or a bool, a
number, a label, a dict of those fields); ``None`` means the check does not apply and no
score is written. One that raises gives an error score naming the exception: an
evaluator never fails the turn it scores, nor the stream that runs it.
"""

from __future__ import annotations

import hashlib
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from pyrula_stream.errors import ConfigurationError
from pyrula_stream.evals.turns import ScoredTurn
from pyrula_stream.wire.scores import Score

_NAME = re.compile(r"^[a-zA-Z0-9_.-]{1,100}$")
ERROR_LABEL = "error"
"""The label of an error score: the evaluator raised, or its judge turn failed."""


@dataclass(frozen=True, slots=True)
class Verdict:
    """What an evaluator says of one turn: a number, a label, pass/fail, and why."""

    number: float | None = None
    label: str | None = None
    passed: bool | None = None
    reason: str = ""

    @classmethod
    def of(cls, value: Any) -> Verdict:
        """A verdict from what an evaluator returned (or a judge answered)."""
        if isinstance(value, Verdict):
            return value
        if isinstance(value, bool):
            return cls(passed=value)
        if isinstance(value, int | float):
            return cls(number=float(value))
        if isinstance(value, str):
            return cls(label=value)
        if isinstance(value, Mapping):
            number = value.get("number", value.get("score"))
            passed = value.get("passed")
            label = value.get("label")
            if number is not None and (
                isinstance(number, bool) or not isinstance(number, int | float)
            ):
                raise TypeError(f"verdict 'number' must be a number, got {number!r}")
            if passed is not None and not isinstance(passed, bool):
                raise TypeError(f"verdict 'passed' must be true or false, got {passed!r}")
            return cls(
                None if number is None else float(number),
                None if label is None else str(label),
                passed,
                str(value.get("reason") or ""),
            )
        raise TypeError(
            "an evaluator returns a Verdict, bool, number, label or dict, "
            f"not {type(value).__name__}"
        )


def sampled(turn_id: str, evaluator: str, rate: float) -> bool:
    """Whether ``evaluator`` scores ``turn_id`` at ``rate`` (the same answer every time)."""
    if rate >= 1.0:
        return True
    if rate <= 0.0:
        return False
    digest = hashlib.sha256(f"{evaluator}\x00{turn_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < rate


@dataclass(frozen=True)
class Evaluator:
    """What every evaluator has: ``name`` (unique per agent), ``version`` (a new one is a
    new evaluator: it scores the turns again), ``sample_rate`` (share of turns scored)."""

    name: str
    version: str = "1"
    sample_rate: float = 1.0
    reads_tools: bool = False
    """Read the turn's events for the tools it called (``ScoredTurn.tools``): a read of
    the turn's stretch of its events partition per scored turn, so only when asked."""
    kind: ClassVar[str] = "function"

    def __post_init__(self) -> None:
        if not _NAME.match(self.name):
            raise ConfigurationError(
                f"evaluator name {self.name!r} must match [a-zA-Z0-9_.-]{{1,100}}"
            )
        if not self.version or "\x00" in self.version:
            raise ConfigurationError(f"evaluator {self.name!r}: version must be non-empty text")
        if not 0.0 <= self.sample_rate <= 1.0:
            raise ConfigurationError(
                f"evaluator {self.name!r}: sample_rate must be within [0, 1], "
                f"got {self.sample_rate!r}"
            )

    def samples(self, turn: ScoredTurn) -> bool:
        return sampled(turn.turn_id, self.name, self.sample_rate)

    def score(
        self, turn: ScoredTurn, verdict: Verdict, inputs: Mapping[str, Any], **extra: Any
    ) -> Score:
        """This evaluator's score of ``turn``."""
        return Score(
            turn_id=turn.turn_id,
            agent=turn.agent,
            evaluator=self.name,
            evaluator_version=self.version,
            agent_version=turn.agent_version,
            number=verdict.number,
            label=verdict.label,
            passed=verdict.passed,
            reason=verdict.reason,
            inputs=dict(inputs),
            kind=self.kind,
            scored_ms=int(time.time() * 1000),
            **extra,
        )


@dataclass(frozen=True)
class FunctionEvaluator(Evaluator):
    """A plain function of the turn: ``fn(turn) -> Verdict | bool | float | str | None``."""

    fn: Callable[[ScoredTurn], Any] = field(default=lambda turn: None, repr=False)


def error_score(ev: Evaluator, turn: ScoredTurn, reason: str, inputs: Mapping[str, Any]) -> Score:
    """The score that says the evaluator could not score the turn, and why."""
    return ev.score(turn, Verdict(label=ERROR_LABEL, reason=reason[:2000]), inputs)


def run_function(ev: FunctionEvaluator, turn: ScoredTurn) -> Score | None:
    """``ev``'s score of ``turn`` (``None``: the check does not apply); an exception or a
    verdict of the wrong type becomes an error score, never a raise."""
    inputs = turn.read()
    try:
        value = ev.fn(turn)
        if value is None:
            return None
        verdict = Verdict.of(value)
    except Exception as exc:  # an evaluator's bug is a score, not a crash
        return error_score(ev, turn, f"{type(exc).__name__}: {exc}", inputs)
    return ev.score(turn, verdict, inputs)


def evaluator(
    name: str | None = None,
    *,
    version: str = "1",
    sample_rate: float = 1.0,
    reads_tools: bool = False,
) -> Callable[[Callable[[ScoredTurn], Any]], FunctionEvaluator]:
    """Declare a function evaluator: ``@evaluator(sample_rate=0.1) def short(turn): ...``;
    ``reads_tools=True`` fills ``turn.tools`` with the tools the turn called."""

    def bind(fn: Callable[[ScoredTurn], Any]) -> FunctionEvaluator:
        return FunctionEvaluator(name or fn.__name__, version, sample_rate, reads_tools, fn=fn)

    return bind
