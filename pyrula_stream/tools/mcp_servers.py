"""``MCPServer``: one Model Context Protocol server an agent takes tools from.

A declaration only: where the server is (``url=`` for streamable HTTP, ``command=`` for
stdio), how its calls are retried and timed out, and what the model calls its tools.
The connection lives in the worker's pool (``pool.py``); the tools in ``tools.py``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import KW_ONLY, dataclass, field

from pyrula_stream.errors import ConfigurationError
from pyrula_stream.redaction import REDACTED, redact_url
from pyrula_stream.tools.retry import RetryPolicy

SERVER_NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")
TOOL_NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")
_NOT_IN_TOOL_NAME = re.compile(r"[^a-zA-Z0-9_-]")


@dataclass(frozen=True)
class MCPServer:
    """An MCP server: ``MCPServer("github", url=..., headers=...)`` or ``command=[...]``.

    A ``command=`` server is started by the worker (``env`` is added to a minimal
    environment, as the SDK does; ``cwd`` is its working directory).

    ``retry`` and ``timeout`` apply to each tool call (and to discovery) as they do to a
    ``@tool``; a server that cannot be reached is a tool error the model reads. Opening
    the session (starting a ``command=`` server, which ``npx`` or ``uvx`` can make slow)
    is bounded by ``connect_timeout`` instead, not counted in ``timeout``.
    ``tool_names`` maps an MCP tool name to the name the model sees (default
    ``<server>_<tool>``). ``requires_approval`` (``True``, or MCP tool names) gates those
    tools for a reviewer as ``@tool(requires_approval=True)`` does: only an agent bound
    with ``human_in_the_loop=True`` may use such a server. The repr shows no header,
    variable or argument value, nor a URL's password or query values: they may be
    credentials.
    """

    name: str
    _: KW_ONLY
    url: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    command: Sequence[str] = ()
    env: Mapping[str, str] | None = None
    cwd: str | None = None
    retry: int | RetryPolicy = 0
    timeout: float = 30.0
    connect_timeout: float = 30.0
    tool_names: Mapping[str, str] = field(default_factory=dict)
    requires_approval: Sequence[str] | bool = ()

    def __post_init__(self) -> None:
        where = f"MCPServer {self.name!r}"
        if not isinstance(self.name, str) or not SERVER_NAME.fullmatch(self.name):
            raise ConfigurationError(
                f"{where}: the name must be 1 to 64 characters from [a-zA-Z0-9_-]; "
                "it prefixes the tool names the model sees"
            )
        if isinstance(self.command, str):
            raise ConfigurationError(f"{where}: command is a list of arguments, not one string")
        if bool(self.url) == bool(self.command):
            raise ConfigurationError(
                f"{where}: give exactly one of url= (streamable HTTP) or command=[...] (stdio)"
            )
        if self.url and not self.url.startswith(("http://", "https://")):
            raise ConfigurationError(f"{where}: url must start with http:// or https://")
        if self.headers and not self.url:
            raise ConfigurationError(f"{where}: headers= applies to url= servers only")
        if (self.env is not None or self.cwd is not None) and not self.command:
            raise ConfigurationError(f"{where}: env= and cwd= apply to command= servers only")
        for option in ("timeout", "connect_timeout"):
            value = getattr(self, option)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ConfigurationError(f"{where}: {option} must be seconds, got {value!r}")
            if not (math.isfinite(value) and value > 0):
                raise ConfigurationError(f"{where}: {option} must be > 0, got {value!r}")
        self.retry_policy  # noqa: B018 (validates retry= here rather than on the first call)
        for tool, model_name in self.tool_names.items():
            if not TOOL_NAME.fullmatch(model_name):
                raise ConfigurationError(
                    f"{where}: tool_names[{tool!r}] = {model_name!r} is not a valid tool name; "
                    "use 1 to 64 characters from [a-zA-Z0-9_-]"
                )

    def __repr__(self) -> str:
        """Names only where credentials live: header and variable names, the program (its
        arguments may carry a token), the URL without userinfo password or query values."""
        shown: list[str] = [f"{self.name!r}"]
        if self.url:
            shown.append(f"url={redact_url(self.url)!r}")
        if self.headers:
            shown.append(f"headers={ {k: REDACTED for k in self.headers}!r}")
        if self.command:
            program, *args = self.command
            more = f" [{len(args)} argument{'s' * (len(args) > 1)} {REDACTED}]" if args else ""
            shown.append(f"command={program + more!r}")
        if self.env is not None:
            shown.append(f"env={ {k: REDACTED for k in self.env}!r}")
        if self.cwd is not None:
            shown.append(f"cwd={self.cwd!r}")
        shown += [
            f"retry={self.retry!r}",
            f"timeout={self.timeout!r}",
            f"connect_timeout={self.connect_timeout!r}",
        ]
        if self.tool_names:
            shown.append(f"tool_names={dict(self.tool_names)!r}")
        if self.requires_approval:
            shown.append(f"requires_approval={self.requires_approval!r}")
        return f"MCPServer({', '.join(shown)})"

    @property
    def location(self) -> str:
        """Where the server is, fit for an error message: the URL redacted, or the program."""
        return redact_url(self.url) if self.url else self.command[0]

    @property
    def transport(self) -> str:
        return "streamable-http" if self.url else "stdio"

    @property
    def retry_policy(self) -> RetryPolicy:
        if isinstance(self.retry, RetryPolicy):
            return self.retry
        if isinstance(self.retry, int) and not isinstance(self.retry, bool) and self.retry >= 0:
            return RetryPolicy.from_retries(self.retry)
        raise ConfigurationError(
            f"MCPServer {self.name!r}: retry must be an int >= 0 or a RetryPolicy, "
            f"got {self.retry!r}"
        )

    def model_tool_name(self, tool: str) -> str:
        """The name the model sees for the server's ``tool``: mapped, else ``<server>_<tool>``."""
        mapped = self.tool_names.get(tool)
        if mapped is not None:
            return mapped
        return _NOT_IN_TOOL_NAME.sub("_", f"{self.name}_{tool}")[:64]
