"""``AgentContext``: the durable operations an agent body may call.

``ctx.llm.run/stream`` (the tool loop), direct tool calls, ``ctx.step``, ``ctx.sleep``,
``ctx.wait_for_signal`` and ``ctx.emit_status``. Every durable call is journaled; the body
must be deterministic outside them. A wait parks the turn (no task, no slot): a signal
is a record, taken into the journal like a sub-agent's reply. ``ctx.interrupt`` waits
for a person, which an agent must opt in to (``human_in_the_loop=True``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Sequence
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from pyrula_stream.agent.limits import check_wall_time
from pyrula_stream.context.agent_calls import AgentCalls, refuse_llm_override
from pyrula_stream.context.memory_calls import AgentMemory
from pyrula_stream.context.tool_calls import ToolCall, ToolCalls
from pyrula_stream.context.tool_loop import ToolLoop, ToolResultBlock
from pyrula_stream.context.waits import Waits
from pyrula_stream.durable.steps import StepData, TurnSteps
from pyrula_stream.errors import (
    ConcurrentCallIdError,
    ConfigurationError,
    KafkaLimitError,
    NestedDurableOperationError,
    WriteToolBlocked,
)
from pyrula_stream.llm.base import ModelResponse, TextBlock, ToolUseBlock
from pyrula_stream.state.threads import ThreadHandle
from pyrula_stream.tools.contract import (
    ToolCallable,
    current_boundary,
    durable_boundary,
    encode_result,
)
from pyrula_stream.wire.events import Status
from pyrula_stream.wire.fingerprint import fingerprint
from pyrula_stream.wire.signals import Signal
from pyrula_stream.wire.subagents import TurnParked

if TYPE_CHECKING:
    from pyrula_stream.wire.serde import TurnRequest

KAFKA_WAIT_LIMIT = (
    "a Kafka agent cannot wait for a person unless it opts in: bind it with "
    "@kafka_agent(human_in_the_loop=True) to park the turn until the answer arrives, or "
    "split the flow into two turns (submit a new turn when the answer arrives)"
)


def _refuse_nested(operation: str, name: str) -> None:
    boundary = current_boundary()
    if boundary is not None:
        raise NestedDurableOperationError(operation, name, boundary[0], boundary[1])


class LLMHandle:
    """``ctx.llm``: the agent's model, bound to this turn's journal."""

    def __init__(self, loop: ToolLoop) -> None:
        self._loop = loop

    @property
    def client(self) -> Any:
        return self._loop.llm

    def run(
        self,
        messages: list[dict[str, Any]],
        *,
        tools: Sequence[ToolCallable] | None = None,
        system: str | None = None,
        history: bool = True,
    ) -> Coroutine[Any, Any, str]:
        """Run the tool loop with the agent's tools (or ``tools``); return the final text.

        In a thread, the earlier turns' messages go before ``messages`` unless
        ``history=False``. The loop's own coroutine, not one that awaits it: a frame
        fewer per turn in flight.
        """
        _refuse_nested("ctx.llm.run", "llm")
        return self._loop.run(messages, tools=tools, system=system, history=history)

    async def stream(
        self,
        messages: list[dict[str, Any]],
        *,
        tools: Sequence[ToolCallable] | None = None,
        system: str | None = None,
        history: bool = True,
    ) -> AsyncIterator[TextBlock | ToolUseBlock | ToolResultBlock]:
        """The tool loop as an iterator of content blocks: text, tool calls, tool results."""
        _refuse_nested("ctx.llm.stream", "llm")
        async for item in self._loop.stream(messages, tools=tools, system=system, history=history):
            if not isinstance(item, ModelResponse):
                yield item


class AgentContext:
    """What an agent body receives as its first argument."""

    def __init__(
        self,
        turn: TurnSteps,
        loop: ToolLoop,
        tool_calls: ToolCalls,
        agent_calls: AgentCalls,
        *,
        deps: Any = None,
        durable_timer_after_s: float = 5.0,
        memory: AgentMemory | None = None,
    ) -> None:
        self._turn = turn
        self._memory = memory
        self._loop = loop
        self._timer_after_s = durable_timer_after_s
        self._tool_calls = tool_calls
        self._agent_calls = agent_calls
        self.llm = LLMHandle(loop)
        self.deps = deps
        self._waits = Waits(turn)
        self._interrupts = 0
        self._direct_counters: dict[str, int] = {}
        self._running_ids: dict[tuple[str, str], None] = {}  # a set: 216 bytes empty

    @property
    def turn_id(self) -> str:
        return self._turn.turn_id

    @property
    def run_id(self) -> str:
        return self._turn.turn_id

    @property
    def request(self) -> TurnRequest:
        return self._turn.request

    @property
    def metadata(self) -> dict[str, Any]:
        return self._turn.request.metadata

    @property
    def thread_id(self) -> str | None:
        return self._turn.request.thread_id

    @property
    def memory(self) -> AgentMemory:
        """Shared agent memory (``put``/``get``/``delete``/``list``/``search``), every call
        journaled; see ``pyrula_stream.state.memory``."""
        if self._memory is None:
            raise ConfigurationError("ctx.memory needs a worker (KafkaWorker) to hold it")
        return self._memory

    @property
    def thread(self) -> ThreadHandle | None:
        """The turn's thread (its id and earlier turns), ``None`` for a turn without one."""
        return self._turn.thread

    @property
    def attempt(self) -> int:
        return self._turn.attempt

    @property
    def cancelled(self) -> bool:
        return self._turn.cancelled

    async def emit_status(self, text: str) -> None:
        """An ephemeral ``status`` event: published, never journaled."""
        self._turn.emit(Status(text))

    async def step(
        self, name: str, fn: Callable[..., Awaitable[Any] | Any], *args: Any, **kwargs: Any
    ) -> Any:
        """Run ``fn`` once per turn and journal its (JSON) result; a replay returns it."""
        _refuse_nested("ctx.step", name)
        input_hash = fingerprint([list(args), kwargs])

        async def live() -> StepData:
            if self._turn.branch is not None:  # a branch never runs a step live
                try:
                    return self._turn.branch.step_result(None, name, input_hash)
                except WriteToolBlocked as exc:
                    raise self._turn.refuse(exc) from None
            check_wall_time(self._tool_calls.limits, self._turn.started_ms)
            await self._turn.barrier()
            with durable_boundary("step", name):
                value = fn(*args, **kwargs)
                if asyncio.iscoroutine(value):
                    value = await value
            encode_result(value, name)  # fails fast, naming the step, if not serializable
            return {"value": value}

        data, _ = await self._turn.durable_step("step", name, input_hash, live)
        return data["value"]

    async def sleep(self, duration: timedelta | float) -> None:
        """A durable sleep: the wake time is journaled, so a replay sleeps only what is left.

        Past ``WorkerOptions.durable_timer_after_s`` the turn parks instead of holding its slot: its
        journal holds the wake time and the partition's owner then wakes it, whichever
        worker that is.
        """
        seconds = duration.total_seconds() if isinstance(duration, timedelta) else float(duration)
        _refuse_nested("ctx.sleep", "sleep")

        async def live() -> StepData:
            return {"wake_at_ms": int((time.time() + seconds) * 1000)}

        data, _ = await self._turn.durable_step("sleep", "sleep", fingerprint(seconds), live)
        await self._sleep_to(int(data["wake_at_ms"]))

    async def sleep_until(self, dt: datetime) -> None:
        """A durable timer to a wall-clock time (timezone-aware, or UTC if naive)."""
        _refuse_nested("ctx.sleep_until", "sleep_until")
        when = dt if dt.tzinfo is not None else dt.replace(tzinfo=UTC)
        wake_at_ms = int(when.timestamp() * 1000)

        async def live() -> StepData:
            return {"wake_at_ms": wake_at_ms}

        await self._turn.durable_step("sleep", "sleep_until", fingerprint(wake_at_ms), live)
        await self._sleep_to(wake_at_ms)

    async def _sleep_to(self, wake_at_ms: int) -> None:
        remaining = wake_at_ms / 1000 - time.time()
        if remaining > self._timer_after_s:
            await self._turn.barrier()
            raise TurnParked(wake_at_ms=wake_at_ms)
        await asyncio.sleep(max(0.0, remaining))

    async def call_agent(
        self, agent_fn: Any, *, llm: Any = None, id: str | None = None, **kwargs: Any
    ) -> Any:
        """Run another agent's turn as this turn's child and return its result.

        ``agent_fn`` is a ``@kafka_agent`` (or its name, under this agent's prefix). The
        child's request commits with this step; the turn parks (no task, no slot) until
        the child's reply arrives, then resumes by replay. A child's ``run:error`` raises
        ``SubAgentError`` with the child's code. ``id=`` keys the call (default: its
        position among this turn's calls).
        """
        _refuse_nested("ctx.call_agent", getattr(agent_fn, "name", str(agent_fn)))
        refuse_llm_override(llm)
        return await self._agent_calls.call(agent_fn, kwargs, id=id)

    async def gather_subagents(
        self, *calls: tuple[Any, dict[str, Any]], id: str | None = None, poll_interval: float = 0.5
    ) -> list[Any]:
        """Run ``(agent, params)`` calls as children, at most ``max_parallel_subagents`` at
        once; return their results in order (the first failure, in order, raises).
        ``poll_interval`` is accepted for the seeds' signature: replies are records, so
        nothing polls."""
        _refuse_nested("ctx.gather_subagents", "gather")
        return await self._agent_calls.gather(calls, id=id)

    async def call_tool(
        self, tool: ToolCallable, arguments: dict[str, Any], *, id: str | None = None
    ) -> Any:
        """A tool called from agent code (``await my_tool(ctx, ...)``): a durable call keyed
        by a per-name counter or ``id=``. A failure raises the tool's error: ``Poison``
        quarantines the turn, anything else is a ``ToolCallFailed`` with the tool's code."""
        _refuse_nested("tool call", tool.name)
        if id is None:
            n = self._direct_counters.get(tool.name, 0)
            self._direct_counters[tool.name] = n + 1
            call_key = f"direct:{tool.name}#{n}"
        else:
            call_key = f"direct:{tool.name}#id={id}"
            if (tool.name, id) in self._running_ids:
                raise ConcurrentCallIdError(tool.name, id)
            self._running_ids[(tool.name, id)] = None
        try:
            data = await self._tool_calls.run(
                ToolCall(call_key, tool.name, arguments, tool, direct=True)
            )
        finally:
            if id is not None:
                self._running_ids.pop((tool.name, id), None)
        return data.get("value")

    async def mcp_tools(self, server: str | None = None) -> list[ToolCallable]:
        """The MCP tools of ``server`` (or of all declared servers), to pass as ``tools=``.

        The first call for a server journals its tool list as a step; a replay gets the
        journaled list, even with the server down. No MCP servers declared: ``[]``, but
        naming a server the agent does not declare raises ``ConfigurationError``.
        """
        _refuse_nested("ctx.mcp_tools", server or "mcp")
        if self._loop.mcp is None:
            if server is not None:
                raise ConfigurationError(
                    f"ctx.mcp_tools({server!r}): this agent declares no MCP servers; "
                    "add it to @kafka_agent(mcp_servers=[...])"
                )
            return []
        return list(await self._loop.mcp.tools(server))

    # -- waiting for someone ----------------------------------------------------------------

    async def interrupt(
        self,
        question: Any = None,
        *,
        timeout: timedelta | float | None = None,  # noqa: ASYNC109 (a durable timer)
    ) -> Any:
        """Ask a person ``question`` (JSON) and return their answer's payload.

        Needs ``@kafka_agent(human_in_the_loop=True)``. The turn parks with
        ``run:interrupted`` (``reason: "interrupt"``, key ``interrupt#<n>``) until
        ``KafkaAgentClient.resume`` (or ``pyrula-stream approve|reject``) answers that
        key; ``timeout`` is a durable timer after which ``WaitTimeout`` is raised here.
        """
        if not self._tool_calls.human_in_the_loop:
            raise self._turn.refuse(
                KafkaLimitError(f"ctx.interrupt is not available: {KAFKA_WAIT_LIMIT}")
            )
        _refuse_nested("ctx.interrupt", "interrupt")
        seconds = timeout.total_seconds() if isinstance(timeout, timedelta) else timeout
        key = f"interrupt#{self._interrupts}"
        self._interrupts += 1
        return await self._waits.answer(key, question, seconds)

    async def wait_for_signal(
        self,
        name: str,
        *,
        timeout: timedelta | float | None = None,  # noqa: ASYNC109 (a durable timer)
        deadline: datetime | None = None,
    ) -> Signal:
        """Park the turn until a signal named ``name`` arrives for it and return it.

        A signal is a record (``KafkaAgentClient.signal``, ``pyrula-stream signal``); one
        that arrived before this wait is taken at once. ``timeout`` (seconds or a
        ``timedelta``) or ``deadline`` (a wall-clock time) is a durable timer: when it
        passes first, ``WaitTimeout`` is raised here (uncaught, the turn ends with
        ``wait_timeout``). A replay returns the same signal.
        """
        _refuse_nested("ctx.wait_for_signal", name)
        return await self._waits.signal(name, timeout=timeout, deadline=deadline)
