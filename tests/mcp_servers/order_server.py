"""A real MCP server for the tests, written with the ``mcp`` SDK.

``python -m tests.mcp_servers.order_server --http PORT`` serves streamable HTTP at ``/mcp``;
``--stdio`` serves stdio. ``ORDER_SERVER_TOOLSET=v2`` changes the tool list (``refund``
gone, ``cancel`` added, ``lookup`` described differently), for the changed-list test;
``ORDER_SERVER_TOOLSET=ops`` adds tools that show the server's side of a call (its
process id, the idempotency key it was sent, a large result, a call that never answers,
a process that dies mid-call). ``ORDER_SERVER_START_DELAY``: seconds to wait before
serving, as a slow ``npx``/``uvx`` server would.
``ORDER_SERVER_DOWN_FLAG``: a path; while that file exists the server exits at once, so
a stdio server can be kept down.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from collections import Counter

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations


def build() -> MCPServer:
    server = MCPServer("orders", log_level="WARNING")
    calls: Counter[str] = Counter()
    v2 = os.environ.get("ORDER_SERVER_TOOLSET") == "v2"

    @server.tool(
        description="Look up an order by id (v2)." if v2 else "Look up an order by id.",
        annotations=ToolAnnotations(read_only_hint=True),
    )
    def lookup(order_id: str) -> str:
        calls["lookup"] += 1
        return f"order {order_id} has shipped"

    if not v2:

        @server.tool(
            description="Refund an order; counted so tests can see every real call.",
            annotations=ToolAnnotations(read_only_hint=False, destructive_hint=True),
        )
        def refund(order_id: str, cents: int) -> str:
            calls[f"refund:{order_id}"] += 1
            return f"refunded {cents} cents on order {order_id}"
    else:

        @server.tool(description="Cancel an order.")
        def cancel(order_id: str) -> str:
            return f"cancelled {order_id}"

    @server.tool(
        description="Always fails, as a tool reports a failure (isError).",
        annotations=ToolAnnotations(read_only_hint=True),
    )
    def broken(order_id: str) -> str:
        raise ToolError(f"order {order_id} is locked")

    @server.tool(
        description="The Authorization header the call came with (HTTP only).",
        annotations=ToolAnnotations(read_only_hint=True),
    )
    def whoami(ctx: Context) -> str:
        request = ctx.request_context.request
        headers = getattr(request, "headers", None) or {}
        return str(headers.get("authorization", "anonymous"))

    @server.tool(
        description="How many times a counted tool really ran.",
        annotations=ToolAnnotations(read_only_hint=True),
    )
    def call_count(key: str) -> int:
        return calls[key]

    if os.environ.get("ORDER_SERVER_TOOLSET") == "ops":
        _add_ops_tools(server)
    return server


def _add_ops_tools(server: MCPServer) -> None:
    @server.tool(description="This server's process id.")
    def pid() -> int:
        return os.getpid()

    @server.tool(description="The idempotency key the call carried in its _meta.")
    def key(ctx: Context) -> str:
        meta = ctx.request_context.meta or {}
        return str(meta.get("pyrula.io/idempotency_key", "none"))

    @server.tool(description="A text of `size` characters.")
    def big(size: int) -> str:
        return "x" * size

    @server.tool(description="Never answers.")
    async def stall() -> str:
        await asyncio.Event().wait()
        return "unreachable"

    @server.tool(description="The server process dies while answering.")
    def crash() -> str:
        os._exit(1)


def main() -> None:
    parser = argparse.ArgumentParser()
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--http", type=int, metavar="PORT")
    group.add_argument("--stdio", action="store_true")
    args = parser.parse_args()
    flag = os.environ.get("ORDER_SERVER_DOWN_FLAG")
    if flag and os.path.exists(flag):
        sys.exit(3)
    time.sleep(float(os.environ.get("ORDER_SERVER_START_DELAY", "0")))  # a slow starter
    server = build()
    if args.stdio:
        server.run("stdio")
    else:
        server.run("streamable-http", host="127.0.0.1", port=args.http)


if __name__ == "__main__":
    main()
