"""One durable tool call: the single path for the model's tool loop and direct calls.

Every call, whoever makes it, goes through ``ToolCalls.run``: the Kafka approval limit
(or, with ``human_in_the_loop``, the reviewer's answer before ``tool:start``: ``approvals``),
the journal lookup (a recorded call returns its recorded result and runs nothing),
argument validation (once), the wall-time budget, the barrier (the model response asking
for the call is durable before any effect; a ``read_only`` tool has none, so it need not
wait: its result cannot commit before that response, and a lost response only reruns
it), ``tool:start``, the tool with its retry,
timeout and cache, the journal entry, and ``tool:result``. Both callers therefore publish
the same events and keep the same journal shape; they differ only in how a failure comes
back (the model reads it; agent code gets an exception).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import httpx

from pyrula_stream.agent.limits import AgentLimits, check_wall_time
from pyrula_stream.context.approvals import (
    QuestionPending,
    approval_decision,
    approval_fields,
    ask,
    denied_data,
)
from pyrula_stream.durable.steps import StepData, TurnSteps
from pyrula_stream.errors import (
    ErrorCode,
    Poison,
    ToolCallFailed,
    ToolCallRejected,
    ToolRegistrationError,
    WriteToolBlocked,
)
from pyrula_stream.observability.metrics import UNKNOWN_TOOL
from pyrula_stream.tools.contract import (
    InvalidToolArguments,
    ToolCallable,
    ToolContext,
    ToolOutcome,
    check_bindable,
)
from pyrula_stream.wire.events import Status, ToolResult, ToolStart
from pyrula_stream.wire.fingerprint import fingerprint
from pyrula_stream.wire.text import truncate_utf8

if TYPE_CHECKING:
    from pyrula_stream.tools.cache import CacheStore

MAX_UNKNOWN_NAME = 64
APPROVAL_FIELDS = ("approval", "approval_key", "answered_by", "approval_reason")
MAX_LISTED_TOOLS = 20


@dataclass(frozen=True)
class ToolCall:
    """One call as asked: by the model (``tool_use_id`` set) or by agent code."""

    call_key: str
    name: str
    arguments: Mapping[str, Any]
    tool: ToolCallable | None
    offered: tuple[str, ...] = ()
    tool_use_id: str | None = None
    step: int | None = None
    direct: bool = False


class TurnToolRuntime:
    """What a ``ToolContext`` needs from the running turn (cancel flag, status, cache)."""

    __slots__ = ("_turn", "cache_store")  # one per turn in flight

    def __init__(self, turn: TurnSteps, cache_store: CacheStore | None) -> None:
        self._turn = turn
        self.cache_store = cache_store

    @property
    def turn_id(self) -> str:
        return self._turn.turn_id

    def is_cancelled(self) -> bool:
        return self._turn.cancelled

    async def emit_status(self, text: str, *, tool_name: str | None) -> None:
        self._turn.emit(Status(text, tool=tool_name))


class ToolCalls:
    """Runs the durable tool calls of one turn (see the module docstring)."""

    __slots__ = (
        "deps",
        "http",
        "human_in_the_loop",
        "limits",
        "tool_runtime",
        "turn",
    )  # one per turn in flight

    def __init__(
        self,
        turn: TurnSteps,
        limits: AgentLimits,
        *,
        http: httpx.AsyncClient,
        deps: Any = None,
        cache_store: CacheStore | None = None,
        human_in_the_loop: bool = False,
    ) -> None:
        self.turn = turn
        self.human_in_the_loop = human_in_the_loop
        self.limits = limits
        self.http = http
        self.deps = deps
        self.tool_runtime = TurnToolRuntime(turn, cache_store)

    def model_text(self, data: StepData) -> str:
        """What the model reads of a recorded call: its text, cut to the result budget."""
        return truncate_utf8(data["text"], self.limits.max_tool_result_bytes)

    async def run(self, call: ToolCall) -> StepData:
        """Run or replay one call; returns its journaled data.

        Raises ``Poison`` when the tool did (the turn is quarantined), and, for a direct
        call, ``ToolCallFailed`` when the tool failed.
        """
        turn = self.turn
        if call.tool is not None:
            try:  # a gated tool is refused however it is called, and the turn ends
                check_bindable(
                    call.tool, agent_name=turn.agent, human_in_the_loop=self.human_in_the_loop
                )
            except ToolRegistrationError as exc:
                raise turn.refuse(exc) from None
        name = call.name[:MAX_UNKNOWN_NAME]

        async def live() -> StepData:
            return await self._live(call, name, observed.running)

        def events(data: StepData) -> list[ToolResult]:
            return [
                ToolResult(
                    call_key=call.call_key,
                    tool=name,
                    tool_use_id=call.tool_use_id,
                    status=data["status"],
                    output=self.model_text(data),
                    attempts=data.get("attempts", 0),
                    error_code=data.get("error_code"),
                    cached=bool(data.get("cached")),
                    approval={k: data[k] for k in APPROVAL_FIELDS if k in data} or None,
                )
            ]

        label = name if call.tool is not None else UNKNOWN_TOOL
        try:
            with turn.telemetry.tool_call(label, call.call_key, call.tool_use_id) as observed:
                data, replayed = await turn.durable_step(
                    "tool",
                    name,
                    fingerprint(dict(call.arguments)),
                    live,
                    events,
                    step=call.step,
                    hold=_redone_alike(call),
                )
                observed.recorded(data, replayed)
        except QuestionPending as pending:
            if call.direct:  # agent code waits here; a model's batch asks after the batch
                raise ask(turn, pending.question) from None
            raise
        if data.get("poison"):
            raise Poison(f"tool '{name}' raised Poison: {data.get('message', data['text'])}")
        if call.direct and data.get("approval") in ("rejected", "expired"):
            raise ToolCallRejected(
                name,
                reason=data.get("approval_reason"),
                expired=data["approval"] == "expired",
            )
        if call.direct and data["status"] != "ok":
            raise ToolCallFailed(
                name,
                data.get("message") or data["text"],
                code=data.get("error_code") or ErrorCode.TOOL_ERROR,
                error_type=data.get("error_type") or "ToolError",
            )
        return data

    async def _live(self, call: ToolCall, name: str, running: Callable[[], None]) -> StepData:
        turn, tool = self.turn, call.tool
        if tool is None:
            listed = ", ".join(sorted(call.offered)[:MAX_LISTED_TOOLS])
            return {
                "call_key": call.call_key,
                "status": "error",
                "unknown": True,
                "text": f"unknown tool '{name}'; available: {listed}",
                "error_code": ErrorCode.TOOL_ERROR,
                "error_type": "UnknownTool",
                "attempts": 0,
            }
        try:
            args = tool.validate_arguments(call.arguments)
        except InvalidToolArguments as exc:
            return {
                "call_key": call.call_key,
                "status": "error",
                "invalid": True,
                "text": str(exc),
                "message": str(exc),
                "error_code": str(exc.code),
                "error_type": type(exc).__name__,
                "attempts": 0,
            }
        if turn.branch is not None:  # a branch never repeats an effect (see branch.py)
            try:
                recorded = turn.branch.tool_result(
                    call.step,
                    name,
                    fingerprint(dict(call.arguments)),
                    read_only=tool.spec.read_only,
                    writes=tool.spec.writes,
                )
            except WriteToolBlocked as exc:
                raise turn.refuse(exc) from None
            if recorded is not None:
                return recorded
        approval: StepData | None = None
        if self.human_in_the_loop and tool.asks_approval(call.arguments):
            question, answer, expired = approval_decision(
                turn.journal,
                tool,
                call.call_key,
                fingerprint(dict(call.arguments)),
                tool_use_id=call.tool_use_id,
                tool_input=dict(call.arguments),
            )
            if answer is None and not expired:
                raise QuestionPending(question)
            approval = approval_fields(question, answer)
            if approval["approval"] != "approved":  # no tool:start: the model reads why
                return denied_data(call.call_key, name, approval)
        check_wall_time(self.limits, turn.started_ms)
        if not (tool.spec.read_only and tool.runs_before_commit):
            await turn.barrier()  # the response asking for an effect is durable first
        turn.raise_if_cancelled()
        turn.emit(
            ToolStart(
                call.call_key, tool.name, call.arguments, call.tool_use_id, tool.event_fields()
            )
        )
        running()
        outcome = await tool.run_validated(
            self.context(tool, call.tool_use_id, call.call_key), args
        )
        data = outcome_data(call.call_key, outcome)
        if approval is not None:
            data.update(approval)
        if call.direct and not outcome.is_error:
            data["value"] = outcome.value
        return data

    def context(self, tool: ToolCallable, tool_use_id: str | None, call_key: str) -> ToolContext:
        return ToolContext(
            http=self.http,
            deps=self.deps,
            tool_name=tool.name,
            tool_use_id=tool_use_id,
            call_key=call_key,
            runtime=self.tool_runtime,
        )


def outcome_data(call_key: str, outcome: ToolOutcome) -> StepData:
    """What the journal keeps of a tool call: the full text, never truncated."""
    data: StepData = {
        "call_key": call_key,
        "status": "error" if outcome.is_error else "ok",
        "text": outcome.text,
        "attempts": outcome.attempts,
    }
    if outcome.is_error:
        data["error_code"] = str(outcome.error_code) if outcome.error_code else "tool_error"
        data["error_type"] = outcome.error_type
        if outcome.message is not None:
            data["message"] = outcome.message
    if outcome.cached:
        data["cached"] = True
    if outcome.poison:
        data["poison"] = True
    return data


def _redone_alike(call: ToolCall) -> bool:
    """A read-only tool that runs before the response asking for it is durable: its
    result may wait in the turn (``TurnRuntime.record_step``'s ``hold``)."""
    return call.tool is not None and call.tool.spec.read_only and call.tool.runs_before_commit
