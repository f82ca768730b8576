"""Model Context Protocol, the client side (floor 6): tools from MCP servers for a turn to
call.

- ``pool``: the worker's connections (opened once, reused, reconnected, closed).
- ``tools``: ``MCPTool``, a server's tool as a ``@tool``-like callable.
- ``discovery``: a turn's tool list, journaled as a step.

The server side (our tools and agents as one MCP server) is
``pyrula_stream.integrations.mcp_server``; what an agent declares, ``MCPServer``, is
``pyrula_stream.tools.mcp_servers`` (floor 4), re-exported here. Nothing else is imported
eagerly: the SDK (``pip install 'pyrula-stream[mcp]'``) is needed only when a server is used.
"""

from __future__ import annotations

from pyrula_stream.tools.mcp_servers import MCPServer

__all__ = ["MCPServer"]
