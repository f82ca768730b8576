"""Tools (floor 4): the ``@tool`` contract and what a tool call needs below the turn.

- ``contract``: ``@tool``, ``ToolContext``, the ``ToolRuntime`` a turn implements.
- ``schema``: arguments models and their JSON Schema.
- ``retry``: ``RetryPolicy``.
- ``cache``, ``cache_table``: the tool-result cache and its table protocol.
- ``deadlines``: one timer per event loop for turn and tool timeouts.
- ``mcp_servers``: ``MCPServer``, what an agent declares (the client is ``mcp/``).

This module is the public face: ``from pyrula_stream.tools import tool`` keeps working.
"""

from pyrula_stream.tools.contract import (
    DurableToolCaller,
    InvalidToolArguments,
    ToolCallable,
    ToolContext,
    ToolOutcome,
    ToolRuntime,
    ToolSpec,
    UnserializableToolResult,
    canonical_json,
    check_bindable,
    current_boundary,
    durable_boundary,
    encode_result,
    tool,
)

__all__ = [
    "DurableToolCaller",
    "InvalidToolArguments",
    "ToolCallable",
    "ToolContext",
    "ToolOutcome",
    "ToolRuntime",
    "ToolSpec",
    "UnserializableToolResult",
    "canonical_json",
    "check_bindable",
    "current_boundary",
    "durable_boundary",
    "encode_result",
    "tool",
]
