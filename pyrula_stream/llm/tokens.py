"""A cheap, provider-neutral token estimate for a request, before it is sent.

The context-window check and the rate limiter need a number before the provider gives
the real one. Over-estimating only costs an earlier compaction or a short wait;
under-estimating costs a rejected call, so the estimate leans high: about four ASCII
characters per token over the JSON of the request, but one token for each non-ASCII
character (CJK text and emoji run close to that), plus a small overhead per message.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any

from pyrula_stream.llm.base import ToolDefinition

CHARS_PER_TOKEN = 4.0
MESSAGE_OVERHEAD_TOKENS = 4
REQUEST_OVERHEAD_TOKENS = 8


def _tool_json(tool: ToolDefinition | dict[str, Any]) -> dict[str, Any]:
    if isinstance(tool, ToolDefinition):
        return {"name": tool.name, "description": tool.description, "schema": tool.input_schema}
    return dict(tool)


def text_tokens(text: str) -> int:
    """The estimate for one piece of text."""
    non_ascii = sum(1 for ch in text if ord(ch) > 127)
    return math.ceil((len(text) - non_ascii) / CHARS_PER_TOKEN) + non_ascii


_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), default=str)


def estimate_tokens(
    messages: Sequence[dict[str, Any]],
    system: str | None = None,
    tools: Sequence[ToolDefinition | dict[str, Any]] | None = None,
) -> int:
    """Estimated input tokens of a request: messages, system prompt and tool definitions."""
    payload = {
        "system": system or "",
        "tools": [_tool_json(t) for t in tools or ()],
        "messages": list(messages),
    }
    encoded = _ENCODER.encode(payload)
    return text_tokens(encoded) + MESSAGE_OVERHEAD_TOKENS * len(messages) + REQUEST_OVERHEAD_TOKENS
