"""``AgentLimits`` and their enforcement: what a turn has spent, and the checks on it.

Budgets (calls, tokens, cost) are checked before each live model call; replayed calls are
never checked, since they cost nothing now. The wall-time budget counts from the turn's
first start, which the turn journals, so a replay on another worker does not reset it;
it is checked before every live model call, tool call and ``ctx.step``.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pyrula_stream.errors import BudgetExceeded, ContextWindowExceeded
from pyrula_stream.llm.pricing import DEFAULT_PRICES, cost_usd, price_of

if TYPE_CHECKING:
    from pyrula_stream.llm.base import ModelResponse, ToolDefinition
    from pyrula_stream.llm.tokens import RunningEstimate

DEFAULT_MAX_LLM_CALLS = 50
DEFAULT_MAX_TOOL_CALLS = 128
"""A model asks for tools in batches of any size: without a cap one answer could start
thousands of calls (``None`` lifts it)."""
DEFAULT_MAX_TOOL_RESULT_BYTES = 100_000


@dataclass(frozen=True)
class AgentLimits:
    """Per-agent resource and context-window limits, passed to ``@kafka_agent(limits=...)``.

    Tokens are input + output + cache-creation tokens as billed; cache reads are excluded
    (price them with ``max_cost_usd``).
    """

    max_tool_calls: int | None = DEFAULT_MAX_TOOL_CALLS
    max_llm_calls: int | None = DEFAULT_MAX_LLM_CALLS
    max_total_tokens: int | None = None
    max_cost_usd: float | None = None
    prices: Mapping[str, Any] = field(default_factory=dict)
    max_agent_depth: int | None = None
    max_parallel_subagents: int | None = None
    max_tool_result_bytes: int | None = DEFAULT_MAX_TOOL_RESULT_BYTES
    max_event_count_per_turn: int | None = 50_000
    max_event_payload_bytes: int | None = None
    max_turn_wall_seconds: float | None = None
    context_window: int | None = None
    reserved_output_tokens: int | None = None
    compaction_fraction: float | None = None
    history_compactor: Any = None
    estimate_tokens: Any = None
    max_parallel_tool_calls: int = 8
    max_payload_bytes: int | None = None
    """The largest value (a request's parameters, a tool result, a model response, a
    result) a turn may write, as JSON; past it the turn fails with ``PayloadTooLarge``
    naming this limit. Values past the offload threshold go to the worker's object store
    (docs/large-payloads.md); ``None``: no limit but the store's."""
    offload_threshold_bytes: int | None = None
    """This agent's offload threshold (``None``: ``WorkerOptions.offload_threshold_bytes``)."""


@dataclass(slots=True)
class Spend:
    """What the turn has spent on model calls (recorded calls included)."""

    llm_calls: int = 0
    tool_calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cache_creation_input_tokens: int = 0
    cache_read_input_tokens: int = 0
    cost_usd: float = 0.0

    @property
    def billed_tokens(self) -> int:
        return self.input_tokens + self.output_tokens + self.cache_creation_input_tokens

    def as_dict(self) -> dict[str, Any]:
        return {
            "llm_calls": self.llm_calls,
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "cache_creation_input_tokens": self.cache_creation_input_tokens,
            "cache_read_input_tokens": self.cache_read_input_tokens,
            "cost_usd": round(self.cost_usd, 6),
        }


_PRICES_FOUND: dict[tuple[str, int], tuple[AgentLimits, Any]] = {}
"""(model, limits by identity) -> (those limits, kept alive, and the price): every model
call of a turn is billed, and the same agent asks for the same few models."""


def price_for(model: str, limits: AgentLimits) -> Any:
    """The agent's own price for ``model``, else the dated default table's, else None."""
    key = (model, id(limits))
    found = _PRICES_FOUND.get(key)
    if found is not None and found[0] is limits:
        return found[1]
    price = price_of(model, limits.prices) or price_of(model, DEFAULT_PRICES)
    if len(_PRICES_FOUND) >= 1024:  # models or limits that keep changing: start over
        _PRICES_FOUND.clear()
    _PRICES_FOUND[key] = (limits, price)
    return price


def bill(
    spend: Spend,
    response: ModelResponse,
    limits: AgentLimits,
    default_model: str,
    factor: float = 1.0,
) -> None:
    """Add one model call's usage (and its cost, when the model is priced) to ``spend``;
    ``factor`` scales the price (``BATCH_PRICE_FACTOR`` for a call that went by batch)."""
    usage = response.usage
    spend.llm_calls += 1
    spend.input_tokens += usage.input_tokens
    spend.output_tokens += usage.output_tokens
    spend.cache_creation_input_tokens += usage.cache_creation_input_tokens
    spend.cache_read_input_tokens += usage.cache_read_input_tokens
    price = price_for(response.model or default_model, limits)
    if price is not None:
        spend.cost_usd += cost_usd(usage, price) * factor


def check_spent(limits: AgentLimits, spend: Spend, before: str = "") -> None:
    """Before anything that spends more (a model call, a sub-agent call): the tokens and
    cost already spent against their caps. ``before`` names it in the message."""
    ahead = f" before {before}" if before else ""
    if limits.max_total_tokens is not None and spend.billed_tokens >= limits.max_total_tokens:
        raise BudgetExceeded(
            f"max_total_tokens={limits.max_total_tokens} reached "
            f"({spend.billed_tokens} used){ahead}",
            detail={"limit": "max_total_tokens"},
        )
    if limits.max_cost_usd is not None and spend.cost_usd >= limits.max_cost_usd:
        raise BudgetExceeded(
            f"max_cost_usd={limits.max_cost_usd} reached (${spend.cost_usd:.4f} spent){ahead}",
            detail={"limit": "max_cost_usd"},
        )


def budget_left(limits: AgentLimits, spend: Spend) -> tuple[int | None, float | None]:
    """The tokens and cost still under their caps (``None`` where there is no cap): what
    a sub-agent call hands its child, so the child's spend counts against the parent's."""
    tokens = limits.max_total_tokens
    cost = limits.max_cost_usd
    return (
        None if tokens is None else max(0, tokens - spend.billed_tokens),
        None if cost is None else max(0.0, cost - spend.cost_usd),
    )


def check_model_budget(
    limits: AgentLimits,
    spend: Spend,
    model: str,
    messages: list[dict[str, Any]],
    system: str | None,
    definitions: list[ToolDefinition],
    tokens: RunningEstimate | None = None,
) -> None:
    """Before each live model call: calls, tokens, cost and the context window.
    ``tokens``: the tool loop's running estimate of its conversation (the default
    estimator, each message counted once); an agent's own ``estimate_tokens`` wins."""
    lim = limits
    if lim.max_llm_calls is not None and spend.llm_calls >= lim.max_llm_calls:
        raise BudgetExceeded(
            f"max_llm_calls={lim.max_llm_calls} reached", detail={"limit": "max_llm_calls"}
        )
    check_spent(lim, spend)
    if lim.max_cost_usd is not None and price_for(model, lim) is None:
        raise BudgetExceeded(
            f"model '{model}' has no price, so max_cost_usd cannot be enforced; "
            "add it to AgentLimits(prices=...)",
            detail={"limit": "max_cost_usd", "reason": "unpriced_model"},
        )
    if lim.context_window is not None:
        from pyrula_stream.llm.tokens import estimate_tokens

        if lim.estimate_tokens is not None:
            estimate = lim.estimate_tokens(messages, system, definitions)
        elif tokens is not None:
            estimate = tokens.of(messages, system, definitions)
        else:
            estimate = estimate_tokens(messages, system, definitions)
        room = lim.context_window - (lim.reserved_output_tokens or 0)
        if estimate > room:
            raise ContextWindowExceeded(
                f"the request is about {estimate} tokens; the context window leaves {room}",
                detail={"estimate": estimate, "context_window": lim.context_window},
            )


def check_tool_budget(limits: AgentLimits, spend: Spend, requested: int) -> None:
    """Before a batch of tool calls runs: ``max_tool_calls`` (unknown tools count too)."""
    cap = limits.max_tool_calls
    if cap is not None and spend.tool_calls + requested > cap:
        raise BudgetExceeded(
            f"max_tool_calls={cap} reached: the model asked for {requested} more after "
            f"{spend.tool_calls}",
            detail={"limit": "max_tool_calls"},
        )


def check_wall_time(limits: AgentLimits, started_ms: int | None) -> None:
    """Before every live model call, tool call and step: wall time since the first start."""
    cap = limits.max_turn_wall_seconds
    if cap is None or started_ms is None:
        return
    elapsed = time.time() - started_ms / 1000
    if elapsed >= cap:
        raise BudgetExceeded(
            f"max_turn_wall_seconds={cap:g} reached: the turn started {elapsed:.1f}s ago "
            "(counted from its first attempt, across replays)",
            detail={"limit": "max_turn_wall_seconds", "elapsed_s": round(elapsed, 3)},
        )
