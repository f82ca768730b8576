"""``AgentLimits``: what one turn may spend, and the run-time checks that enforce it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

DEFAULT_MAX_LLM_CALLS = 50
DEFAULT_MAX_TOOL_RESULT_BYTES = 100_000


@dataclass(frozen=True)
class AgentLimits:
    """Per-agent resource and context-window limits, passed to ``@kafka_agent(limits=...)``.

    Tokens are input + output + cache-creation tokens as billed; cache reads are excluded
    (price them with ``max_cost_usd``). Budgets are checked before each live model call;
    replayed calls are never checked.
    """

    max_tool_calls: int | None = None
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
