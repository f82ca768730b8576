"""``ctx.call_agent`` and ``ctx.gather_subagents``: a parent turn's durable calls to other
agents, each a child turn on the child agent's own turns topic.

A call is two steps of the parent: the *call* step (its records carry the child's turn
request, so request and step commit together or not at all) and the *reply* step (the
child's outcome, taken from the reply the worker journaled). When the reply is not there
yet the body raises ``TurnParked``: the turn is parked and resumed by replay when the
reply arrives. Limits: ``max_agent_depth`` refuses a call before any child exists,
``max_parallel_subagents`` bounds the children a gather has outstanding, and the
parent's token and cost budgets include its children's usage (each child gets the
budget left, and its usage comes back in the reply).
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from typing import Any

from pyrula_stream.agent.definition import KafkaAgent
from pyrula_stream.agent.limits import (
    AgentLimits,
    Spend,
    budget_left,
    check_spent,
    check_wall_time,
)
from pyrula_stream.durable.steps import StepData, TurnSteps
from pyrula_stream.errors import (
    AgentDepthExceeded,
    ConfigurationError,
    SubAgentError,
    UserError,
    WriteToolBlocked,
)
from pyrula_stream.wire.events import SubagentResult, SubagentStart
from pyrula_stream.wire.fingerprint import fingerprint
from pyrula_stream.wire.lineage import Lineage
from pyrula_stream.wire.payload_refs import StoredValue
from pyrula_stream.wire.serde import TurnRequest
from pyrula_stream.wire.subagents import (
    CALL_KIND,
    REPLY_KIND,
    Reply,
    TurnParked,
    call_record,
    child_turn_id,
)


def inherited_limits(limits: AgentLimits, lineage: Lineage | None) -> AgentLimits:
    """A child's limits: its own, tightened by the budget its parent had left."""
    if lineage is None:
        return limits
    tokens, cost = limits.max_total_tokens, limits.max_cost_usd
    if lineage.tokens_left is not None:
        tokens = lineage.tokens_left if tokens is None else min(tokens, lineage.tokens_left)
    if lineage.cost_left_usd is not None:
        cost = lineage.cost_left_usd if cost is None else min(cost, lineage.cost_left_usd)
    return dataclasses.replace(limits, max_total_tokens=tokens, max_cost_usd=cost)


def add_child_usage(spend: Spend, usage: Mapping[str, Any]) -> None:
    """A child's tokens and cost count toward its parent's budgets (its calls do not
    count toward the parent's ``max_llm_calls``: the child has its own)."""
    spend.input_tokens += int(usage.get("input_tokens") or 0)
    spend.output_tokens += int(usage.get("output_tokens") or 0)
    spend.cache_creation_input_tokens += int(usage.get("cache_creation_input_tokens") or 0)
    spend.cache_read_input_tokens += int(usage.get("cache_read_input_tokens") or 0)
    spend.cost_usd += float(usage.get("cost_usd") or 0.0)


class AgentCalls:
    """The sub-agent calls of one turn."""

    __slots__ = (
        "_counter",
        "_max_record_bytes",
        "_prefix",
        "_topic_exists",
        "_turn",
        "_waiting",
        "limits",
    )  # one per turn in flight

    def __init__(
        self,
        turn: TurnSteps,
        limits: AgentLimits,
        *,
        prefix: str,
        max_record_bytes: int,
        topic_exists: Callable[[str], Awaitable[bool]],
    ) -> None:
        self._turn = turn
        self._topic_exists = topic_exists
        self.limits = limits
        self._prefix = prefix
        self._max_record_bytes = max_record_bytes
        self._counter = 0
        self._waiting = False

    def _target(self, agent: Any) -> tuple[str, str]:
        if isinstance(agent, KafkaAgent):
            return agent.name, agent.prefix
        if isinstance(agent, str) and agent:
            return agent, self._prefix
        raise UserError(
            f"call_agent takes a @kafka_agent or an agent name, not {type(agent).__name__}"
        )

    def _call_key(self, name: str, id: str | None) -> str:
        if id is not None:
            return f"agent:{name}#id={id}"
        n, self._counter = self._counter, self._counter + 1
        return f"agent:{name}#{n}"

    async def call(self, agent: Any, params: dict[str, Any], *, id: str | None = None) -> Any:
        """Start one child turn and return its result (parking until it replies)."""
        with self._one_at_a_time("call_agent"):
            child = await self.start(agent, params, id=id)
            return self._outcome(await self.take(child))

    @contextlib.contextmanager
    def _one_at_a_time(self, what: str) -> Iterator[None]:
        """Refuse overlapping calls (``asyncio.gather`` of ``call_agent``s): the first one
        to wait parks the turn while the others are still starting, so a replay would meet
        their steps in another order. ``gather_subagents`` is the way to run several."""
        if self._waiting:
            raise self._turn.refuse(
                UserError(
                    f"{what} started while another call_agent/gather_subagents of this turn "
                    "was still running; a turn's sub-agent calls run one at a time (a call "
                    "that waits parks the turn): start several children together with "
                    "ctx.gather_subagents(...)"
                )
            )
        self._waiting = True
        try:
            yield
        finally:
            self._waiting = False

    async def gather(
        self, calls: Sequence[tuple[Any, dict[str, Any]]], *, id: str | None = None
    ) -> list[Any]:
        """Run the calls as children, at most ``max_parallel_subagents`` outstanding at
        once (in call order); return their results in call order. If any failed, raise
        the first failure (in call order) once all have ended."""
        with self._one_at_a_time("gather_subagents"):
            return await self._gather(calls, id=id)

    async def _gather(
        self, calls: Sequence[tuple[Any, dict[str, Any]]], *, id: str | None = None
    ) -> list[Any]:
        window = self.limits.max_parallel_subagents or max(1, len(calls))
        children: list[tuple[str, str]] = []
        replies: list[Reply] = []
        for i, (agent, params) in enumerate(calls):
            if i >= window:
                replies.append(await self.take(children[i - window]))
            key_id = None if id is None else f"{id}.{i}"
            children.append(await self.start(agent, dict(params), id=key_id))
        rest = children[len(replies) :]
        missing = tuple(c for _, c in rest if c not in self._turn.journal.replies)
        if missing:  # park once for all of them, not once per reply
            raise TurnParked(missing)
        for child in rest:
            replies.append(await self.take(child))
        return [self._outcome(r) for r in replies]  # raises the first failure

    async def start(
        self, agent: Any, params: dict[str, Any], *, id: str | None = None, step: int | None = None
    ) -> tuple[str, str]:
        """The call step: produce the child's request in this turn's next commit."""
        name, prefix = self._target(agent)
        call_key = self._call_key(name, id)
        turn = self._turn
        parent = turn.request.lineage
        depth = (parent.depth if parent else 0) + 1
        max_depth = _tightest(self.limits.max_agent_depth, parent.max_depth if parent else None)
        input_hash = fingerprint([call_key, params])
        child_id = child_turn_id(turn.turn_id, call_key, input_hash)

        async def live() -> StepData:
            if turn.branch is not None:  # the original's child, or refused (see branch.py)
                try:
                    return dict(turn.branch.agent_result(CALL_KIND, step, name, input_hash))
                except WriteToolBlocked as exc:
                    raise turn.refuse(exc) from None
            await self._check_call(name, prefix, depth, max_depth)
            return {"child_turn_id": child_id, "agent": name, "depth": depth}

        def request_record(data: StepData) -> list[Any]:
            if turn.branch is not None:  # a branch never starts a child turn
                return []
            lineage = self._child_lineage(call_key, depth, max_depth)
            sent: dict[str, Any] = params
            stored: list[StoredValue] = []
            if turn.offload is not None:  # a large parameter: by reference
                sent, stored = turn.offload.apply(params, f"the parameters of child {child_id}")
            request = TurnRequest(
                turn_id=child_id,
                agent=name,
                params=sent,
                metadata={
                    "parent_turn_id": turn.turn_id,
                    "parent_agent": lineage.parent_agent,
                    "root_turn_id": lineage.root_turn_id,
                },
                submitted_ms=int(time.time() * 1000),
                lineage=lineage,
            )
            record = call_record(request, f"{prefix}.{name}.turns", self._max_record_bytes)
            record.objects = tuple(stored)
            return [record]

        data, _ = await turn.durable_step(
            CALL_KIND,
            name,
            input_hash,
            live,
            lambda d: [SubagentStart(call_key, name, d["child_turn_id"], d["depth"], params)],
            step=step,
            effects=request_record,
        )
        if turn.branch is None:  # a branch's child is the original's, not its to cancel
            turn.children[str(data["child_turn_id"])] = f"{prefix}.{name}.control"
        return name, str(data["child_turn_id"])

    async def _check_call(self, name: str, prefix: str, depth: int, max_depth: int | None) -> None:
        """Before a live call starts a child: depth, wall time, the child's topic, and the
        tokens and cost already spent (the checks a model call makes, ``limits.py``'s)."""
        if max_depth is not None and depth > max_depth:
            raise AgentDepthExceeded(
                f"call to '{name}' would run at depth {depth}, past max_agent_depth="
                f"{max_depth}; no child turn was started",
                detail={"limit": "max_agent_depth", "depth": depth},
            )
        check_wall_time(self.limits, self._turn.started_ms)
        if not await self._topic_exists(f"{prefix}.{name}.turns"):
            raise ConfigurationError(
                f"agent '{name}' has no topic {prefix}.{name}.turns, so it cannot be "
                f"called: start its worker once or run 'pyrula-stream topics apply' for it"
            )
        check_spent(self.limits, self._turn.spend, before=f"calling '{name}'")

    def _child_lineage(self, call_key: str, depth: int, max_depth: int | None) -> Lineage:
        """Where the child comes from, the budget it inherits and the trace it continues."""
        turn = self._turn
        parent = turn.request.lineage
        tokens_left, cost_left = budget_left(self.limits, turn.spend)
        trace = turn.telemetry.event_trace() or {}
        return Lineage(
            root_turn_id=parent.root_turn_id if parent else turn.turn_id,
            parent_turn_id=turn.turn_id,
            parent_agent=turn.agent,
            parent_prefix=self._prefix,
            parent_partition=turn.partition,
            call_key=call_key,
            depth=depth,
            max_depth=max_depth,
            tokens_left=tokens_left,
            cost_left_usd=cost_left,
            # The child's worker continues this turn's trace from the headers.
            traceparent=trace.get("traceparent"),
            tracestate=trace.get("tracestate"),
            # The child runs as this turn's tenant (an agent without tenants passes it on).
            tenant=turn.request.tenant or (parent.tenant if parent else None),
        )

    async def take(self, child: tuple[str, str], *, step: int | None = None) -> Reply:
        """The reply step: the child's outcome, or park until its reply arrives."""
        name, child_id = child
        turn = self._turn

        async def live() -> StepData:
            if turn.branch is not None:  # the child is the original's: so is its reply
                try:
                    return dict(
                        turn.branch.agent_result(REPLY_KIND, step, name, fingerprint(child_id))
                    )
                except WriteToolBlocked as exc:
                    raise turn.refuse(exc) from None
            reply = turn.journal.replies.get(child_id)
            if reply is None:
                raise TurnParked((child_id,))
            return reply

        def result_event(d: StepData) -> list[SubagentResult]:
            r = Reply.from_data(d)
            return [SubagentResult(name, child_id, r.status, r.result, r.code, r.usage or {})]

        data, _ = await turn.durable_step(
            REPLY_KIND, name, fingerprint(child_id), live, result_event, step=step
        )
        reply = Reply.from_data(await turn.resolved(data))  # a large result: by reference
        add_child_usage(turn.spend, reply.usage or {})
        return reply

    @staticmethod
    def _outcome(reply: Reply) -> Any:
        if reply.status != "completed":
            raise SubAgentError(
                reply.agent, reply.child_turn_id, reply.code or "agent_error", reply.message or ""
            )
        return reply.result


def _tightest(a: int | None, b: int | None) -> int | None:
    if a is None:
        return b
    return a if b is None else min(a, b)


def refuse_llm_override(llm: Any) -> None:
    if llm is not None:
        raise ConfigurationError(
            "call_agent(llm=...) is not available on Kafka: the child runs on its own "
            "workers with the model its @kafka_agent binds"
        )
