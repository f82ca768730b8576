"""``@kafka_agent``: binds an agent body to its model, tools, limits and topics.

Binding is where the Kafka limits are enforced: a tool that needs a person's approval
cannot be offered by an agent whose worker must keep consuming, so the decorator refuses
it at import time rather than letting a turn hang later.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pyrula_stream.errors import AgentRegistrationError, ToolRegistrationError
from pyrula_stream.events import EventRouting
from pyrula_stream.kafka.admin import (
    DEFAULT_PARTITIONS,
    DEFAULT_PREFIX,
    TopicSpec,
    agent_topic_specs,
)
from pyrula_stream.limits import AgentLimits
from pyrula_stream.llm.base import LLMClient
from pyrula_stream.tools import ToolCallable, check_bindable

_AGENT_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,100}$")

_REGISTERED: dict[tuple[str, str], KafkaAgent] = {}
"""Agents bound in this process, by (prefix, name); what ``registered_agents`` lists.
The seeds' API asks for it: binding is import time, and a worker of several agents or a
``call_agent`` by name finds them here. Re-binding a name replaces the earlier agent."""


def registered_agents() -> list[KafkaAgent]:
    """Every agent bound with ``@kafka_agent`` in this process, in the order bound."""
    return list(_REGISTERED.values())


@dataclass(frozen=True)
class AgentTopics:
    """The names of one agent's topics."""

    turns: str
    events: str
    journal: str
    control: str
    dlq: str
    replies: str

    @classmethod
    def for_agent(cls, agent: str, prefix: str = DEFAULT_PREFIX) -> AgentTopics:
        base = f"{prefix}.{agent}"
        return cls(
            f"{base}.turns",
            f"{base}.events",
            f"{base}.journal",
            f"{base}.control",
            f"{base}.dlq",
            f"{base}.replies",
        )


@dataclass(frozen=True)
class MCPServer:
    """An MCP server declaration; only its approval settings matter to binding today."""

    name: str
    url: str = ""
    requires_approval: Sequence[str] | bool = ()


@dataclass(frozen=True)
class KafkaAgent:
    """An agent bound to Kafka: what ``pyrula-stream worker MODULE:AGENT`` runs."""

    name: str
    fn: Callable[..., Any]
    llm: LLMClient | None
    tools: tuple[ToolCallable, ...]
    limits: AgentLimits
    prefix: str = DEFAULT_PREFIX
    partitions: int = DEFAULT_PARTITIONS
    deps: Any = None
    output_topics: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    timeout: float = 600.0

    @property
    def topics(self) -> AgentTopics:
        return AgentTopics.for_agent(self.name, self.prefix)

    def topic_specs(self) -> list[TopicSpec]:
        return agent_topic_specs(self.name, prefix=self.prefix, partitions=self.partitions)

    @property
    def event_routing(self) -> EventRouting:
        """``<agent>.events`` for every event, plus the routed output topics."""
        return EventRouting(self.topics.events, self.output_topics)

    async def __call__(self, ctx: Any, /, **params: Any) -> Any:
        return await self.fn(ctx, **params)


def kafka_agent(
    *,
    name: str | None = None,
    llm: LLMClient | None = None,
    tools: Sequence[ToolCallable] = (),
    limits: AgentLimits | None = None,
    prefix: str = DEFAULT_PREFIX,
    partitions: int = DEFAULT_PARTITIONS,
    deps: Any = None,
    mcp_servers: Sequence[MCPServer] = (),
    output_topics: Mapping[str, Sequence[str]] | None = None,
    timeout: float = 600.0,
) -> Callable[[Callable[..., Any]], KafkaAgent]:
    """Bind an ``async def body(ctx, **params)`` as a Kafka agent.

    ``output_topics`` routes event types (or ``"*"``) to extra topics, e.g.
    ``{"run:complete": ["orders.answers"]}``; every event also goes to ``<agent>.events``.
    """

    def bind(fn: Callable[..., Any]) -> KafkaAgent:
        agent_name = name or fn.__name__
        if not _AGENT_NAME.match(agent_name):
            raise AgentRegistrationError(
                f"agent name {agent_name!r} must match [a-zA-Z0-9_-]{{1,100}}: it names topics"
            )
        if not inspect.iscoroutinefunction(fn):
            raise AgentRegistrationError(f"agent '{agent_name}' must be an async def")
        for t in tools:
            if not isinstance(t, ToolCallable):
                raise ToolRegistrationError(
                    f"agent '{agent_name}': {t!r} is not a @tool; decorate it with @tool"
                )
            check_bindable(t, agent_name=agent_name)
        for server in mcp_servers:
            if server.requires_approval:
                raise ToolRegistrationError(
                    f"agent '{agent_name}': MCP server '{server.name}' sets requires_approval, "
                    "but a Kafka consumer cannot wait for a person's approval"
                )
        names = [t.name for t in tools]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ToolRegistrationError(f"agent '{agent_name}': tool names repeat: {dupes}")
        if partitions < 1:
            raise AgentRegistrationError(f"agent '{agent_name}': partitions must be >= 1")
        agent = KafkaAgent(
            name=agent_name,
            fn=fn,
            llm=llm,
            tools=tuple(tools),
            limits=limits or AgentLimits(),
            prefix=prefix,
            partitions=partitions,
            deps=deps,
            output_topics={k: tuple(v) for k, v in (output_topics or {}).items()},
            timeout=timeout,
        )
        _REGISTERED.pop((prefix, agent_name), None)
        _REGISTERED[(prefix, agent_name)] = agent
        return agent

    return bind
