"""``build_mcp_server``: our ``@tool`` functions and Kafka agents as an MCP server.

A tool runs in this process as the tool loop would run it (its retry, timeout and
result encoding; a failure is an ``isError`` result). An agent becomes one MCP tool whose
arguments are the agent body's parameters: a call submits a turn to
``<prefix>.<agent>.turns`` and returns the turn's result, so an MCP client (a desktop
assistant) can call an agent that runs on Kafka. ``serve_stdio`` and ``serve_http`` run
the server; ``pyrula-stream mcp serve MODULE:AGENT`` does it from a shell. Over HTTP the
SDK's DNS-rebinding protection stays on and ``HTTPGuard`` asks for an API key; the key's
name becomes the ``owner`` in the metadata of the turns a call submits.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import httpx

from pyrula_stream.access.api_keys import OWNER_METADATA
from pyrula_stream.access.http_guard import (
    NO_KEYS,
    ASGIApp,
    HTTPAccess,
    HTTPGuard,
    host_names,
    principal_of,
)
from pyrula_stream.errors import ConfigurationError, ToolRegistrationError
from pyrula_stream.tools.contract import (
    KAFKA_APPROVAL_LIMIT,
    InvalidToolArguments,
    ToolCallable,
    ToolContext,
    canonical_json,
)

if TYPE_CHECKING:
    from mcp.server.lowlevel import Server
    from mcp.server.transport_security import TransportSecuritySettings

    from pyrula_stream.agent.definition import KafkaAgent
    from pyrula_stream.client.kafka_client import KafkaAgentClient
    from pyrula_stream.wire.events import Event


@dataclass
class _Resources:
    """What calls share while the server runs (opened by the server's lifespan)."""

    http: httpx.AsyncClient
    kafka: dict[str, KafkaAgentClient]  # by topic prefix


Call = Callable[[Mapping[str, Any], _Resources, str | None], Awaitable[tuple[str, bool]]]
"""(arguments, resources, principal: the caller's key name over HTTP with keys) → result."""

MCP_EXPOSES = "run turns of the served agents (spending model budget and running their tools)"


@dataclass(frozen=True)
class _Exposed:
    name: str
    description: str
    input_schema: dict[str, Any]
    read_only: bool
    call: Call = field(repr=False)


def _refuse_approval(tool: ToolCallable) -> None:
    if tool.spec.needs_approval_support:
        raise ToolRegistrationError(
            f"build_mcp_server cannot expose tool '{tool.name}': it declares requires_approval "
            f"or approval_timeout, but {KAFKA_APPROVAL_LIMIT}, and neither can an MCP call. "
            "Remove the approval options or leave the tool out"
        )


def _expose_tool(tool: ToolCallable) -> _Exposed:
    _refuse_approval(tool)

    async def call(
        arguments: Mapping[str, Any], res: _Resources, principal: str | None
    ) -> tuple[str, bool]:
        outcome = await tool.invoke(ToolContext(http=res.http, tool_name=tool.name), arguments)
        return outcome.text, outcome.is_error

    return _Exposed(
        tool.name, tool.spec.description, tool.definition().input_schema, tool.spec.read_only, call
    )


def _expose_agent(agent: KafkaAgent, turn_timeout: float | None) -> _Exposed:
    import inspect

    from pyrula_stream.context.agent_context import AgentContext
    from pyrula_stream.tools.schema import derive_arguments, validate_arguments

    model, schema = derive_arguments(agent.fn, agent.name, schema=None, context_type=AgentContext)
    timeout = turn_timeout if turn_timeout is not None else agent.timeout

    async def call(
        arguments: Mapping[str, Any], res: _Resources, principal: str | None
    ) -> tuple[str, bool]:
        try:
            params = validate_arguments(agent.name, schema, model, arguments)
        except InvalidToolArguments as exc:
            return str(exc), True
        kafka = res.kafka[agent.prefix]
        metadata = {OWNER_METADATA: principal} if principal is not None else None
        handle = await kafka.submit(agent.name, metadata=metadata, **params)
        events: list[Event] = []

        async def collect() -> None:
            since_ms = handle.submitted_ms - 60_000
            async for event in kafka.stream(agent.name, handle.turn_id, since_ms=since_ms):
                events.append(event)

        try:
            await asyncio.wait_for(collect(), timeout)
        except TimeoutError:  # the turn is durable: it goes on without this caller
            return (
                f"turn {handle.turn_id} of agent '{agent.name}' did not finish within "
                f"turn_timeout={timeout:g}s; it still runs on Kafka (follow it with "
                f"`pyrula-stream tail {agent.name} --turn {handle.turn_id}`)",
                True,
            )
        last = events[-1]
        if last.type == "run:complete":
            result = last.data.get("result")
            return (result if isinstance(result, str) else canonical_json(result)), False
        return (
            f"turn {last.turn_id} failed ({last.data.get('code')}): {last.data.get('message')}",
            True,
        )

    description = inspect.cleandoc(agent.fn.__doc__ or "") or f"Run the Kafka agent '{agent.name}'."
    return _Exposed(agent.name, description, schema, False, call)


def build_mcp_server(
    *,
    tools: Sequence[ToolCallable] = (),
    agents: Sequence[KafkaAgent] = (),
    bootstrap_servers: str | None = None,
    name: str = "pyrula-stream",
    turn_timeout: float | None = None,
    kafka_config: Mapping[str, Any] | None = None,
) -> Server[Any]:
    """An MCP server (the SDK's low-level ``Server``) offering ``tools`` and ``agents``.

    Each agent is one tool named after the agent; a call runs one turn on Kafka
    (``bootstrap_servers``) and waits for it (``turn_timeout``, default the agent's
    ``timeout``); a failed turn, or one still running at ``turn_timeout``, is an
    ``isError`` result naming the turn. A tool declaring ``requires_approval`` is refused.
    """
    from pyrula_stream.agent.definition import KafkaAgent

    if importlib.util.find_spec("mcp") is None:
        raise ConfigurationError(
            "build_mcp_server needs the official MCP SDK: pip install 'pyrula-stream[mcp]'"
        )
    exposed: list[_Exposed] = []
    for t in tools:
        if not isinstance(t, ToolCallable):
            raise ToolRegistrationError(f"build_mcp_server: {t!r} is not a @tool")
        exposed.append(_expose_tool(t))
    for a in agents:
        if not isinstance(a, KafkaAgent):
            raise ToolRegistrationError(f"build_mcp_server: {a!r} is not a @kafka_agent")
        exposed.append(_expose_agent(a, turn_timeout))
    if agents and not bootstrap_servers:
        raise ConfigurationError("build_mcp_server(agents=...) needs bootstrap_servers=")
    if not exposed:
        raise ConfigurationError("build_mcp_server needs at least one tool or agent")
    names = [e.name for e in exposed]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ToolRegistrationError(f"build_mcp_server: names repeat: {dupes}")
    prefixes = sorted({a.prefix for a in agents})
    return _server(name, {e.name: e for e in exposed}, bootstrap_servers, prefixes, kafka_config)


def _server(
    name: str,
    exposed: dict[str, _Exposed],
    bootstrap: str | None,
    prefixes: list[str],
    kafka_config: Mapping[str, Any] | None,
) -> Server[Any]:
    from mcp.server.lowlevel import Server
    from mcp.types import (
        CallToolRequestParams,
        CallToolResult,
        ListToolsResult,
        PaginatedRequestParams,
        TextContent,
        Tool,
        ToolAnnotations,
    )

    listing = [
        Tool(
            name=e.name,
            description=e.description,
            input_schema=e.input_schema,
            annotations=ToolAnnotations(read_only_hint=e.read_only),
        )
        for e in exposed.values()
    ]

    @contextlib.asynccontextmanager
    async def lifespan(_: Server[_Resources]) -> AsyncIterator[_Resources]:
        from pyrula_stream.client.kafka_client import KafkaAgentClient

        async with contextlib.AsyncExitStack() as stack:
            http = await stack.enter_async_context(httpx.AsyncClient())
            kafka = {
                prefix: await stack.enter_async_context(
                    KafkaAgentClient(bootstrap or "", prefix=prefix, kafka_config=kafka_config)
                )
                for prefix in prefixes
            }
            yield _Resources(http, kafka)

    async def list_tools(ctx: Any, params: PaginatedRequestParams | None) -> ListToolsResult:
        return ListToolsResult(tools=listing)

    async def call_tool(ctx: Any, params: CallToolRequestParams) -> CallToolResult:
        entry = exposed.get(params.name)
        if entry is None:
            text, is_error = f"unknown tool '{params.name}'; available: {sorted(exposed)}", True
        else:
            request = getattr(ctx, "request", None)  # the HTTP request, over streamable HTTP
            scope = getattr(request, "scope", None)
            principal = principal_of(scope) if isinstance(scope, dict) else None
            text, is_error = await entry.call(
                params.arguments or {}, ctx.lifespan_context, principal
            )
        return CallToolResult(content=[TextContent(text=text)], is_error=is_error)

    return Server(name, lifespan=lifespan, on_list_tools=list_tools, on_call_tool=call_tool)


async def serve_stdio(server: Server[Any]) -> None:
    """Serve over this process's stdin/stdout (how desktop assistants start servers)."""
    from mcp.server.stdio import stdio_server

    async with stdio_server() as (read_stream, write_stream):
        await server.run(read_stream, write_stream, server.create_initialization_options())


def _transport_security(host: str, access: HTTPAccess) -> TransportSecuritySettings:
    """The SDK's own rebinding protection, for the same names ``HTTPGuard`` answers (the
    SDK turns it on by itself only when bound to a loopback name)."""
    from mcp.server.transport_security import TransportSecuritySettings

    names = host_names(host, access.allowed_hosts)
    if "*" in names:
        return TransportSecuritySettings(enable_dns_rebinding_protection=False)
    hosts: list[str] = []
    origins: list[str] = []
    for name in sorted(names):
        bracketed = f"[{name}]" if ":" in name else name
        hosts += [bracketed, f"{bracketed}:*"]
        origins += [f"{s}://{bracketed}{p}" for s in ("http", "https") for p in ("", ":*")]
    return TransportSecuritySettings(
        enable_dns_rebinding_protection=True, allowed_hosts=hosts, allowed_origins=origins
    )


def mcp_http_app(
    server: Server[Any], *, host: str = "127.0.0.1", access: HTTPAccess = NO_KEYS
) -> ASGIApp:
    """The streamable-HTTP ASGI app (``/mcp``) behind ``HTTPGuard``. Refuses (raises
    ``ConfigurationError``) a non-loopback ``host`` without keys unless
    ``access.allow_unauthenticated``."""
    guard_settings = _transport_security(host, access)
    app = server.streamable_http_app(host=host, transport_security=guard_settings)
    return HTTPGuard(app, access, bind_host=host, exposes=MCP_EXPOSES)


async def serve_http(
    server: Server[Any],
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    access: HTTPAccess = NO_KEYS,
) -> None:
    """Serve streamable HTTP at ``http://HOST:PORT/mcp`` until cancelled."""
    import uvicorn

    app = mcp_http_app(server, host=host, access=access)
    await uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning")).serve()
