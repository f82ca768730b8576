"""The worker's MCP connections: opened on first use, reused across turns, reconnected
after a failure, closed when the worker stops.

The SDK's ``Client`` runs its transport in an anyio task group that belongs to the task
that entered it, so each connection is entered and left by one owner task of its own;
turns only send requests through it. A call races the owner: when the transport dies
(the server was killed, the stdio process exited), the owner ends, the call fails with
``MCPServerUnavailable`` and the next call opens a new connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from pyrula_stream.errors import ConfigurationError, Fatal, MCPServerUnavailable
from pyrula_stream.tools.mcp_servers import MCPServer

if TYPE_CHECKING:
    from mcp import Client
    from mcp.types import CallToolResult, Tool

log = logging.getLogger(__name__)

T = TypeVar("T")
CLOSE_GRACE_S = 5.0
MAX_LIST_PAGES = 100


def _require_sdk() -> None:
    try:
        import mcp  # noqa: F401
    except ImportError as exc:
        raise ConfigurationError(
            "MCP servers need the official MCP SDK: pip install 'pyrula-stream[mcp]'"
        ) from exc


def _is_connection_failure(exc: BaseException) -> bool:
    """Whether ``exc`` means the server is unreachable, as opposed to a refused request."""
    import anyio
    import httpx2
    from mcp.shared.exceptions import MCPError
    from mcp_types.jsonrpc import CONNECTION_CLOSED, REQUEST_TIMEOUT

    if isinstance(exc, MCPError):
        return exc.code in (CONNECTION_CLOSED, REQUEST_TIMEOUT)
    if isinstance(exc, BaseExceptionGroup):
        return any(_is_connection_failure(e) for e in exc.exceptions)
    return isinstance(
        exc,
        OSError
        | httpx2.TransportError
        | anyio.ClosedResourceError
        | anyio.BrokenResourceError
        | anyio.EndOfStream,
    )


class MCPConnection:
    """One server's session for the whole worker."""

    def __init__(self, server: MCPServer) -> None:
        self.server = server
        self.opened = 0  # connections opened so far (1 + reconnects)
        self._client: Client | None = None
        self._owner: asyncio.Task[None] | None = None
        self._closing = asyncio.Event()
        self._lock = asyncio.Lock()
        self._closed = False

    @property
    def connected(self) -> bool:
        return self._owner is not None and not self._owner.done() and self._client is not None

    async def connect(self) -> None:
        """Open the session now if it is not open; bounded by ``connect_timeout`` alone, so
        a slow-starting server does not eat into a call's ``timeout``."""
        await self._connection()

    async def list_tools(self) -> list[Tool]:
        """Every tool the server lists now (all pages)."""

        async def fetch(client: Client) -> list[Tool]:
            tools: list[Tool] = []
            cursor: str | None = None
            for _ in range(MAX_LIST_PAGES):
                page = await client.list_tools(cursor=cursor, cache_mode="refresh")
                tools.extend(page.tools)
                cursor = page.next_cursor
                if cursor is None:
                    break
            return tools

        return await self.request("list its tools", fetch)

    async def call_tool(
        self, tool: str, arguments: dict[str, Any], *, meta: dict[str, Any] | None = None
    ) -> CallToolResult:
        return await self.request(
            f"call tool {tool!r}",
            lambda client: client.call_tool(tool, arguments, meta=meta),  # type: ignore[arg-type]
        )

    async def request(self, what: str, send: Callable[[Client], Awaitable[T]]) -> T:
        """Send one request over the live connection (opening it if needed)."""
        client, owner = await self._connection()
        call = asyncio.ensure_future(send(client))
        try:
            done, _ = await asyncio.wait({call, owner}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not call.done():
                call.cancel()
        if call not in done:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await call
            raise self._unavailable(f"the connection closed while trying to {what}")
        try:
            return call.result()
        except Exception as exc:
            if _is_connection_failure(exc):
                await self._drop(owner)
                raise self._unavailable(f"could not {what}: {exc!r}") from exc
            from mcp.shared.exceptions import MCPError

            if isinstance(exc, MCPError):  # the server answered with an error: no retry helps
                raise Fatal(f"MCP server '{self.server.name}' refused to {what}: {exc}") from exc
            raise

    def _unavailable(self, why: str) -> MCPServerUnavailable:
        return MCPServerUnavailable(
            f"MCP server '{self.server.name}' ({self.server.location}) is unavailable: {why}",
            detail={"server": self.server.name},
        )

    async def _connection(self) -> tuple[Client, asyncio.Task[None]]:
        async with self._lock:
            if self._closed:
                raise self._unavailable("the worker's MCP pool is closed")
            if not self.connected:
                await self._drop()
                await self._open()
            assert self._client is not None and self._owner is not None
            return self._client, self._owner

    async def _open(self) -> None:
        _require_sdk()
        ready: asyncio.Future[Client] = asyncio.get_running_loop().create_future()
        self._closing = asyncio.Event()
        owner = asyncio.create_task(self._own(ready), name=f"mcp-{self.server.name}")
        try:
            async with asyncio.timeout(self.server.connect_timeout):
                self._client = await asyncio.shield(ready)
        except BaseException as exc:
            self._closing.set()
            owner.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await owner
            if isinstance(exc, TimeoutError):
                raise self._unavailable(
                    f"no session within connect_timeout={self.server.connect_timeout:g}s"
                ) from exc
            raise
        self._owner = owner
        self.opened += 1

    async def _own(self, ready: asyncio.Future[Client]) -> None:
        """Enter the SDK client, hand it out, and leave it in this same task."""
        try:
            async with self._make_client() as client:
                if not ready.done():
                    ready.set_result(client)
                await self._closing.wait()
        except asyncio.CancelledError:
            if not ready.done():
                ready.set_exception(self._unavailable("connecting was cancelled"))
            raise
        except BaseException as exc:  # the transport's task group failed: the server is gone
            log.info("MCP server %r: connection ended: %r", self.server.name, exc)
            if not ready.done():
                ready.set_exception(self._unavailable(f"could not connect: {_root(exc)!r}"))

    @contextlib.asynccontextmanager
    async def _make_client(self) -> Any:
        from mcp import Client, StdioServerParameters
        from mcp.client.streamable_http import streamable_http_client
        from mcp.shared._httpx_utils import create_mcp_http_client

        server = self.server
        if server.url:
            async with create_mcp_http_client(headers=dict(server.headers) or None) as http:
                transport = streamable_http_client(server.url, http_client=http)
                async with Client(transport, cache=None) as client:
                    yield client
        else:
            params = StdioServerParameters(
                command=server.command[0],
                args=list(server.command[1:]),
                env=dict(server.env) if server.env is not None else None,
                cwd=server.cwd,
            )
            async with Client(params, cache=None) as client:
                yield client

    async def _drop(self, failed: asyncio.Task[None] | None = None) -> None:
        """Close the current connection (or ``failed``, if it is still the current one)."""
        if failed is not None and failed is not self._owner:
            return  # another call already replaced it
        owner, self._owner, self._client = self._owner, None, None
        if owner is None:
            return
        self._closing.set()
        if not owner.done():
            try:
                async with asyncio.timeout(CLOSE_GRACE_S):
                    await asyncio.shield(owner)
            except TimeoutError:
                owner.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await owner

    async def close(self) -> None:
        """Close for good; safe to repeat."""
        async with self._lock:
            self._closed = True
            await self._drop()


def _root(exc: BaseException) -> BaseException:
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


class MCPPool:
    """The worker's connections, one per declared server; an async context manager."""

    def __init__(self, servers: Sequence[MCPServer]) -> None:
        self.servers = {s.name: s for s in servers}
        self._connections = {s.name: MCPConnection(s) for s in servers}

    def connection(self, server: str) -> MCPConnection:
        found = self._connections.get(server)
        if found is None:
            declared = ", ".join(self.servers) or "none"
            raise ConfigurationError(
                f"no MCP server named {server!r} is declared (declared: {declared}); "
                "add it to @kafka_agent(mcp_servers=[...])"
            )
        return found

    async def __aenter__(self) -> MCPPool:
        if self.servers:
            _require_sdk()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        for connection in self._connections.values():
            await connection.close()
