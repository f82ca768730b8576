"""What the approval tests share: a gated ``refund`` tool that records its runs, an agent
with the person in the loop around a body, and reading a turn's events (the ``refunds``
and ``serve`` fixtures in ``conftest.py`` hand these to the tests)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import Any

from pyrula_stream import (
    Event,
    KafkaAgent,
    KafkaAgentClient,
    KafkaWorker,
    ToolContext,
    WorkerOptions,
    kafka_agent,
    tool,
)
from pyrula_stream.llm import FakeLLM
from pyrula_stream.testing import unique_name
from pyrula_stream.tools.contract import ToolCallable

Serve = Callable[..., AbstractAsyncContextManager[KafkaWorker]]
"""What the ``serve`` fixture hands out: ``serve(agent[, options])``, an async context."""

HITL_OPTIONS = WorkerOptions(shutdown_grace=0.2, max_concurrent_turns=4)
"""A quick graceful stop; room for a few parked turns at once."""


@dataclass
class Refunds:
    """A ``refund`` tool gated by ``requires_approval`` and the amounts it ran with."""

    requires_approval: Any = True
    options: dict[str, Any] = field(default_factory=dict)
    ran: list[int] = field(default_factory=list)

    def tool(self) -> ToolCallable:
        @tool(requires_approval=self.requires_approval, **self.options)
        async def refund(ctx: ToolContext, cents: int) -> str:
            """Refund money."""
            self.ran.append(cents)
            return "refunded"

        return refund


def hitl_agent(
    prefix: str,
    body: Callable[..., Any],
    tools: Sequence[ToolCallable],
    replies: Sequence[Any] = ("x",),
) -> KafkaAgent:
    """``body`` as a one-partition agent with ``human_in_the_loop=True`` and a scripted
    model (``replies``)."""
    return kafka_agent(
        name=unique_name(prefix),
        llm=FakeLLM(list(replies)),
        tools=list(tools),
        partitions=1,
        human_in_the_loop=True,
    )(body)


async def until(
    client: KafkaAgentClient, agent: str, turn_id: str, kind: str
) -> tuple[list[Event], Event]:
    """The turn's events up to and including the first of type ``kind``."""
    seen: list[Event] = []

    async def read() -> Event:
        async for event in client.stream(agent, turn_id):
            seen.append(event)
            if event.type == kind:
                return event
        raise AssertionError(f"turn ended without {kind}: {[(e.type, e.data) for e in seen]}")

    found = await asyncio.wait_for(read(), 60)
    return seen, found


async def all_events(client: KafkaAgentClient, agent: str, turn_id: str) -> list[Event]:
    """Every event of the turn, to its end."""

    async def read() -> list[Event]:
        return [e async for e in client.stream(agent, turn_id)]

    return await asyncio.wait_for(read(), 60)
