"""``MCPTool``: one tool of an MCP server, offered to the model like a ``@tool``.

It is a ``ToolCallable`` so the tool loop, direct calls (``await tool(ctx, ...)``), the
bind-time refusals and the journal treat it exactly like a ``@tool``: same retry and
timeout handling (from the ``MCPServer``), same ``ToolOutcome``. A result the server
marks ``isError`` and a server that cannot be reached both come back as error outcomes the
model reads; only the second is retried. ``MCPToolListing`` is the journaled form of a
discovered tool, so a replay rebuilds the same tools without the server.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from pyrula_stream.errors import ErrorCode, TurnFailure
from pyrula_stream.tools.contract import (
    DurableToolCaller,
    ToolCallable,
    ToolContext,
    ToolOutcome,
    ToolSpec,
    canonical_json,
    current_boundary,
)
from pyrula_stream.tools.mcp_servers import MCPServer
from pyrula_stream.wire import guard

if TYPE_CHECKING:
    from mcp.types import CallToolResult, Tool

    from pyrula_stream.mcp.pool import MCPConnection

# The call's ``_meta`` carries the same key a ``@tool`` reads as ``ctx.idempotency_key``
# (stable when a crashed turn reruns the call), so the server can drop a repeat.
IDEMPOTENCY_META_KEY = "pyrula.io/idempotency_key"


@dataclass(frozen=True)
class MCPToolListing:
    """What discovery journals for one tool: enough to offer and call it on a replay."""

    server: str
    tool: str
    name: str
    description: str
    input_schema: dict[str, Any]
    read_only: bool
    destructive: bool | None

    @classmethod
    def from_sdk(cls, server: MCPServer, tool: Tool) -> MCPToolListing:
        hints = tool.annotations
        schema = dict(tool.input_schema) or {"type": "object", "properties": {}}
        return cls(
            server=server.name,
            tool=tool.name,
            name=server.model_tool_name(tool.name),
            description=tool.description or tool.title or "",
            input_schema=schema,
            read_only=bool(hints is not None and hints.read_only_hint),
            destructive=hints.destructive_hint if hints is not None else None,
        )

    @classmethod
    def from_data(cls, data: Mapping[str, Any]) -> MCPToolListing:
        return cls(**{k: data[k] for k in cls.__dataclass_fields__})

    def as_data(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class _Reply:
    """A call's answer from the server, before it becomes a ``ToolOutcome``."""

    value: Any
    text: str
    is_error: bool


def reply_text(result: CallToolResult) -> str:
    """The text the model reads: the text blocks, other blocks as compact JSON."""
    parts = []
    for block in result.content:
        text = getattr(block, "text", None)
        if isinstance(text, str) and getattr(block, "type", None) == "text":
            parts.append(text)
        else:
            parts.append(
                json.dumps(
                    block.model_dump(mode="json", by_alias=True, exclude_none=True),
                    separators=(",", ":"),
                    sort_keys=True,
                )
            )
    if not parts and result.structured_content is not None:
        return canonical_json(result.structured_content)
    return "\n".join(parts)


def checked_reply(result: CallToolResult, tool: str) -> _Reply:
    """A server's answer held to the limits of any outside value: a result nested past
    ``DecodeLimits.max_depth`` (or one that cannot be encoded) is ``MalformedRecordError``,
    which the call reports as a failed tool call, and never reaches the journal."""
    what = f"result of MCP tool '{tool}'"
    with guard.guarded(what):
        value = result.structured_content
        text = reply_text(result)
        guard.check_size(text, what, guard.DEFAULT_LIMITS)
        if value is not None:
            guard.check_depth(canonical_json(value), what, guard.DEFAULT_LIMITS)
        return _Reply(value if value is not None else text, text, bool(result.is_error))


def server_gates(server: MCPServer, listing: MCPToolListing) -> bool:
    """Whether the server's ``requires_approval`` names this tool (by its MCP name or the
    name the model sees), or is ``True`` for all of them."""
    gated = server.requires_approval
    if isinstance(gated, bool):
        return gated
    return listing.tool in gated or listing.name in gated


class MCPTool(ToolCallable):
    """A discovered MCP tool bound to the worker's connection to its server."""

    runs_before_commit = False

    def __init__(self, listing: MCPToolListing, server: MCPServer, connection: MCPConnection):
        spec = ToolSpec(
            name=listing.name,
            description=listing.description,
            input_schema=listing.input_schema,
            retry=server.retry_policy,
            timeout=server.timeout,
            cache_ttl=None,
            writes=False,
            read_only=listing.read_only,
            requires_approval=server_gates(server, listing),
            approval_timeout=None,
            is_async=True,
        )
        super().__init__(self._call_server, spec, None)
        self.__name__ = self.__qualname__ = listing.name
        self.listing = listing
        self.connection = connection

    def __repr__(self) -> str:
        return f"<MCP tool {self.name!r}: {self.listing.tool!r} on {self.listing.server!r}>"

    def event_fields(self) -> dict[str, Any]:
        fields: dict[str, Any] = {"mcp_server": self.listing.server, "mcp_tool": self.listing.tool}
        if self.listing.destructive is not None:
            fields["destructive"] = self.listing.destructive
        return fields

    async def _attempt(self, ctx: Any, kwargs: Mapping[str, Any]) -> Any:
        """One attempt: (re)connect under ``connect_timeout``, then the call under ``timeout``."""
        await self.connection.connect()
        return await super()._attempt(ctx, kwargs)

    async def _call_server(self, ctx: Any, /, **arguments: Any) -> _Reply:
        key = ctx.idempotency_key if isinstance(ctx, ToolContext) else None
        meta = {IDEMPOTENCY_META_KEY: key} if key is not None else None
        result = await self.connection.call_tool(self.listing.tool, arguments, meta=meta)
        return checked_reply(result, self.name)

    async def __call__(self, ctx: Any, /, *, id: str | None = None, **kwargs: Any) -> Any:
        """A direct call: durable with an agent context; with a hand-built one it just runs
        and returns the structured result (else the text), raising if the call failed."""
        if isinstance(ctx, DurableToolCaller) or current_boundary() is not None:
            return await super().__call__(ctx, id=id, **kwargs)
        outcome = await self.invoke(ctx, kwargs)
        if outcome.is_error:
            raise TurnFailure(f"MCP tool '{self.name}' failed: {outcome.text}")
        return outcome.value

    async def run_validated(self, ctx: ToolContext, kwargs: Mapping[str, Any]) -> ToolOutcome:
        """One call under the server's retry and timeout; never raises for a tool failure.

        ``invoke`` (validation first) comes here too, as does the durable tool-call path.
        """
        run = await self._run(ctx, kwargs)
        if run.error is not None:
            return self._failure(run.error, attempts=run.attempts)
        reply: _Reply = run.value
        if reply.is_error:  # the tool ran and reported a failure: the model reads it, no retry
            return ToolOutcome(
                value=None,
                text=reply.text,
                is_error=True,
                attempts=run.attempts,
                error_code=ErrorCode.TOOL_ERROR,
                error_type="MCPToolError",
            )
        return ToolOutcome(reply.value, reply.text, is_error=False, attempts=run.attempts)
