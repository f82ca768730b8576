"""Waits for a signal or an answer: the journal steps that make them durable.

A wait is two steps. The *deadline* step (only with ``timeout``/``deadline``) journals
the wall-clock deadline, so a replay waits only what is left and the timer fires once,
on whichever worker owns the partition then. The *take* step takes the oldest signal of
that name the turn's journal holds and no earlier wait took (``signals.py`` says how a
signal gets there), or the timeout once the deadline has passed; when neither is there
the body raises ``TurnParked`` and the turn is parked until a signal of that name is
journaled or its deadline comes. A replay takes the same signal from the journal.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Any

from pyrula_stream.context.approvals import INTERRUPT, ask, new_question
from pyrula_stream.durable.steps import StepData, TurnSteps
from pyrula_stream.errors import ConfigurationError, WaitTimeout
from pyrula_stream.wire.fingerprint import fingerprint
from pyrula_stream.wire.journal_keys import TAKE_SIGNAL_KIND
from pyrula_stream.wire.signals import MAX_SIGNAL_NAME, Signal, pending
from pyrula_stream.wire.subagents import TurnParked

DEADLINE_KIND = "wait"
"""Journal kind of the step that records a wait's deadline."""


def _seconds(timeout: timedelta | float | None) -> float | None:
    if timeout is None:
        return None
    seconds = timeout.total_seconds() if isinstance(timeout, timedelta) else float(timeout)
    if seconds < 0:
        raise ConfigurationError(f"a wait's timeout must be >= 0 seconds, got {seconds:g}")
    return seconds


def _deadline_ms(deadline: datetime | None) -> int | None:
    if deadline is None:
        return None
    when = deadline if deadline.tzinfo is not None else deadline.replace(tzinfo=UTC)
    return int(when.timestamp() * 1000)


class Waits:
    """The waits of one turn (signals now; answers to questions build on them)."""

    __slots__ = ("_taken", "_turn")  # one per turn in flight

    def __init__(self, turn: TurnSteps) -> None:
        self._turn = turn
        self._taken: dict[str, None] = {}
        """Signals this attempt's waits took (replayed or live): every earlier wait
        replays before a live one, so this is all the turn took. A dict as a set: every
        turn has one, and an empty set is 216 bytes, an empty dict 64."""

    async def signal(
        self,
        name: str,
        *,
        timeout: timedelta | float | None = None,  # noqa: ASYNC109 (a durable timer)
        deadline: datetime | None = None,
        wait_kind: str = "signal",
    ) -> Signal:
        """The next signal named ``name`` (parking until it comes); ``WaitTimeout`` when
        the deadline passes first."""
        if not name or len(name) > MAX_SIGNAL_NAME:
            raise ConfigurationError(f"a signal name is 1 to {MAX_SIGNAL_NAME} characters")
        deadline_ms = await self.deadline(name, _seconds(timeout), _deadline_ms(deadline))
        data = await self.take(name, deadline_ms)
        if data.get("timeout"):
            raise WaitTimeout(
                wait_kind,
                name,
                deadline=datetime.fromtimestamp(int(data["deadline_ms"]) / 1000, tz=UTC),
            )
        return Signal.from_data(data["signal"])

    async def deadline(self, name: str, seconds: float | None, at_ms: int | None) -> int | None:
        """The journaled deadline of a wait (``None``: it waits as long as it takes)."""
        if seconds is None and at_ms is None:
            return None

        async def live() -> StepData:
            candidates = [at_ms] if at_ms is not None else []
            if seconds is not None:
                candidates.append(int((time.time() + seconds) * 1000))
            return {"deadline_ms": min(candidates)}

        data, _ = await self._turn.durable_step(
            DEADLINE_KIND, name, fingerprint([seconds, at_ms]), live
        )
        return int(data["deadline_ms"])

    async def answer(self, key: str, question: Any, timeout_s: float | None) -> Any:
        """``ctx.interrupt``: ask ``question`` under ``key`` and return the answer's
        payload; ``WaitTimeout`` when nobody answered by the deadline."""
        turn = self._turn

        async def live() -> StepData:
            for signal in pending(turn.journal.signals, self._taken):
                if signal.name == key and signal.answer:
                    return {"signal_id": signal.signal_id, "signal": signal.data()}
            asked = new_question(
                turn.journal, key, INTERRUPT, timeout_s=timeout_s, question=question
            )
            if asked.deadline_ms is not None and time.time() * 1000 >= asked.deadline_ms:
                return {"timeout": True, "deadline_ms": asked.deadline_ms}
            raise ask(turn, asked)

        data, _ = await turn.durable_step(
            TAKE_SIGNAL_KIND, key, fingerprint([key, question, timeout_s]), live
        )
        if data.get("timeout"):
            raise WaitTimeout(
                "interrupt",
                key,
                deadline=datetime.fromtimestamp(int(data["deadline_ms"]) / 1000, tz=UTC),
            )
        self._taken[str(data["signal_id"])] = None
        payload = Signal.from_data(data["signal"]).payload
        return payload.get("answer") if isinstance(payload, dict) else payload

    async def take(self, name: str, deadline_ms: int | None) -> StepData:
        """The take step: ``{"signal_id", "signal"}`` or ``{"timeout": True}``."""
        turn = self._turn

        async def live() -> StepData:
            for signal in pending(turn.journal.signals, self._taken):
                if signal.name == name:
                    return {"signal_id": signal.signal_id, "signal": signal.data()}
            if deadline_ms is not None and time.time() * 1000 >= deadline_ms:
                return {"timeout": True, "deadline_ms": deadline_ms}
            raise TurnParked(wake_at_ms=deadline_ms, signals=(name,))

        data, _ = await turn.durable_step(
            TAKE_SIGNAL_KIND, name, fingerprint([name, deadline_ms]), live
        )
        if data.get("signal_id"):
            self._taken[str(data["signal_id"])] = None
        return data
