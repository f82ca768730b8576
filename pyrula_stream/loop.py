"""The tool loop: model call, tool dispatch, unknown tools, limits, result truncation.

Each model call and each tool call is a durable step of the turn (see ``turn.py``), so a
replayed turn rebuilds the same conversation without calling the model or the tools again.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import httpx

from pyrula_stream.errors import (
    BudgetExceeded,
    ContextWindowExceeded,
    LLMError,
    LLMProviderUnavailable,
    LLMRateLimited,
    Poison,
    ProviderStreamTruncated,
)
from pyrula_stream.journal import fingerprint, model_call_fingerprint
from pyrula_stream.limits import AgentLimits
from pyrula_stream.llm.base import (
    LLMClient,
    ModelResponse,
    TextBlock,
    TextDelta,
    ToolDefinition,
    ToolUseBlock,
    Usage,
)
from pyrula_stream.serde import EventType
from pyrula_stream.tools import (
    InvalidToolArguments,
    ToolCallable,
    ToolContext,
    ToolOutcome,
    check_bindable,
    truncate_for_model,
)
from pyrula_stream.turn import StepData, TurnRuntime

if TYPE_CHECKING:
    from pyrula_stream.mcp.discovery import MCPToolbox
    from pyrula_stream.tool_cache import CacheStore

PROVIDER_FAILURES = (ProviderStreamTruncated, LLMProviderUnavailable, LLMRateLimited, LLMError)
"""Provider failures that are journaled as the call's outcome (most specific first)."""

DELTA_FLUSH_SECONDS = 0.05
DELTA_FLUSH_CHARS = 512
MAX_UNKNOWN_NAME = 64
MAX_LISTED_TOOLS = 20


@dataclass(frozen=True, slots=True)
class ToolResultBlock:
    """A tool's result as the model reads it (what ``ctx.llm.stream`` yields for tools)."""

    tool_use_id: str
    name: str
    content: str
    is_error: bool
    type: str = "tool_result"


class TurnToolRuntime:
    """What a ``ToolContext`` needs from the running turn (cancel flag, status, cache)."""

    def __init__(self, turn: TurnRuntime, cache_store: CacheStore | None) -> None:
        self._turn = turn
        self.cache_store = cache_store

    @property
    def turn_id(self) -> str:
        return self._turn.turn_id

    def is_cancelled(self) -> bool:
        return self._turn.cancelled

    async def emit_status(self, text: str, *, tool_name: str | None) -> None:
        data: dict[str, Any] = {"text": text}
        if tool_name:
            data["tool"] = tool_name
        self._turn.emit(EventType.STATUS, data)


class ToolLoop:
    """Runs the model's tool loop for one turn, every call journaled."""

    def __init__(
        self,
        turn: TurnRuntime,
        llm: LLMClient,
        tools: Sequence[ToolCallable],
        limits: AgentLimits,
        *,
        http: httpx.AsyncClient,
        deps: Any = None,
        cache_store: CacheStore | None = None,
        mcp: MCPToolbox | None = None,
    ) -> None:
        self.turn = turn
        self.mcp = mcp
        self.llm = llm
        self.tools = list(tools)
        self.limits = limits
        self.http = http
        self.deps = deps
        self.tool_runtime = TurnToolRuntime(turn, cache_store)
        self._definitions: dict[int, ToolDefinition] = {}

    # -- public: what ctx.llm exposes -----------------------------------------------------

    async def run(
        self,
        messages: list[dict[str, Any]],
        *,
        tools: Sequence[ToolCallable] | None = None,
        system: str | None = None,
    ) -> str:
        """Run the loop until the model answers without tools; return its final text."""
        final = ""
        async for block in self.stream(messages, tools=tools, system=system):
            if isinstance(block, ModelResponse):
                final = block.text
        return final

    async def stream(
        self,
        messages: list[dict[str, Any]],
        *,
        tools: Sequence[ToolCallable] | None = None,
        system: str | None = None,
    ) -> AsyncIterator[TextBlock | ToolUseBlock | ToolResultBlock | ModelResponse]:
        """The same loop as an iterator: content blocks as they complete, and each response."""
        offered = list(self.tools if tools is None else tools)
        if tools is None and self.mcp is not None:  # MCP: discovered tools beside the @tools
            offered += await self.mcp.tools()
        for t in offered:  # tools passed at run time get the bind-time refusals too
            check_bindable(t, agent_name=self.turn.agent)
        conversation = list(messages)
        while True:
            response = await self.model_call(conversation, offered, system)
            for block in response.content:
                yield block
            yield response
            conversation.append(response.as_message())
            calls = response.tool_calls
            if not calls:
                return
            results = await self.dispatch(response, calls, offered)
            for r in results:
                yield r
            conversation.append(
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "tool_result",
                            "tool_use_id": r.tool_use_id,
                            "content": r.content,
                            "is_error": r.is_error,
                        }
                        for r in results
                    ],
                }
            )

    # -- model calls ----------------------------------------------------------------------

    async def model_call(
        self, messages: list[dict[str, Any]], offered: list[ToolCallable], system: str | None
    ) -> ModelResponse:
        turn = self.turn
        index = turn.model_calls
        turn.model_calls += 1
        definitions = [self._definition(t) for t in offered]
        input_hash = model_call_fingerprint(
            messages,
            system,
            [
                {"name": d.name, "description": d.description, "schema": d.input_schema}
                for d in definitions
            ],
        )

        async def live() -> StepData:
            self.check_budget(messages, system, definitions)
            try:
                response = await self._stream_model(index, messages, definitions, system)
            except PROVIDER_FAILURES as exc:
                # Journaled, so a replay raises the same failure instead of calling again.
                return {
                    "call": index,
                    "error": {"type": type(exc).__name__, "message": exc.message},
                }
            return {"call": index, "response": response.model_dump(mode="json")}

        def events(data: StepData) -> list[tuple[str, dict[str, Any]]]:
            if "error" in data:
                return []
            response = ModelResponse.model_validate(data["response"])
            self._bill(response)
            return [
                (
                    EventType.LLM_COMPLETE,
                    {
                        "call": index,
                        "model": response.model,
                        "text": response.text,
                        "tool_calls": [
                            {"id": c.id, "name": c.name, "input": c.input}
                            for c in response.tool_calls
                        ],
                        "stop_reason": response.stop_reason,
                        "usage": response.usage.model_dump(),
                        "total": turn.spend.as_dict(),
                    },
                )
            ]

        data, replayed = await turn.durable_step("llm", "llm", input_hash, live, events)
        if "error" in data:
            failure = {cls.__name__: cls for cls in PROVIDER_FAILURES}[data["error"]["type"]]
            raise failure(data["error"]["message"])
        response = ModelResponse.model_validate(data["response"])
        if replayed:
            self._bill(response)
        return response

    def _definition(self, tool: ToolCallable) -> ToolDefinition:
        """A tool's definition, built once per turn (it copies the schema)."""
        found = self._definitions.get(id(tool))
        if found is None:
            found = self._definitions[id(tool)] = tool.definition()
        return found

    async def _stream_model(
        self,
        index: int,
        messages: list[dict[str, Any]],
        definitions: list[ToolDefinition],
        system: str | None,
    ) -> ModelResponse:
        """Call the provider, coalescing text deltas into ``llm:delta`` events."""
        pending: list[str] = []
        pending_chars = 0
        last_flush = time.monotonic()

        def flush() -> None:
            nonlocal pending_chars, last_flush
            if pending:
                self.turn.emit(EventType.LLM_DELTA, {"call": index, "text": "".join(pending)})
                pending.clear()
            pending_chars = 0
            last_flush = time.monotonic()

        final: ModelResponse | None = None
        async for item in self.llm.stream(messages, definitions or None, system):
            if isinstance(item, TextDelta):
                pending.append(item.text)
                pending_chars += len(item.text)
                if (
                    pending_chars >= DELTA_FLUSH_CHARS
                    or time.monotonic() - last_flush >= DELTA_FLUSH_SECONDS
                ):
                    flush()
            else:
                final = item
        flush()
        if final is None:
            from pyrula_stream.errors import ProviderStreamTruncated

            raise ProviderStreamTruncated(
                f"{self.llm.describe()} stream ended without a complete response"
            )
        return final

    def _bill(self, response: ModelResponse) -> None:
        spend = self.turn.spend
        usage: Usage = response.usage
        spend.llm_calls += 1
        spend.input_tokens += usage.input_tokens
        spend.output_tokens += usage.output_tokens
        spend.cache_creation_input_tokens += usage.cache_creation_input_tokens
        spend.cache_read_input_tokens += usage.cache_read_input_tokens
        price = self._price(response.model or self.llm.model)
        if price is not None:
            from pyrula_stream.llm.pricing import cost_usd

            spend.cost_usd += cost_usd(usage, price)

    def _price(self, model: str) -> Any:
        from pyrula_stream.llm.pricing import DEFAULT_PRICES, price_of

        return price_of(model, self.limits.prices) or price_of(model, DEFAULT_PRICES)

    def check_budget(
        self, messages: list[dict[str, Any]], system: str | None, definitions: list[ToolDefinition]
    ) -> None:
        """Before each live call: the run's budget and the context window."""
        lim, spend = self.limits, self.turn.spend
        if lim.max_llm_calls is not None and spend.llm_calls >= lim.max_llm_calls:
            raise BudgetExceeded(
                f"max_llm_calls={lim.max_llm_calls} reached", detail={"limit": "max_llm_calls"}
            )
        if lim.max_total_tokens is not None and spend.billed_tokens >= lim.max_total_tokens:
            raise BudgetExceeded(
                f"max_total_tokens={lim.max_total_tokens} reached ({spend.billed_tokens} used)",
                detail={"limit": "max_total_tokens"},
            )
        if lim.max_cost_usd is not None:
            if self._price(self.llm.model) is None:
                raise BudgetExceeded(
                    f"model '{self.llm.model}' has no price, so max_cost_usd cannot be enforced; "
                    "add it to AgentLimits(prices=...)",
                    detail={"limit": "max_cost_usd", "reason": "unpriced_model"},
                )
            if spend.cost_usd >= lim.max_cost_usd:
                raise BudgetExceeded(
                    f"max_cost_usd={lim.max_cost_usd} reached (${spend.cost_usd:.4f} spent)",
                    detail={"limit": "max_cost_usd"},
                )
        if lim.max_turn_wall_seconds is not None:
            elapsed = time.monotonic() - self.turn.started_at
            if elapsed >= lim.max_turn_wall_seconds:
                raise BudgetExceeded(
                    f"max_turn_wall_seconds={lim.max_turn_wall_seconds} reached",
                    detail={"limit": "max_turn_wall_seconds"},
                )
        if lim.context_window is not None:
            from pyrula_stream.llm.tokens import estimate_tokens

            estimate = (lim.estimate_tokens or estimate_tokens)(messages, system, definitions)
            room = lim.context_window - (lim.reserved_output_tokens or 0)
            if estimate > room:
                raise ContextWindowExceeded(
                    f"the request is about {estimate} tokens; the context window leaves {room}",
                    detail={"estimate": estimate, "context_window": lim.context_window},
                )

    # -- tools ----------------------------------------------------------------------------

    async def dispatch(
        self, response: ModelResponse, calls: list[ToolUseBlock], offered: list[ToolCallable]
    ) -> list[ToolResultBlock]:
        """Run one response's tool calls concurrently; results in the order the model asked."""
        turn, lim = self.turn, self.limits
        index = turn.model_calls - 1
        if (
            lim.max_tool_calls is not None
            and turn.spend.tool_calls + len(calls) > lim.max_tool_calls
        ):
            raise BudgetExceeded(
                f"max_tool_calls={lim.max_tool_calls} reached: the model asked for "
                f"{len(calls)} more after {turn.spend.tool_calls}",
                detail={"limit": "max_tool_calls"},
            )
        turn.spend.tool_calls += len(calls)
        first = turn.allocate_steps(len(calls))
        by_name = {t.name: t for t in offered}
        gate = asyncio.Semaphore(max(1, lim.max_parallel_tool_calls))

        async def one(j: int, call: ToolUseBlock) -> ToolResultBlock:
            async with gate:
                return await self.tool_call(first + j, f"{index}.{j}", call, by_name)

        return list(await asyncio.gather(*(one(j, c) for j, c in enumerate(calls))))

    async def tool_call(
        self, step: int, call_key: str, call: ToolUseBlock, by_name: dict[str, ToolCallable]
    ) -> ToolResultBlock:
        turn = self.turn
        tool = by_name.get(call.name)
        name = call.name[:MAX_UNKNOWN_NAME]
        input_hash = fingerprint(call.input)

        async def live() -> StepData:
            if tool is None:
                listed = ", ".join(sorted(by_name)[:MAX_LISTED_TOOLS])
                return {
                    "call_key": call_key,
                    "status": "error",
                    "unknown": True,
                    "text": f"unknown tool '{name}'; available: {listed}",
                    "attempts": 0,
                }
            try:
                args = tool.validate_arguments(call.input)
            except InvalidToolArguments as exc:
                return {
                    "call_key": call_key,
                    "status": "error",
                    "invalid": True,
                    "text": str(exc),
                    "attempts": 0,
                }
            await turn.barrier()  # the response asking for this call is durable first
            turn.emit(
                EventType.TOOL_START,
                {
                    "call_key": call_key,
                    "tool": tool.name,
                    "input": call.input,
                    **tool.event_fields(),  # MCP: the server and its destructiveHint
                },
            )
            outcome = await tool.invoke(self._tool_context(tool, call.id, call_key), args)
            return outcome_data(call_key, outcome)

        def events(data: StepData) -> list[tuple[str, dict[str, Any]]]:
            return [
                (
                    EventType.TOOL_RESULT,
                    {
                        "call_key": call_key,
                        "tool": name,
                        "tool_use_id": call.id,
                        "status": data["status"],
                        "output": truncate_for_model(
                            data["text"], self.limits.max_tool_result_bytes
                        ),
                        "attempts": data.get("attempts", 0),
                        **({"error_code": data["error_code"]} if data.get("error_code") else {}),
                        **({"cached": True} if data.get("cached") else {}),
                    },
                )
            ]

        data, _ = await turn.durable_step("tool", name, input_hash, live, events, step=step)
        if data.get("poison"):
            raise Poison(f"tool '{name}' raised Poison: {data['text']}")
        return ToolResultBlock(
            call.id,
            name,
            truncate_for_model(data["text"], self.limits.max_tool_result_bytes),
            data["status"] != "ok",
        )

    def _tool_context(
        self, tool: ToolCallable, tool_use_id: str | None, call_key: str
    ) -> ToolContext:
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
    if outcome.cached:
        data["cached"] = True
    if outcome.poison:
        data["poison"] = True
    return data
