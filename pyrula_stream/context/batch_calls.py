"""A model call on the batch lane, as its turn makes it: queue and park, then take the
outcome the collector journaled.

The call's step is the turn's ordinary ``llm`` step. Not recorded yet, the call looks for
its outcome in the turn's journal (``turn_id/batch:<custom id>``, written by the
collector in the transaction that tombstones its batch): a response becomes the step's
data, marked ``batch`` so it is priced at the batch price now and on every replay; an
error (the batch failed or expired) is counted and, as the lane says, sent live or
journaled as the call's failure. With no outcome yet the turn parks: its park record
holds the queued call (custom id, provider, model, request, deadline), the collector's
queue on takeover, and its wake time is the call's deadline, a durable timer. A turn that
wakes at its deadline without an outcome treats the call as failed.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from pyrula_stream.agent.batch import REQUEST_DEFERRABLE, BatchLane
from pyrula_stream.durable.journal import TurnJournal
from pyrula_stream.durable.steps import ModelSteps, StepData
from pyrula_stream.errors import MalformedRecordError
from pyrula_stream.llm.base import ModelRequest, OutputFormat, ToolDefinition
from pyrula_stream.llm.pricing import BATCH_PRICE_FACTOR
from pyrula_stream.wire.batches import custom_id_for
from pyrula_stream.wire.events import Status
from pyrula_stream.wire.subagents import TurnParked

DEFAULT_BATCH_FACTOR = 0.5
"""The batch price of a provider ``BATCH_PRICE_FACTOR`` does not list (``FakeBatch``, a
client of your own): the half price both providers' batch APIs charge."""

WAITING_FOR_BATCH = "waiting for batch"
"""The status text a turn emits when it parks for its batch (the event stream shows it)."""


def batch_factor(provider: Any) -> float:
    """A batch call's price as a fraction of the same call live, by its provider."""
    return BATCH_PRICE_FACTOR.get(str(provider), DEFAULT_BATCH_FACTOR)


def request_data(request: ModelRequest) -> dict[str, Any]:
    """A model request as JSON data: what the park record keeps of a queued call."""
    out: dict[str, Any] = {
        "messages": request.messages,
        "tools": [asdict(t) for t in request.tools],
        "system": request.system,
    }
    if request.tool_choice is not None:
        out["tool_choice"] = request.tool_choice
    if request.output_format is not None:
        out["output_format"] = asdict(request.output_format)
    return out


def request_from_data(data: dict[str, Any]) -> ModelRequest:
    """The request ``request_data`` kept; ``MalformedRecordError`` when it cannot be read."""
    try:
        fmt = data.get("output_format")
        return ModelRequest(
            list(data["messages"]),
            [ToolDefinition(**t) for t in data.get("tools") or ()],
            data.get("system"),
            tool_choice=data.get("tool_choice"),
            output_format=OutputFormat(**fmt) if isinstance(fmt, dict) else None,
        )
    except (KeyError, TypeError) as exc:
        raise MalformedRecordError(f"queued batch call unreadable: {exc!r}") from None


class BatchCalls:
    """The lane as one turn's model calls see it."""

    __slots__ = ("_backlog", "lane", "turn")

    def __init__(self, turn: ModelSteps, lane: BatchLane, backlog: Callable[[], int]) -> None:
        self.turn = turn
        self.lane = lane
        self._backlog = backlog

    def applies(self) -> bool:
        """Whether this turn's next model call goes on the lane (asked per call: a backlog
        may drain while a turn runs)."""
        journal, metadata = self.turn.journal, self.turn.request.metadata
        if journal.park is not None and isinstance(journal.park.get("batch"), dict):
            return True  # it waited in a batch: its call goes on where it stopped
        if person_waits(journal) and metadata.get(REQUEST_DEFERRABLE) is not True:
            return False  # someone answered it a question: they wait for what follows
        return self.lane.waits(metadata, self._backlog())

    def call(
        self,
        index: int,
        step: int,
        input_hash: str,
        request: ModelRequest,
        checks: Callable[[ModelRequest], None],
    ) -> StepData | None:
        """The ``llm`` step's data from the call's journaled outcome; ``None`` when the call
        is to go live; ``TurnParked`` while it waits for its batch. ``checks`` are a live
        call's (budget, quotas), run before a call is queued."""
        turn, lane = self.turn, self.lane
        custom_id = custom_id_for(turn.turn_id, step, input_hash)
        outcome = turn.journal.batch_results.get(custom_id)
        queued = _queued(turn.journal.park, custom_id)
        now_ms = int(time.time() * 1000)
        why: str | None = None
        if outcome is not None:
            if isinstance(outcome.get("response"), dict):
                batch = {
                    "custom_id": custom_id,
                    "batch_id": outcome.get("batch_id"),
                    "provider": lane.client.provider,
                }
                return {"call": index, "response": outcome["response"], "batch": batch}
            why = str(outcome.get("error") or "the batch returned no result")
        elif queued is not None and now_ms >= int(queued.get("deadline_ms") or 0):
            why = "its deadline passed before its batch delivered"
        if why is not None:
            turn.telemetry.batch_failed()
            if lane.on_failure == "live":
                turn.emit(Status(f"batch call failed ({why}); sent live"))
                return None
            message = f"batch call {custom_id} failed: {why}"
            return {"call": index, "error": {"type": "LLMError", "message": message}}
        if queued is None:
            checks(request)
            client = lane.client
            queued = {
                "custom_id": custom_id,
                "call": index,
                "provider": client.provider,
                "model": client.model,
                "request": request_data(request),
                "deadline_ms": lane.deadline_ms(turn.request.metadata, now_ms),
                "queued_ms": now_ms,
            }
            turn.telemetry.batch_queued()
        turn.emit(Status(WAITING_FOR_BATCH, waiting="batch", custom_id=custom_id))
        raise TurnParked(wake_at_ms=int(queued["deadline_ms"]), batch=queued)


def person_waits(journal: TurnJournal) -> bool:
    """Whether a person took part in the turn: it asked a question (an approval, an
    interrupt) or took an answer. Such a turn's calls stay live unless its request
    says ``deferrable``."""
    if journal.park is not None and journal.park.get("question"):
        return True
    return any(signal.get("answer") for signal in journal.signals.values())


def _queued(park: dict[str, Any] | None, custom_id: str) -> dict[str, Any] | None:
    """The queued call in the turn's park record, if it is this call."""
    batch = park.get("batch") if park is not None else None
    if isinstance(batch, dict) and batch.get("custom_id") == custom_id:
        return batch
    return None
