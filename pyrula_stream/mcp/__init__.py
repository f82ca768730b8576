"""Model Context Protocol: tools from MCP servers, and our tools and agents as one.

- ``declaration``: ``MCPServer``, what an agent declares.
- ``pool``: the worker's connections (opened once, reused, reconnected, closed).
- ``tools``: ``MCPTool``, a server's tool as a ``@tool``-like callable.
- ``discovery``: a turn's tool list, journaled as a step.
- ``serve``: ``build_mcp_server``, exposing ``@tool``s and Kafka agents over MCP.

Only ``declaration`` is imported eagerly: the SDK (``pip install 'pyrula-stream[mcp]'``)
is needed only when a server is used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pyrula_stream.mcp.declaration import MCPServer

if TYPE_CHECKING:
    from pyrula_stream.mcp.serve import build_mcp_server

__all__ = ["MCPServer", "build_mcp_server"]


def __getattr__(name: str) -> Any:
    if name == "build_mcp_server":
        from pyrula_stream.mcp.serve import build_mcp_server

        return build_mcp_server
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
