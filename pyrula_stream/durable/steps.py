"""What a step maker needs of the running turn: a small Protocol ``TurnRuntime`` implements.

A step maker (memory calls, MCP discovery) records its work as durable steps and takes
the turn through this Protocol, so it depends on the kernel's promise, not on the class
that keeps it, the way ``tools.ToolRuntime`` serves a ``ToolContext``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from pyrula_stream.durable.branch import Branch
    from pyrula_stream.errors import PyrulaError
    from pyrula_stream.wire.events import Payload
    from pyrula_stream.wire.records import OutRecord

StepData = dict[str, Any]
"""What a durable step journals and what its replay returns."""


class DurableSteps(Protocol):
    """A running turn as a step maker sees it."""

    @property
    def turn_id(self) -> str: ...

    @property
    def branch(self) -> Branch | None:
        """The recorded turn this one branches from, which refuses effects."""

    def refuse(self, error: PyrulaError) -> PyrulaError:
        """Remember an error that ends the turn even if the body catches it."""

    async def durable_step(
        self,
        kind: str,
        name: str,
        input_hash: str,
        live: Callable[[], Awaitable[StepData]],
        events: Callable[[StepData], Sequence[Payload]] | None = None,
        step: int | None = None,
        effects: Callable[[StepData], Sequence[OutRecord]] | None = None,
    ) -> tuple[StepData, bool]:
        """``(data, replayed)``: the recorded data, or ``live``'s, journaled once."""
