"""History compaction: a thread's earlier turns replaced by a summary before a model call.

When the history plus the request would pass ``compaction_fraction`` of
``context_window`` (both ``AgentLimits``), the history is compacted first:
``history_compactor(messages)`` (sync or async, returning a summary string or a list of
messages) or, by default, a summary written by the agent's model. Compaction is a durable
step (a replay never compacts again), and its result is stored in the thread with the
turn, so later turns start from it and the summarized turns are tombstoned.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any

from pyrula_stream.agent.limits import AgentLimits
from pyrula_stream.durable.steps import StepData, TurnSteps
from pyrula_stream.errors import ConfigurationError
from pyrula_stream.llm.base import LLMClient, ModelRequest, ToolDefinition
from pyrula_stream.llm.tokens import RunningEstimate, estimate_tokens
from pyrula_stream.wire.fingerprint import fingerprint

SUMMARY_REQUEST = (
    "Summarize the conversation so far for your own later use: every fact, name, number, "
    "decision and open question the user may come back to. Reply with the summary only."
)

Messages = list[dict[str, Any]]


def summary_messages(summary: str) -> Messages:
    """A summary as the start of a conversation (user, then assistant: roles alternate)."""
    return [
        {"role": "user", "content": f"Summary of our conversation so far:\n{summary}"},
        {"role": "assistant", "content": "Understood; I will continue from that summary."},
    ]


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


async def _summarize(limits: AgentLimits, llm: LLMClient, history: Messages) -> Messages:
    compactor = limits.history_compactor
    if compactor is None:
        request = ModelRequest([*history, {"role": "user", "content": SUMMARY_REQUEST}])
        return summary_messages((await llm.complete_request(request)).text)
    out = compactor(list(history))
    if inspect.isawaitable(out):
        out = await out
    if isinstance(out, str):
        return summary_messages(out)
    if isinstance(out, list) and all(isinstance(m, dict) and "role" in m for m in out):
        return list(out)
    raise ConfigurationError(
        f"history_compactor returned {type(out).__name__}; return a summary string or a "
        "list of messages ({'role': ..., 'content': ...})"
    )


async def compacted_history(
    turn: TurnSteps,
    limits: AgentLimits,
    llm: LLMClient,
    history: Messages,
    messages: Messages,
    system: str | None,
    definitions: Sequence[ToolDefinition],
    tokens: RunningEstimate | None = None,
) -> Messages:
    """The history to send: the thread's, or its journaled compaction once it is too long."""
    if turn.thread_base is not None:  # compacted earlier in this turn
        return turn.thread_base
    if not needs_compaction(limits, history, messages, system, definitions, tokens):
        return history

    async def live() -> StepData:
        return {"messages": await _summarize(limits, llm, history)}

    data, _ = await turn.durable_step("compact", "history", fingerprint(history), live)
    turn.thread_base = list(data["messages"])
    return turn.thread_base
