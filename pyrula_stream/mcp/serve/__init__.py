"""Deprecated path of ``pyrula_stream.integrations.mcp_server``, kept for one release.

The MCP server side moved out of ``mcp/`` (the client side) because it is built on the
client and the agents. A package rather than a ``serve.py``, so git sees that file moved.
"""

import warnings

from pyrula_stream.integrations.mcp_server import build_mcp_server, serve_http, serve_stdio

warnings.warn(
    "pyrula_stream.mcp.serve moved to pyrula_stream.integrations.mcp_server; "
    "the old path goes away in the next release",
    DeprecationWarning,
    stacklevel=2,
)

__all__ = ["build_mcp_server", "serve_http", "serve_stdio"]
