"""History compaction: a thread's earlier turns replaced by a summary before a model call.

When the history plus the request would pass ``compaction_fraction`` of
``context_window`` (both ``AgentLimits``), the history is compacted first:
``history_compactor(messages)`` (sync or async, returning a summary string or a list of
messages) or, by default, a summary written by the agent's model. Compaction is a durable
step (a replay never compacts again), and its result is stored in the thread with the
turn, so later turns start from it and the summarized turns are tombstoned.

Compaction keeps the provider's prompt cache where it can. It goes in steps: the
summaries of earlier compactions at the history's start are kept as they are, and only
the messages after them are summarized (and given to ``history_compactor``), so the
prefix up to the last summary, where a cache breakpoint sat, is sent again unchanged;
only when those summaries alone pass half the threshold are they summarized too. The
default summary call sends the system prompt, the tools and the history exactly as the
tool loop sent them, with the request to summarize at the end, so it reads the
conversation from the cache instead of paying for all of it again; it is billed to the
turn like any model call.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from pyrula_stream.agent.limits import AgentLimits, Spend, bill
from pyrula_stream.durable.steps import ModelSteps, StepData
from pyrula_stream.errors import ConfigurationError
from pyrula_stream.llm.base import LLMClient, ModelRequest, ModelResponse, ToolDefinition, Usage
from pyrula_stream.llm.tokens import RunningEstimate, estimate_tokens
from pyrula_stream.wire.fingerprint import fingerprint
from pyrula_stream.wire.records import OutRecord

SUMMARY_REQUEST = (
    "Summarize the conversation so far for your own later use: every fact, name, number, "
    "decision and open question the user may come back to. Reply with the summary only, "
    "without calling a tool."
)
SUMMARY_SINCE_REQUEST = (
    "Summarize the conversation since the last summary for your own later use: every fact, "
    "name, number, decision and open question the user may come back to. Reply with the "
    "summary only, without calling a tool."
)
SUMMARY_HEAD = "Summary of our conversation so far:\n"
SUMMARY_ACK = "Understood; I will continue from that summary."

Messages = list[dict[str, Any]]


def summary_messages(summary: str) -> Messages:
    """A summary as the start of a conversation (user, then assistant: roles alternate)."""
    return [
        {"role": "user", "content": f"{SUMMARY_HEAD}{summary}"},
        {"role": "assistant", "content": SUMMARY_ACK},
    ]


def summaries_end(history: Messages) -> int:
    """Where the summaries of earlier compactions at the history's start end (0: none)."""
    end = 0
    while (
        end + 1 < len(history)
        and str(history[end].get("content", "")).startswith(SUMMARY_HEAD)
        and history[end + 1].get("content") == SUMMARY_ACK
    ):
        end += 2
    return end


def needs_compaction(
    limits: AgentLimits,
    history: Messages,
    messages: Messages,
    system: str | None,
    definitions: Sequence[ToolDefinition],
    tokens: RunningEstimate | None = None,
) -> bool:
    if not history or limits.compaction_fraction is None or limits.context_window is None:
        return False
    if limits.estimate_tokens is not None:
        estimate = limits.estimate_tokens(history + messages, system, list(definitions))
    else:
        estimate = (tokens.of if tokens is not None else estimate_tokens)(
            history + messages, system, list(definitions)
        )
    return bool(estimate > limits.compaction_fraction * limits.context_window)


@dataclass(frozen=True, slots=True)
class _Prompt:
    """What the tool loop sends beside the history: the summary call sends it too, so the
    provider reads the history from its prompt cache."""

    system: str | None
    definitions: list[ToolDefinition]
    cache_key: str | None


async def _summarize(
    limits: AgentLimits, llm: LLMClient, history: Messages, start: int, prompt: _Prompt
) -> tuple[Messages, ModelResponse | None]:
    """``history[start:]`` summarized: the messages that replace it, and the model's
    response when the agent's model wrote the summary."""
    compactor = limits.history_compactor
    if compactor is None:
        ask = SUMMARY_SINCE_REQUEST if start else SUMMARY_REQUEST
        request = ModelRequest(
            [*history, {"role": "user", "content": ask}],
            prompt.definitions,
            prompt.system,
            cache_key=prompt.cache_key,
        )
        response = await llm.complete_request(request)
        if not response.text.strip():  # it called a tool instead: ask again, without tools
            again = await llm.complete_request(replace(request, tools=[]))
            response = again.model_copy(update={"usage": response.usage + again.usage})
        return summary_messages(response.text), response
    out = compactor(list(history[start:]))
    if inspect.isawaitable(out):
        out = await out
    if isinstance(out, str):
        return summary_messages(out), None
    if isinstance(out, list) and all(isinstance(m, dict) and "role" in m for m in out):
        return list(out), None
    raise ConfigurationError(
        f"history_compactor returned {type(out).__name__}; return a summary string or a "
        "list of messages ({'role': ..., 'content': ...})"
    )


def _kept(
    limits: AgentLimits, history: Messages, system: str | None, definitions: list[ToolDefinition]
) -> int:
    """How many messages at the history's start stay as they are: its summaries, unless
    they alone pass half the compaction threshold."""
    end = summaries_end(history)
    if not end or end == len(history):
        return 0
    assert limits.compaction_fraction is not None and limits.context_window is not None
    estimate = (limits.estimate_tokens or estimate_tokens)(history[:end], system, definitions)
    return end if estimate <= limits.compaction_fraction * limits.context_window / 2 else 0


async def compacted_history(
    turn: ModelSteps,
    limits: AgentLimits,
    llm: LLMClient,
    history: Messages,
    messages: Messages,
    system: str | None,
    definitions: Sequence[ToolDefinition],
    tokens: RunningEstimate | None = None,
    cache_key: str | None = None,
) -> Messages:
    """The history to send: the thread's, or its journaled compaction once it is too long.

    ``cache_key`` is the conversation's prompt cache key, for the summary call."""
    if turn.thread_base is not None:  # compacted earlier in this turn
        return turn.thread_base
    if not needs_compaction(limits, history, messages, system, definitions, tokens):
        return history
    tools = list(definitions)
    kept = _kept(limits, history, system, tools)

    async def live() -> StepData:
        if turn.meter is not None and limits.history_compactor is None:
            turn.meter.before_model_call()  # the tenant's caps, as for any model call
        prompt = _Prompt(system, tools, cache_key)
        summary, response = await _summarize(limits, llm, history, kept, prompt)
        data: StepData = {"messages": history[:kept] + summary}
        if response is not None:  # the summary call's bill, for the turn's spend on replay
            data["usage"] = response.usage.as_dict()
            data["model"] = response.model
        return data

    def tenant_usage(data: StepData) -> list[OutRecord]:
        """The summary call's tokens and cost on the tenant's quotas, with the step."""
        meter = turn.meter
        if meter is None or "usage" not in data:
            return []
        call = Spend()
        bill(call, _billed(data), limits, llm.model)
        return meter.model_used(COMPACTION_CALL, call.billed_tokens, call.cost_usd)

    data, _ = await turn.durable_step(
        "compact", "history", fingerprint(history), live, effects=tenant_usage
    )
    if "usage" in data:
        bill(turn.spend, _billed(data), limits, llm.model)
    turn.thread_base = list(data["messages"])
    return turn.thread_base


COMPACTION_CALL = "-compact"
"""The summary call on the tenant's usage records (``llm-compact``; a turn compacts once)."""


def _billed(data: StepData) -> ModelResponse:
    """The summary call's response as billing needs it (its usage and model)."""
    return ModelResponse(usage=Usage(**data["usage"]), model=data.get("model") or "")
