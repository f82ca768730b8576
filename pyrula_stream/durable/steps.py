"""What a step maker needs of the running turn: small Protocols ``TurnRuntime`` implements.

A step maker (the tool loop, tool calls, sub-agent calls, memory calls, waits, approvals,
compaction, MCP discovery, ``AgentContext``) records its work as durable steps and takes
the turn through one of these Protocols, so it depends on the kernel's promise, not on
the class that keeps it, the way ``tools.ToolRuntime`` serves a ``ToolContext``; a step
maker can then be tried on a fake turn. Each Protocol adds to the one before it:

- ``DurableSteps``: the turn's id, its branch, ``refuse`` and ``durable_step``;
- ``TurnSteps``: what the body's operations read of the turn (its request, spend,
  journal, thread, telemetry) and the effects they may have on it (events, barriers);
- ``ModelSteps``: what the model's tool loop needs besides (the count of model calls, the
  tenant's meter, ``durable_step`` in two halves, room in the commit buffer).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from pyrula_stream.agent.limits import Spend
    from pyrula_stream.agent.tenants import TenantMeter
    from pyrula_stream.durable.branch import Branch
    from pyrula_stream.durable.journal import TurnJournal
    from pyrula_stream.errors import PyrulaError
    from pyrula_stream.observability.telemetry import TurnTelemetry
    from pyrula_stream.state.threads import ThreadHandle
    from pyrula_stream.wire.events import Payload
    from pyrula_stream.wire.payload_refs import Offload
    from pyrula_stream.wire.records import OutRecord
    from pyrula_stream.wire.serde import TurnRequest

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

    @property
    def offload(self) -> Offload | None:
        """Where values past the threshold go by reference (``None``: no object store)."""

    async def resolved(self, value: Any) -> Any:
        """``value`` with its payload references read back (a child's large result, a
        large memory value)."""


class TurnSteps(DurableSteps, Protocol):
    """A running turn as the body's operations see it (tool calls, sub-agent calls,
    waits, questions for a person, compaction, ``ctx``)."""

    @property
    def agent(self) -> str: ...

    @property
    def request(self) -> TurnRequest: ...

    @property
    def attempt(self) -> int: ...

    @property
    def partition(self) -> int:
        """The partition of the turns topic (and of its journal) the turn belongs to."""

    @property
    def started_ms(self) -> int | None:
        """When the turn's first attempt started (the wall-time budget counts from it)."""

    @property
    def journal(self) -> TurnJournal:
        """What the turn has already done: steps, and the replies and signals it took in."""

    @property
    def spend(self) -> Spend:
        """Tokens, cost and tool calls so far, its children's included."""

    @property
    def telemetry(self) -> TurnTelemetry: ...

    @property
    def children(self) -> dict[str, str]:
        """Child turns this turn called, with their control topics (a cancel reaches them)."""

    @property
    def thread(self) -> ThreadHandle | None:
        """The turn's thread and its earlier turns; ``None`` for a turn without one."""

    thread_base: list[dict[str, Any]] | None
    """The compacted history this turn uses instead of its thread's earlier turns."""

    @property
    def cancelled(self) -> bool: ...

    def raise_if_cancelled(self) -> None: ...

    def emit(self, payload: Payload) -> None:
        """An event that is not a step (a delta, a status): rides the next commit."""

    async def barrier(self) -> None:
        """Wait until every step journaled so far is committed (before an effect)."""


class CommitRoom(Protocol):
    """The commit buffer as a model call sees it."""

    def room(self, waited_s: float) -> Awaitable[None] | None:
        """What to await before writing when the buffer is full (``None``: write now)."""


class ModelSteps(TurnSteps, Protocol):
    """A running turn as the model's tool loop sees it."""

    model_calls: int
    """Model calls made so far (a call's index, and the tool calls' keys, come from it)."""

    @property
    def meter(self) -> TenantMeter | None:
        """The tenant's quotas, for agents with ``tenant=``."""

    @property
    def output(self) -> CommitRoom: ...

    @property
    def thread_messages(self) -> list[dict[str, Any]]:
        """The messages this turn adds to its thread when it completes."""

    def allocate_steps(self, count: int = 1) -> int:
        """Reserve ``count`` consecutive step indices in program order; the first."""

    def replayed_step(
        self, kind: str, name: str, input_hash: str, step: int | None = None
    ) -> tuple[int, StepData | None]:
        """``durable_step``'s first half: the step's index and its recorded data."""

    def record_step(
        self,
        index: int,
        kind: str,
        name: str,
        input_hash: str,
        data: StepData,
        events: Callable[[StepData], Sequence[Payload]] | None = None,
        effects: Callable[[StepData], Sequence[OutRecord]] | None = None,
    ) -> None:
        """``durable_step``'s second half: journal a live step's data."""
