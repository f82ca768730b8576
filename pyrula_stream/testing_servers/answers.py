"""What a local provider server answers a model call with, whoever asks: live or batched.

A ``Responder`` takes one call as a ``Prompt`` (the provider's own request body, with
views that read the same on both providers) and returns an ``Answer`` (text, tool calls,
token counts) or a ``CallError``. The servers render that one answer in their provider's
wire format, streamed for a live call and as one JSON object inside a batch's results, so
a turn's tool loop goes the same way live and batched.
"""

from __future__ import annotations

import importlib
import json
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class ToolCall:
    """One tool call the model makes."""

    id: str
    name: str
    arguments: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Answer:
    """One model reply. Token counts left ``None`` are estimated (4 characters a token)
    from the request and the reply, so budgets and prices see plausible numbers."""

    text: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    input_tokens: int | None = None
    output_tokens: int | None = None
    cached_tokens: int = 0
    """How many of the ``input_tokens`` were read from the prompt cache. ``input_tokens``
    is the whole prompt, as OpenAI's ``prompt_tokens`` counts it; the Anthropic server
    reports the cached part apart (``cache_read_input_tokens``), as that API does."""
    stop: str | None = None
    """The provider-neutral stop: ``end_turn``, ``tool_use`` (the default with tool
    calls) or ``max_tokens``."""

    @property
    def stop_reason(self) -> str:
        return self.stop or ("tool_use" if self.tool_calls else "end_turn")

    def output_estimate(self) -> int:
        args = "".join(json.dumps(c.arguments) for c in self.tool_calls)
        return max(1, (len(self.text) + len(args)) // 4)


@dataclass(frozen=True)
class CallError:
    """A call the provider refuses or fails: an HTTP status and the provider's error type
    (``invalid_request_error``, ``api_error``, ``overloaded_error``, ...)."""

    status: int = 500
    type: str = "api_error"
    message: str = "the local server failed this call"


@dataclass(frozen=True)
class Prompt:
    """One call as a responder sees it: ``body`` is the provider's request body
    (Chat Completions or Messages); ``custom_id`` is set for a batched call."""

    provider: str
    body: dict[str, Any]
    custom_id: str | None = None

    @property
    def model(self) -> str:
        return str(self.body.get("model") or "")

    @property
    def messages(self) -> list[dict[str, Any]]:
        return list(self.body.get("messages") or [])

    @property
    def user_text(self) -> str:
        """The text of every user message, joined by newlines."""
        return "\n".join(_text(m.get("content")) for m in self.messages if m.get("role") == "user")

    @property
    def assistant_messages(self) -> int:
        """How many model replies the conversation holds: the step of the tool loop."""
        return sum(1 for m in self.messages if m.get("role") == "assistant")

    @property
    def tool_results(self) -> list[str]:
        """The text of every tool result, in order (``role: tool`` messages or
        ``tool_result`` blocks)."""
        found: list[str] = []
        for m in self.messages:
            if m.get("role") == "tool":
                found.append(_text(m.get("content")))
                continue
            content = m.get("content")
            if isinstance(content, list):
                found += [
                    _text(b.get("content"))
                    for b in content
                    if isinstance(b, dict) and b.get("type") == "tool_result"
                ]
        return found

    def input_estimate(self) -> int:
        """Input tokens at 4 characters a token over messages, system prompt and tools."""
        sized = {k: self.body.get(k) for k in ("messages", "system", "tools")}
        return max(1, len(json.dumps(sized)) // 4)


def _text(content: Any) -> str:
    if isinstance(content, list):
        return "".join(
            str(p.get("text", "")) for p in content if isinstance(p, dict) and "text" in p
        )
    return "" if content is None else str(content)


Responder = Callable[[Prompt], Answer | CallError]
"""Answers one call; called from the servers' threads, so it must be thread-safe."""


class ScriptedResponder:
    """Answers from a queue (``enqueue``), in the order calls are answered; with the
    queue empty, ``default`` answers (by default a ``CallError`` saying so, so a test
    that forgot an answer fails loudly)."""

    def __init__(self, default: Responder | None = None) -> None:
        self._queue: deque[Answer | CallError] = deque()
        self._lock = threading.Lock()
        self._default = default
        self.prompts: list[Prompt] = []

    def enqueue(self, *answers: Answer | CallError) -> None:
        with self._lock:
            self._queue.extend(answers)

    @property
    def pending(self) -> int:
        with self._lock:
            return len(self._queue)

    def __call__(self, prompt: Prompt) -> Answer | CallError:
        with self._lock:
            self.prompts.append(prompt)
            if self._queue:
                return self._queue.popleft()
        if self._default is not None:
            return self._default(prompt)
        return CallError(418, "invalid_request_error", "local server: no answer left")


def echo(prompt: Prompt) -> Answer:
    """A text answer naming the step and the last user text: deterministic, never fails."""
    last = prompt.user_text.rsplit("\n", 1)[-1]
    return Answer(text=f"step {prompt.assistant_messages}: {last}")


def load_responder(spec: str) -> Responder:
    """The responder named ``module:attribute`` (a command-line option of the servers);
    an attribute that is a class or factory taking no argument is called first."""
    module, _, name = spec.partition(":")
    if not module or not name:
        raise ValueError(f"responder {spec!r} is not 'module:attribute'")
    value = getattr(importlib.import_module(module), name)
    if isinstance(value, type):
        value = value()
    if not callable(value):
        raise ValueError(f"responder {spec!r} is not callable")
    responder: Responder = value
    return responder
