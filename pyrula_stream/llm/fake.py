"""``FakeLLM``: a deterministic, scripted model that costs nothing.

The reply to a call depends only on the conversation so far, never on wall-clock or call
order across turns, so concurrent turns and replays see the same answers.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

from pyrula_stream.llm.base import (
    LLMClient,
    ModelResponse,
    StreamItem,
    TextBlock,
    TextDelta,
    ToolDefinition,
    ToolUseBlock,
    Usage,
)

Responder = Callable[[list[dict[str, Any]], list[ToolDefinition]], ModelResponse]


def reply_text(text: str) -> ModelResponse:
    """A scripted final answer."""
    return ModelResponse(content=[TextBlock(text=text)], stop_reason="end_turn")


def reply_tool_calls(*calls: tuple[str, dict[str, Any]], text: str = "") -> ModelResponse:
    """A scripted response asking for one or more tools, in order."""
    blocks: list[TextBlock | ToolUseBlock] = [TextBlock(text=text)] if text else []
    blocks += [
        ToolUseBlock(id=f"call_{i}", name=name, input=args) for i, (name, args) in enumerate(calls)
    ]
    return ModelResponse(content=blocks, stop_reason="tool_use")


def reply_tool_call(name: str, /, **args: Any) -> ModelResponse:
    """A scripted response asking for one tool."""
    return reply_tool_calls((name, args))


def count_model_calls(messages: list[dict[str, Any]]) -> int:
    """How many model replies the conversation already holds."""
    return sum(1 for m in messages if m.get("role") == "assistant")


def last_tool_results(messages: list[dict[str, Any]]) -> list[str]:
    """The tool results in the last user message, as the model would read them."""
    if not messages or not isinstance(messages[-1].get("content"), list):
        return []
    return [
        str(b.get("content", ""))
        for b in messages[-1]["content"]
        if isinstance(b, dict) and b.get("type") == "tool_result"
    ]


class FakeLLM(LLMClient):
    """A scripted model.

    ``script`` is either a sequence of replies, the n-th used for the n-th model call of a
    conversation (the last one repeats), or a function of the conversation and the offered
    tools. ``latency_s`` simulates the provider's time without using CPU; ``chunk_chars``
    splits text into deltas the way a streaming provider would.
    """

    provider = "fake"

    def __init__(
        self,
        script: Sequence[ModelResponse | str] | Responder | None = None,
        *,
        model: str = "fake",
        latency_s: float = 0.0,
        chunk_chars: int = 16,
    ) -> None:
        self.model = model
        self.latency_s = latency_s
        self.chunk_chars = max(1, chunk_chars)
        self._responder = self._make_responder(script)
        self._ids = itertools.count()

    @staticmethod
    def _make_responder(script: Sequence[ModelResponse | str] | Responder | None) -> Responder:
        if script is None:
            return lambda messages, tools: reply_text("ok")
        if callable(script):
            return script
        replies = [reply_text(r) if isinstance(r, str) else r for r in script]
        if not replies:
            raise ValueError("FakeLLM script needs at least one reply")

        def scripted(messages: list[dict[str, Any]], tools: list[ToolDefinition]) -> ModelResponse:
            return replies[min(count_model_calls(messages), len(replies) - 1)]

        return scripted

    async def stream(
        self,
        messages: list[dict[str, Any]],
        tools: list[ToolDefinition] | None = None,
        system: str | None = None,
    ) -> AsyncIterator[StreamItem]:
        if self.latency_s:
            await asyncio.sleep(self.latency_s)
        response = self._responder(messages, list(tools or []))
        for block in response.content:
            if isinstance(block, TextBlock):
                for i in range(0, len(block.text), self.chunk_chars):
                    yield TextDelta(block.text[i : i + self.chunk_chars])
        prompt_chars = len(json.dumps(messages)) + len(system or "")
        usage = Usage(
            input_tokens=max(1, prompt_chars // 4),
            output_tokens=max(1, len(json.dumps([b.model_dump() for b in response.content])) // 4),
        )
        yield response.model_copy(update={"usage": usage, "model": self.model})
