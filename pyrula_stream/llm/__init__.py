"""Model clients (floor 3): the provider-neutral interface, ``FakeLLM`` and the provider
adapters.

``AnthropicLLM``, ``OpenAILLM`` and ``LiteLLM`` are loaded on first access, so importing
this package does not import (or require) the provider SDKs.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from pyrula_stream.llm.base import (
    LLMClient,
    LLMRate,
    ModelRequest,
    ModelResponse,
    StreamingMode,
    TextBlock,
    TextDelta,
    ToolDefinition,
    ToolUseBlock,
    Usage,
)
from pyrula_stream.llm.fake import FakeLLM, reply_text, reply_tool_call, reply_tool_calls

if TYPE_CHECKING:
    from pyrula_stream.llm.anthropic import AnthropicLLM
    from pyrula_stream.llm.fallback import FallbackLLM
    from pyrula_stream.llm.litellm import LiteLLM
    from pyrula_stream.llm.openai import OpenAILLM

_LAZY = {
    "AnthropicLLM": "pyrula_stream.llm.anthropic",
    "FallbackLLM": "pyrula_stream.llm.fallback",
    "LiteLLM": "pyrula_stream.llm.litellm",
    "OpenAILLM": "pyrula_stream.llm.openai",
}

__all__ = [
    "AnthropicLLM",
    "FakeLLM",
    "FallbackLLM",
    "LLMClient",
    "LLMRate",
    "LiteLLM",
    "ModelRequest",
    "ModelResponse",
    "OpenAILLM",
    "StreamingMode",
    "TextBlock",
    "TextDelta",
    "ToolDefinition",
    "ToolUseBlock",
    "Usage",
    "reply_text",
    "reply_tool_call",
    "reply_tool_calls",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
