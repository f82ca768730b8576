"""Deferred outcomes: an evaluator that waits for a business event, joined by a key.

The turn names a key (``key(turn)``: an order id in its result, say); the business topic
carries events with that key (``event_key(event)``, by default the record key). The first
event whose timestamp is within ``window`` of the turn's finish (after it, or before it:
the business may act before the result is written, and clocks differ) is joined and
scored by ``score(turn, event)``; when the window closes without one the turn is scored
``timed_out=True`` with ``on_timeout``. An event read before its turn's result is kept
(for its window and the grace), so it still joins. ``grace`` is how long past a window's end the
stream waits before declaring a timeout, so an event written in time but read late
(the evaluators were restarting) still joins. The waits and early events are kept in
``<agent>.outcomes`` (compacted), so they survive restarts; no worker slot is held.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, ClassVar

from pyrula_stream.errors import ConfigurationError
from pyrula_stream.evals.evaluators import Evaluator, Verdict
from pyrula_stream.evals.turns import ScoredTurn


@dataclass(frozen=True, slots=True)
class BusinessEvent:
    """One record of the business topic as an outcome evaluator sees it."""

    key: str
    value: Any
    """The value as JSON when it parses, else its text."""
    ts_ms: int
    topic: str = ""
    partition: int = 0
    offset: int = 0

    def data(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "value": self.value,
            "ts_ms": self.ts_ms,
            "topic": self.topic,
            "partition": self.partition,
            "offset": self.offset,
        }


def _result_key(name: str) -> Callable[[ScoredTurn], str | None]:
    def key(turn: ScoredTurn) -> str | None:
        value = turn.result.get(name) if isinstance(turn.result, dict) else None
        return None if value is None else str(value)

    return key


def _record_key(event: BusinessEvent) -> str | None:
    return event.key or None


def _arrived(turn: ScoredTurn, event: BusinessEvent) -> Any:
    return Verdict(passed=True, reason=f"event at {event.ts_ms}")


def _never_arrived(turn: ScoredTurn) -> Any:
    return Verdict(passed=False, reason="no event within the window")


@dataclass(frozen=True)
class OutcomeEvaluator(Evaluator):
    """Scores a turn when its business event arrives (or its window closes)."""

    topic: str = ""
    """The business topic (its full name)."""
    key: Callable[[ScoredTurn], str | None] = field(default=lambda turn: None, repr=False)
    event_key: Callable[[BusinessEvent], str | None] = field(default=_record_key, repr=False)
    window: timedelta = timedelta(days=1)
    grace: timedelta = timedelta(seconds=30)
    score_event: Callable[[ScoredTurn, BusinessEvent], Any] = field(default=_arrived, repr=False)
    on_timeout: Callable[[ScoredTurn], Any] = field(default=_never_arrived, repr=False)
    kind: ClassVar[str] = "outcome"

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.topic:
            raise ConfigurationError(f"outcome evaluator {self.name!r} names no topic")
        if self.window.total_seconds() <= 0 or self.grace.total_seconds() < 0:
            raise ConfigurationError(
                f"outcome evaluator {self.name!r}: window must be positive, grace not negative"
            )

    @property
    def window_ms(self) -> int:
        return int(self.window.total_seconds() * 1000)

    @property
    def grace_ms(self) -> int:
        return int(self.grace.total_seconds() * 1000)


def outcome(
    name: str,
    *,
    topic: str,
    key: str | Callable[[ScoredTurn], str | None],
    window: timedelta,
    event_key: Callable[[BusinessEvent], str | None] | None = None,
    score: Callable[[ScoredTurn, BusinessEvent], Any] | None = None,
    on_timeout: Callable[[ScoredTurn], Any] | None = None,
    grace: timedelta = timedelta(seconds=30),
    version: str = "1",
    sample_rate: float = 1.0,
) -> OutcomeEvaluator:
    """A deferred outcome; ``key`` is a field of the turn's (dict) result or a function."""
    return OutcomeEvaluator(
        name,
        version,
        sample_rate,
        topic=topic,
        key=_result_key(key) if isinstance(key, str) else key,
        event_key=event_key or _record_key,
        window=window,
        grace=grace,
        score_event=score or _arrived,
        on_timeout=on_timeout or _never_arrived,
    )
