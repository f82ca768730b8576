"""Branches on the real broker: replay a finished turn up to a step, then run live with a
change; read-only tools run live, other tools replay their recorded result or are
blocked with write_tool_blocked, and the original turn is untouched."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from pyrula_stream import (
    AgentContext,
    ConfigurationError,
    Event,
    KafkaAgentClient,
    ToolContext,
    TurnNotRecorded,
    WorkerOptions,
    WriteToolBlocked,
    kafka_agent,
    tool,
)
from pyrula_stream.durable.branch import branch_metadata
from pyrula_stream.llm import FakeLLM, ModelResponse, ToolDefinition, reply_text
from pyrula_stream.runtime.replay import replay_turn
from pyrula_stream.state.history import load_recording
from pyrula_stream.testing import running_worker, unique_name
from tests.agents.recorded import NOTES, make_agent


async def events_of(client: KafkaAgentClient, agent: str, turn_id: str) -> list[Event]:
    return [e async for e in client.stream(agent, turn_id)]


def tools_started(events: list[Event]) -> list[str]:
    return [e.data["tool"] for e in events if e.type == "tool:start"]


async def test_a_branch_from_step_2_runs_read_only_tools_live_and_blocks_a_new_write(
    kafka_bootstrap_servers: str, client: KafkaAgentClient
) -> None:
    agent = make_agent(unique_name("branch"))
    async with running_worker(agent, kafka_bootstrap_servers, WorkerOptions(shutdown_grace=0.2)):
        original = await client.submit(agent.name, question="Where is order 42?")
        before = await events_of(client, agent.name, original.turn_id)
        assert before[-1].type == "run:complete"
        notes = list(NOTES)
        assert notes[-1] == "42:customer asked"

        # New params from step 2: the model's recorded call (look up 42) replays, the
        # read-only lookup runs live, and the model now asks to note order 43: blocked.
        changed = await client.branch(
            agent.name, original.turn_id, from_step=2, question="Where is order 43?"
        )
        blocked = await events_of(client, agent.name, changed.turn_id)

        # Another system prompt from step 2: the model asks for the same note as the
        # original, so the write tool returns its recorded result and runs nothing.
        same_call = await client.branch(
            agent.name, original.turn_id, from_step=2, system="Be brief.", model="fake-2"
        )
        replayed = await events_of(client, agent.name, same_call.turn_id)
        after = await events_of(client, agent.name, original.turn_id)
        branch_recording = await asyncio.to_thread(
            load_recording, kafka_bootstrap_servers, agent.topics.history, same_call.turn_id
        )

    end = blocked[-1]
    assert end.type == "run:error" and end.data["code"] == "write_tool_blocked"
    assert end.data["detail"]["reason"] == "write"
    assert end.data["detail"]["call"] == "tool:add_note"
    assert tools_started(blocked) == ["lookup_order"], "the read-only tool ran live"
    assert all(e.data["branch_of"] == original.turn_id for e in blocked)
    assert blocked[0].type == "run:start"

    assert replayed[-1].type == "run:complete", replayed[-1].data
    assert replayed[-1].data["result"] == before[-1].data["result"]
    assert tools_started(replayed) == ["lookup_order"]
    noted = [e for e in replayed if e.type == "tool:result" and e.data["tool"] == "add_note"]
    assert noted and noted[0].data["output"] == "noted on 42"
    live_models = [e.data["model"] for e in replayed if e.type == "llm:complete"]
    assert live_models == ["fake-2", "fake-2"], "model calls 2 and 3 ran live, on the new model"

    assert notes == NOTES, "no branch repeated the write"
    report = await replay_turn(agent, branch_recording)
    assert report.clean, report.message
    assert [(e.seq, e.type, e.data) for e in after] == [(e.seq, e.type, e.data) for e in before]
    assert all("branch_of" not in e.data for e in after)


async def test_a_branch_needs_a_recorded_turn_and_a_step_inside_it(
    kafka_bootstrap_servers: str, client: KafkaAgentClient
) -> None:
    agent = make_agent(unique_name("nobranch"))
    async with running_worker(agent, kafka_bootstrap_servers, WorkerOptions(shutdown_grace=0.2)):
        original = await client.submit(agent.name, question="Where is order 1?")
        await events_of(client, agent.name, original.turn_id)
        with pytest.raises(ConfigurationError, match="from_step must be between 1 and 6"):
            await client.branch(agent.name, original.turn_id, from_step=9)
    with pytest.raises(TurnNotRecorded, match="keep_history=True"):
        await client.branch(agent.name, "no-such-turn", from_step=1)
    with pytest.raises(TurnNotRecorded, match="keep_history=True"):  # no history topic at all
        await client.branch(unique_name("nohistory"), "no-such-turn", from_step=1)


async def test_a_branch_whose_original_is_gone_ends_with_branch_unresumable(
    kafka_bootstrap_servers: str, client: KafkaAgentClient
) -> None:
    agent = make_agent(unique_name("orphan"))
    async with running_worker(agent, kafka_bootstrap_servers, WorkerOptions(shutdown_grace=0.2)):
        handle = await client.submit(
            agent.name, metadata=branch_metadata("gone", 2, None), question="Where is order 5?"
        )
        events = await events_of(client, agent.name, handle.turn_id)
    assert [e.type for e in events] == ["run:error"]
    assert events[0].data["code"] == "branch_unresumable"
    assert events[0].data["detail"] == {"reason": "parent_missing", "branch_of": "gone"}
    assert events[0].data["branch_of"] == "gone"


async def test_a_branch_refuses_new_steps_and_unmarked_tools_even_when_caught(
    kafka_bootstrap_servers: str, client: KafkaAgentClient
) -> None:
    @tool
    async def send_mail(ctx: ToolContext, n: int) -> str:
        """Marked neither read_only nor writes."""
        return f"sent {n}"

    def double(n: int) -> int:
        return 2 * n

    @kafka_agent(name=unique_name("guard"), llm=FakeLLM(), tools=[send_mail], keep_history=True)
    async def agent(ctx: AgentContext, n: int) -> str:
        await ctx.step("double", double, n)
        try:
            await send_mail(ctx, n=n)
        except WriteToolBlocked:
            return "caught it"
        return "sent"

    async with running_worker(agent, kafka_bootstrap_servers, WorkerOptions(shutdown_grace=0.2)):
        original = await client.submit(agent.name, n=1)
        assert (await events_of(client, agent.name, original.turn_id))[-1].type == "run:complete"
        new_step = await client.branch(agent.name, original.turn_id, from_step=1, n=2)
        new_mail = await client.branch(agent.name, original.turn_id, from_step=2, n=2)
        same_mail = await client.branch(agent.name, original.turn_id, from_step=2)
        step_end = (await events_of(client, agent.name, new_step.turn_id))[-1]
        mail_end = (await events_of(client, agent.name, new_mail.turn_id))[-1]
        same_end = (await events_of(client, agent.name, same_mail.turn_id))[-1]

    assert step_end.data["code"] == "write_tool_blocked"
    assert step_end.data["detail"]["reason"] == "step"
    assert step_end.data["detail"]["call"] == "ctx.step:double"
    assert mail_end.data["code"] == "write_tool_blocked", "the body caught it; still the end"
    assert mail_end.data["detail"]["reason"] == "unmarked"
    assert same_end.type == "run:complete" and same_end.data["result"] == "sent"


async def test_a_branch_never_starts_a_child_turn_it_takes_the_originals_or_stops(
    kafka_bootstrap_servers: str, client: KafkaAgentClient
) -> None:
    refunded: list[int] = []

    @kafka_agent(name=unique_name("refund"), llm=FakeLLM(), partitions=1)
    async def refund(ctx: AgentContext, cents: int) -> int:
        refunded.append(cents)  # the effect a branch must never repeat
        return cents

    @kafka_agent(name=unique_name("desk"), llm=FakeLLM(), keep_history=True, partitions=1)
    async def desk(ctx: AgentContext, cents: int) -> str:
        done = await ctx.call_agent(refund, cents=cents)  # steps 1 (call) and 2 (reply)
        return f"refunded {done}"

    quick = WorkerOptions(shutdown_grace=0.2)
    async with (
        running_worker(refund, kafka_bootstrap_servers, quick),
        running_worker(desk, kafka_bootstrap_servers, quick),
    ):
        original = await client.submit(desk.name, cents=500)
        assert (await events_of(client, desk.name, original.turn_id))[-1].type == "run:complete"
        # The same call from step 1, and only the reply from step 2: the original's child
        # and its reply are taken as recorded.
        same = await client.branch(desk.name, original.turn_id, from_step=1)
        reply_only = await client.branch(desk.name, original.turn_id, from_step=2)
        # Another amount: a new child turn would refund again, so the branch stops.
        other = await client.branch(desk.name, original.turn_id, from_step=1, cents=700)
        same_events = await events_of(client, desk.name, same.turn_id)
        reply_end = (await events_of(client, desk.name, reply_only.turn_id))[-1]
        other_end = (await events_of(client, desk.name, other.turn_id))[-1]

    assert same_events[-1].type == "run:complete", same_events[-1].data
    assert same_events[-1].data["result"] == "refunded 500"
    assert reply_end.type == "run:complete", reply_end.data
    assert reply_end.data["result"] == "refunded 500"
    assert other_end.data["code"] == "write_tool_blocked"
    assert other_end.data["detail"]["reason"] == "effect"
    assert other_end.data["detail"]["call"] == f"agent:{refund.name}"
    assert refunded == [500], "only the original started a child turn"


async def test_a_branch_of_a_thread_turn_sees_the_thread_as_it_was_and_leaves_it_alone(
    kafka_bootstrap_servers: str, client: KafkaAgentClient
) -> None:
    def answers(messages: list[dict[str, Any]], tools: list[ToolDefinition]) -> ModelResponse:
        return reply_text(f"seen {len(messages)} messages")

    @kafka_agent(name=unique_name("tbranch"), llm=FakeLLM(answers), keep_history=True, partitions=1)
    async def chat(ctx: AgentContext, text: str) -> str:
        return await ctx.llm.run([{"role": "user", "content": text}])

    thread = unique_name("t")
    async with running_worker(chat, kafka_bootstrap_servers, WorkerOptions(shutdown_grace=0.2)):
        await client.run(chat.name, thread_id=thread, text="one", timeout=60)
        two = await client.run(chat.name, thread_id=thread, text="two", timeout=60)
        branch = await client.branch(chat.name, two[0].turn_id, from_step=1, text="deux")
        end = (await events_of(client, chat.name, branch.turn_id))[-1]
        kept = await client.get_thread(chat.name, thread)

    assert two[-1].data["result"] == "seen 3 messages"
    assert end.type == "run:complete" and end.data["result"] == "seen 3 messages", end.data
    assert len(kept.turns) == 2 and kept.turns[-1].turn_id == two[0].turn_id
    assert "deux" not in str([t.messages for t in kept.turns]), "the branch added nothing"
