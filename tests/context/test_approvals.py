"""Tool approvals and interrupts (``human_in_the_loop=True``): a gated call parks the turn
before ``tool:start`` with ``run:interrupted``; only ``approve`` runs the tool; a rejection
or an expired ``approval_timeout`` is a denied ``tool:result`` the model reads; a direct
call raises ``ToolCallRejected``; a second answer is refused to its sender."""

from __future__ import annotations

from typing import Any

import pytest

from pyrula_stream import (
    AgentContext,
    KafkaAgentClient,
    SignalRefused,
    ToolCallRejected,
)
from pyrula_stream.llm import reply_tool_call
from pyrula_stream.testing import wait_for
from tests.approvals_kit import Refunds, Serve, all_events, hitl_agent, until


def _model_refunds(refunds: Refunds) -> Any:
    """An agent whose model asks for a gated refund of 25,000 cents, then says done."""
    refund = refunds.tool()

    async def agent(ctx: AgentContext) -> str:
        return await ctx.llm.run([{"role": "user", "content": "refund me"}])

    return hitl_agent(
        "approvals", agent, [refund], [reply_tool_call("refund", cents=25_000), "done"] * 4
    )


async def test_approve_runs_the_tool_and_a_second_answer_is_refused(
    client: KafkaAgentClient, serve: Serve, refunds: Refunds
) -> None:
    agent = _model_refunds(refunds)
    async with serve(agent) as worker:
        handle = await client.submit(agent.name)
        before, asked = await until(client, agent.name, handle.turn_id, "run:interrupted")
        assert not [e for e in before if e.type == "tool:start"]
        assert asked.data["reason"] == "tool_approval"
        assert asked.data["tool_name"] == "refund"
        assert asked.data["tool_input"] == {"cents": 25_000}
        assert asked.data["tool_use_id"]
        key = asked.data["key"]
        assert key == "tool_approval:refund#0.0"
        assert refunds.ran == []
        await wait_for(lambda: worker.parked_turns == 1, 60, "the turn parked on its question")
        (question,) = await client.pending(agent.name)
        assert (question.turn_id, question.key, question.tool_name) == (
            handle.turn_id,
            key,
            "refund",
        )
        assert question.tool_input == {"cents": 25_000}
        receipt = await client.approve(agent.name, handle.turn_id, key, sender="ana")
        assert receipt.accepted
        events = await all_events(client, agent.name, handle.turn_id)
        with pytest.raises(SignalRefused) as second:
            await client.reject(agent.name, handle.turn_id, key)
        assert second.value.reason in ("already_answered", "ended")
        assert await client.pending(agent.name) == []
    assert refunds.ran == [25_000]
    types = [e.type for e in events]
    assert types.count("run:interrupted") == 1 and types.count("tool:start") == 1
    result = next(e.data for e in events if e.type == "tool:result")
    assert result["status"] == "ok"
    assert result["approval"] == "approved" and result["answered_by"] == "ana"
    assert result["approval_key"] == key
    assert events[-1].type == "run:complete"
    assert [e.seq for e in events] == list(range(len(events)))


async def test_a_second_answer_while_the_turn_runs_on_is_refused(
    client: KafkaAgentClient, serve: Serve, refunds: Refunds
) -> None:
    refund = refunds.tool()

    async def body(ctx: AgentContext) -> str:
        await refund(ctx, cents=5)
        await ctx.wait_for_signal("finish")  # keeps the turn alive after the answer
        return "done"

    agent = hitl_agent("approvals", body, [refund], ["done"])
    async with serve(agent):
        handle = await client.submit(agent.name)
        _, asked = await until(client, agent.name, handle.turn_id, "run:interrupted")
        key = asked.data["key"]
        assert key == "tool_approval:refund#0"
        await client.approve(agent.name, handle.turn_id, key)
        await until(client, agent.name, handle.turn_id, "tool:result")
        with pytest.raises(SignalRefused) as second:
            await client.reject(agent.name, handle.turn_id, key, reason="too late")
        assert second.value.reason == "already_answered"
        await client.signal(agent.name, handle.turn_id, "finish")
        events = await all_events(client, agent.name, handle.turn_id)
    assert refunds.ran == [5]
    assert events[-1].type == "run:complete"


async def test_reject_and_expire_deny_the_call_and_the_model_reads_why(
    client: KafkaAgentClient, serve: Serve, refunds: Refunds
) -> None:
    expiring = Refunds(options={"approval_timeout": 1.0}, ran=refunds.ran)
    rejected_agent = _model_refunds(refunds)
    expired_agent = _model_refunds(expiring)
    async with serve(rejected_agent), serve(expired_agent):
        handle = await client.submit(rejected_agent.name)
        _, asked = await until(client, rejected_agent.name, handle.turn_id, "run:interrupted")
        await client.reject(
            rejected_agent.name, handle.turn_id, asked.data["key"], reason="too big", sender="bo"
        )
        rejected = await all_events(client, rejected_agent.name, handle.turn_id)
        expired = await client.run(expired_agent.name, timeout=60)
    assert refunds.ran == [], "a denied call never runs"
    for events, verdict in ((rejected, "rejected"), (expired, "expired")):
        types = [e.type for e in events]
        assert "tool:start" not in types, verdict
        assert types.count("run:interrupted") == 1
        result = next(e.data for e in events if e.type == "tool:result")
        assert result["status"] == "error" and result["approval"] == verdict
        assert "was not approved" in result["output"]
        assert events[-1].type == "run:complete"
    result = next(e.data for e in rejected if e.type == "tool:result")
    assert result["answered_by"] == "bo" and result["approval_reason"] == "too big"
    assert "rejected by bo: too big" in result["output"]
    interrupted = next(e.data for e in expired if e.type == "run:interrupted")
    assert interrupted["deadline_ms"] > 0


async def test_a_predicate_gates_only_the_calls_it_holds_for_and_a_direct_denial_raises(
    client: KafkaAgentClient, serve: Serve, refunds: Refunds
) -> None:

    def over_limit(args: Any) -> bool:
        if args["cents"] < 0:
            raise ValueError("negative")  # a predicate that raises asks
        return bool(args["cents"] > 10_000)

    refunds.requires_approval = over_limit
    refund = refunds.tool()

    async def body(ctx: AgentContext) -> dict[str, Any]:
        small = await refund(ctx, cents=100)  # the predicate says no: runs, nothing asked
        try:
            await refund(ctx, cents=-1)
        except ToolCallRejected as exc:
            denied = {"tool": exc.tool_name, "reason": exc.reason, "expired": exc.expired}
        return {"small": small, "denied": denied}

    agent = hitl_agent("approvals", body, [refund])
    async with serve(agent):
        handle = await client.submit(agent.name)
        before, asked = await until(client, agent.name, handle.turn_id, "run:interrupted")
        assert asked.data["key"] == "tool_approval:refund#1"
        assert asked.data["tool_input"] == {"cents": -1}
        assert [e.data["input"] for e in before if e.type == "tool:start"] == [{"cents": 100}]
        await client.reject(agent.name, handle.turn_id, asked.data["key"], reason="no")
        events = await all_events(client, agent.name, handle.turn_id)
    assert refunds.ran == [100]
    assert events[-1].data["result"] == {
        "small": "refunded",
        "denied": {"tool": "refund", "reason": "no", "expired": False},
    }


async def test_interrupt_returns_the_answer_and_changed_arguments_fail_the_resume(
    client: KafkaAgentClient, serve: Serve, refunds: Refunds
) -> None:
    attempts: list[int] = []

    refund = refunds.tool()

    async def body(ctx: AgentContext, which: str) -> Any:
        if which == "interrupt":
            return await ctx.interrupt({"ask": "ship it?"})
        attempts.append(1)
        return await refund(ctx, cents=len(attempts))  # not deterministic: 1, then 2

    agent = hitl_agent("approvals", body, [refund])
    async with serve(agent):
        asking = await client.submit(agent.name, which="interrupt")
        _, asked = await until(client, agent.name, asking.turn_id, "run:interrupted")
        assert asked.data["reason"] == "interrupt"
        assert asked.data["question"] == {"ask": "ship it?"}
        await client.resume(agent.name, asking.turn_id, asked.data["key"], {"ship": True})
        answered = await all_events(client, agent.name, asking.turn_id)
        changing = await client.submit(agent.name, which="changing")
        _, asked = await until(client, agent.name, changing.turn_id, "run:interrupted")
        await client.approve(agent.name, changing.turn_id, asked.data["key"])
        changed = await all_events(client, agent.name, changing.turn_id)
    assert answered[-1].data["result"] == {"ship": True}
    assert changed[-1].type == "run:error"
    assert changed[-1].data["code"] == "replay_input_changed"


async def test_an_answer_to_a_question_not_asked_is_refused_and_approves_nothing(
    client: KafkaAgentClient, serve: Serve, refunds: Refunds
) -> None:
    refund = refunds.tool()

    async def body(ctx: AgentContext) -> str:
        await ctx.wait_for_signal("start")
        try:
            return await refund(ctx, cents=7)
        except ToolCallRejected as exc:
            return f"rejected: {exc.reason}"

    agent = hitl_agent("approvals", body, [refund])
    async with serve(agent) as worker:
        handle = await client.submit(agent.name)
        await wait_for(lambda: worker.parked_turns == 1, 60, "the turn waits for 'start'")
        with pytest.raises(SignalRefused) as early:  # a pre-approval would run it unseen
            await client.approve(agent.name, handle.turn_id, "tool_approval:refund#0")
        assert early.value.reason == "not_asked"
        await client.signal(agent.name, handle.turn_id, "start")
        _, asked = await until(client, agent.name, handle.turn_id, "run:interrupted")
        await client.reject(agent.name, handle.turn_id, asked.data["key"], reason="later")
        events = await all_events(client, agent.name, handle.turn_id)
    assert refunds.ran == []
    assert events[-1].data["result"] == "rejected: later"
