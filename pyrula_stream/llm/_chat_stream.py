"""Streamed Chat Completions chunks folded into one ``ModelResponse``.

The OpenAI SDK and litellm both hand back chunks of the Chat Completions shape (``model``,
``usage``, ``choices[0].delta`` with ``content``, ``refusal`` and ``tool_calls``), so both
adapters fold them here and answer with the same stop reasons, usage and tool calls.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from pyrula_stream.llm._adapter import SDKAdapter
from pyrula_stream.llm._openai_convert import STOP_REASONS
from pyrula_stream.llm.base import ModelRequest, ModelResponse, TextBlock, ToolUseBlock, Usage
from pyrula_stream.llm.tokens import request_tokens, text_tokens

log = logging.getLogger(__name__)


@dataclass
class _Call:
    id: str = ""
    name: str = ""
    parts: list[str] = field(default_factory=list)


@dataclass
class CompletionState:
    """What the chunks of one stream said so far."""

    model: str
    text: list[str] = field(default_factory=list)
    calls: dict[int, _Call] = field(default_factory=dict)
    finish_reason: str | None = None
    usage: Usage | None = None
    size: int = 0

    def apply(self, chunk: Any) -> str | None:
        """Fold one chunk in (an SDK object of the Chat Completions chunk shape); return
        the text it adds, if any."""
        self.model = chunk.model or self.model
        self._apply_usage(getattr(chunk, "usage", None))
        added: list[str] = []
        for choice in chunk.choices:
            if choice.index != 0:
                continue
            delta = choice.delta
            if delta.content:
                added.append(delta.content)
            if getattr(delta, "refusal", None):  # a refusal is what the model said; show it
                added.append(delta.refusal)
            for tc in delta.tool_calls or []:
                call = self.calls.setdefault(tc.index, _Call())
                call.id = call.id or tc.id or ""
                if tc.function is not None:
                    call.name = call.name or tc.function.name or ""
                    if tc.function.arguments:
                        call.parts.append(tc.function.arguments)
                        self.size += len(tc.function.arguments.encode())
            if choice.finish_reason:
                self.finish_reason = choice.finish_reason
        if not added:
            return None
        piece = "".join(added)
        self.text.append(piece)
        self.size += len(piece.encode())
        return piece

    def apply_completion(self, completion: Any) -> None:
        """Fold in a whole (not streamed) ``chat.completion`` object, as a batch returns
        it: the same fields a stream's chunks carry, in one message."""
        self.model = completion.model or self.model
        self._apply_usage(getattr(completion, "usage", None))
        for choice in completion.choices:
            if choice.index != 0:
                continue
            message = choice.message
            piece = "".join(p for p in (message.content, getattr(message, "refusal", None)) if p)
            if piece:
                self.text.append(piece)
                self.size += len(piece.encode())
            for index, tc in enumerate(message.tool_calls or []):
                function = getattr(tc, "function", None)
                if function is None:  # a custom (non-function) tool call: not ours
                    continue
                self.calls[index] = _Call(tc.id or "", function.name or "", [function.arguments])
                self.size += len((function.arguments or "").encode())
            self.finish_reason = choice.finish_reason or self.finish_reason

    def _apply_usage(self, usage: Any) -> None:
        if usage is None:
            return
        details = getattr(usage, "prompt_tokens_details", None)
        cached = (getattr(details, "cached_tokens", 0) or 0) if details is not None else 0
        # prompt_tokens includes cached tokens; ours excludes them (Anthropic's convention).
        self.usage = Usage(
            input_tokens=max((usage.prompt_tokens or 0) - cached, 0),
            output_tokens=usage.completion_tokens or 0,
            cache_read_input_tokens=cached,
        )


def completion_response(
    adapter: SDKAdapter, state: CompletionState, request: ModelRequest
) -> ModelResponse:
    """The one response of a finished stream; usage estimated when the server sent none."""
    finish = state.finish_reason or "stop"
    cut_short = finish == "length"
    content: list[TextBlock | ToolUseBlock] = []
    if state.text:
        content.append(TextBlock(text="".join(state.text)))
    for index, call in sorted(state.calls.items()):
        args = adapter._parse_tool_input(call.name, "".join(call.parts), cut_short=cut_short)
        if args is not None:
            content.append(ToolUseBlock(id=call.id or f"call_{index}", name=call.name, input=args))
    stop_reason = STOP_REASONS.get(finish, finish)
    if stop_reason == "end_turn" and any(isinstance(b, ToolUseBlock) for b in content):
        stop_reason = "tool_use"  # some compatible servers say "stop" after tool calls
    usage = state.usage
    if usage is None:
        # A server that ignores stream_options: estimate so budgets still count the call.
        log.warning("%s sent no usage; estimating tokens", adapter.provider)
        usage = Usage(
            input_tokens=request_tokens(request),
            output_tokens=text_tokens(
                "".join(state.text) + "".join("".join(c.parts) for c in state.calls.values())
            ),
        )
    return ModelResponse(content=content, stop_reason=stop_reason, usage=usage, model=state.model)
