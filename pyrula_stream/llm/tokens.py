"""A cheap, provider-neutral token estimate for a request, before it is sent.

The context-window check and the rate limiter need a number before the provider gives
the real one. Over-estimating only costs an earlier compaction or a short wait;
under-estimating costs a rejected call, so the estimate leans high: about four ASCII
characters per token over the JSON of the request, but one token for each non-ASCII
character (CJK text and emoji run close to that), plus a small overhead per message.

The count is additive over the pieces of that JSON (the system prompt, each tool, each
message and the punctuation between them), so a conversation that grows at its end is
counted one new message at a time (``RunningEstimate``) and gives the same number as
``estimate_tokens`` of the whole request. Characters are counted by C code (an ASCII
``encode`` that drops the rest), never one at a time in Python.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from operator import is_
from typing import Any

from pyrula_stream.llm.base import ModelRequest, ToolDefinition

CHARS_PER_TOKEN = 4.0
MESSAGE_OVERHEAD_TOKENS = 4
REQUEST_OVERHEAD_TOKENS = 8


def _tool_json(tool: ToolDefinition | dict[str, Any]) -> dict[str, Any]:
    if isinstance(tool, ToolDefinition):
        return {"name": tool.name, "description": tool.description, "schema": tool.input_schema}
    return dict(tool)


def _non_ascii(text: str) -> int:
    """How many characters of ``text`` are not ASCII (C speed: the ASCII ones are kept)."""
    return 0 if text.isascii() else len(text) - len(text.encode("ascii", "ignore"))


def text_tokens(text: str) -> int:
    """The estimate for one piece of text."""
    non_ascii = _non_ascii(text)
    return math.ceil((len(text) - non_ascii) / CHARS_PER_TOKEN) + non_ascii


_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), default=str)

Count = tuple[int, int]
"""``(characters, non-ASCII characters)`` of a piece of the request's JSON."""

_PUNCTUATION = len(_ENCODER.encode({"system": "", "tools": [], "messages": []})) - 2
"""The request object's keys and braces, and the brackets of its two lists: its JSON with
an empty system prompt (``""``, taken out) and empty lists."""


def _count(value: Any) -> Count:
    encoded = _ENCODER.encode(value)
    return len(encoded), _non_ascii(encoded)


def _list_count(items: Sequence[Any]) -> Count:
    """The items of a JSON list with the commas between them (the brackets are counted in
    ``_PUNCTUATION``)."""
    chars = non_ascii = 0
    for item in items:
        c, n = _count(item)
        chars += c
        non_ascii += n
    return chars + max(0, len(items) - 1), non_ascii


def _tokens(system: Count, tools: Count, messages: Count, count: int) -> int:
    chars = _PUNCTUATION + system[0] + tools[0] + messages[0]
    non_ascii = system[1] + tools[1] + messages[1]
    ascii_chars = chars - non_ascii
    return (
        math.ceil(ascii_chars / CHARS_PER_TOKEN)
        + non_ascii
        + MESSAGE_OVERHEAD_TOKENS * count
        + REQUEST_OVERHEAD_TOKENS
    )


def estimate_tokens(
    messages: Sequence[dict[str, Any]],
    system: str | None = None,
    tools: Sequence[ToolDefinition | dict[str, Any]] | None = None,
) -> int:
    """Estimated input tokens of a request: messages, system prompt and tool definitions.

    ``text_tokens`` of the request's compact JSON ``{"system", "tools", "messages"}`` plus
    ``MESSAGE_OVERHEAD_TOKENS`` a message and ``REQUEST_OVERHEAD_TOKENS``."""
    payload = {
        "system": system or "",
        "tools": [_tool_json(t) for t in tools or ()],
        "messages": list(messages),
    }
    encoded = _ENCODER.encode(payload)
    return text_tokens(encoded) + MESSAGE_OVERHEAD_TOKENS * len(messages) + REQUEST_OVERHEAD_TOKENS


class RunningEstimate:
    """``estimate_tokens`` of a conversation that grows between calls, each message
    counted once.

    A tool loop estimates its whole request before every model call (the context window,
    the rate limiter); counting it all again made a turn's CPU grow with the square of its
    length. The messages already counted are taken as they were when counted, as
    ``RunningFingerprint`` takes them: the list passed next must be the last one grown at
    its end (copied or not). One that is shorter, or whose first or last counted message
    is another object, is counted over. The system prompt is counted again when it
    changes, the tools when one is another object (a tool's ``definition()`` is built
    once, and ``ToolDefinition`` is frozen).
    """

    __slots__ = ("_chars", "_count", "_first", "_last", "_non_ascii", "_system", "_tools")

    def __init__(self) -> None:
        self._chars = self._non_ascii = self._count = 0
        self._first: Any = None
        self._last: Any = None
        self._system: tuple[str, Count] | None = None
        self._tools: tuple[tuple[Any, ...], Count] | None = None

    def of(
        self,
        messages: Sequence[dict[str, Any]],
        system: str | None = None,
        tools: Sequence[ToolDefinition | dict[str, Any]] | None = None,
    ) -> int:
        """``estimate_tokens(messages, system, tools)``; only the messages after the last
        call's are encoded."""
        return _tokens(
            self._system_count(system or ""), self._tools_count(tools), *self._grow(messages)
        )

    def _grow(self, messages: Sequence[dict[str, Any]]) -> tuple[Count, int]:
        count = self._count
        if count and (
            len(messages) < count
            or messages[0] is not self._first
            or messages[count - 1] is not self._last
        ):
            self._chars = self._non_ascii = count = self._count = 0
        for message in messages[count:]:
            c, n = _count(message)  # first, so a failure leaves no half
            self._chars += c + (1 if self._count else 0)  # the comma before it
            self._non_ascii += n
            if not self._count:
                self._first = message
            self._last = message
            self._count += 1
        return (self._chars, self._non_ascii), self._count

    def _system_count(self, system: str) -> Count:
        if self._system is None or self._system[0] != system:
            self._system = (system, _count(system))
        return self._system[1]

    def _tools_count(self, tools: Sequence[ToolDefinition | dict[str, Any]] | None) -> Count:
        held = tuple(tools or ())
        cached = self._tools
        if cached is None or len(cached[0]) != len(held) or not all(map(is_, cached[0], held)):
            cached = self._tools = (held, _list_count([_tool_json(t) for t in held]))
        return cached[1]


def request_tokens(request: ModelRequest) -> int:
    """``estimate_tokens`` of a request, with the ``RunningEstimate`` it carries if any."""
    counter = request.tokens
    if isinstance(counter, RunningEstimate):
        return counter.of(request.messages, request.system, request.tools)
    return estimate_tokens(request.messages, request.system, request.tools)
