"""Agents that call agents over Kafka: the call and the reply are records, a waiting
parent is parked (only its journal), and each call runs exactly one child turn."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
from opentelemetry import context as otel_context
from opentelemetry import trace

from pyrula_stream import (
    AgentContext,
    AgentLimits,
    Event,
    KafkaAgent,
    KafkaAgentClient,
    MeshWorker,
    WorkerOptions,
    as_tool,
    kafka_agent,
)
from pyrula_stream.errors import SubAgentError
from pyrula_stream.kafka.admin import apply_topics, committed_offsets
from pyrula_stream.llm import FakeLLM, ModelResponse, ToolDefinition, reply_text, reply_tool_call
from pyrula_stream.testing import read_topic, running_worker, unique_name, wait_for

QUICK = WorkerOptions(shutdown_grace=0.2)


def refunds_agent() -> KafkaAgent:
    @kafka_agent(name=unique_name("refunds"), llm=FakeLLM(["ok"]), partitions=2)
    async def refunds(ctx: AgentContext, order_id: str, cents: int) -> dict[str, Any]:
        if cents > 10_000:
            raise ValueError(f"refund of {cents} needs a person")
        return {"order_id": order_id, "refunded": cents}

    return refunds


def triage_agent(child: KafkaAgent) -> KafkaAgent:
    @kafka_agent(name=unique_name("triage"), llm=FakeLLM(["ok"]), partitions=2)
    async def triage(ctx: AgentContext, order_id: str, cents: int) -> str:
        try:
            done = await ctx.call_agent(child, order_id=order_id, cents=cents)
        except SubAgentError as exc:
            return f"escalated: {exc.child_code}"
        return f"refunded {done['refunded']}"

    return triage


async def events_of(client: KafkaAgentClient, agent: str, turn_id: str) -> list[Event]:
    return await asyncio.wait_for(_collect(client, agent, turn_id), 60)


async def _collect(client: KafkaAgentClient, agent: str, turn_id: str) -> list[Event]:
    return [e async for e in client.stream(agent, turn_id)]


async def _tree(client: KafkaAgentClient, agent: str, turn_id: str) -> list[Event]:
    return [e async for e in client.stream(agent, turn_id, include_children=True)]


def live_journal_keys(bootstrap: str, topic: str) -> list[str]:
    latest: dict[bytes | None, bytes | None] = {}
    for key, value, _ in read_topic(bootstrap, topic):
        latest[key] = value
    return sorted(k.decode() for k, v in latest.items() if v is not None and k is not None)


async def test_a_caller_named_in_metadata_only_is_not_a_parent(
    kafka_bootstrap_servers: str, client: KafkaAgentClient
) -> None:
    """Any submitter writes metadata; only lineage headers (placement-checked) name a
    parent, so a turn cannot pass itself off as another agent's call."""
    refunds = refunds_agent()
    forged = {"parent_turn_id": "someone-else", "parent_agent": "triage"}
    async with running_worker(refunds, kafka_bootstrap_servers, QUICK, all_partitions=True):
        events = await client.run(refunds.name, metadata=forged, order_id="1", cents=5, timeout=60)
    assert events[-1].type == "run:complete"
    assert events[0].data["metadata"] == forged  # kept as the submitter's metadata
    assert "parent" not in events[0].data


async def test_a_parent_calls_a_child_on_another_worker_and_gets_its_result(
    kafka_bootstrap_servers: str, client: KafkaAgentClient
) -> None:
    refunds = refunds_agent()
    triage = triage_agent(refunds)
    async with (
        running_worker(refunds, kafka_bootstrap_servers, QUICK, all_partitions=True),
        running_worker(triage, kafka_bootstrap_servers, QUICK, all_partitions=True),
    ):
        ok, failed = await asyncio.gather(
            client.run(triage.name, order_id="7", cents=500, timeout=60),
            client.run(triage.name, order_id="8", cents=50_000, timeout=60),
        )
    assert ok[-1].data["result"] == "refunded 500"
    assert failed[-1].data["result"] == "escalated: agent_error"
    types = [e.type for e in ok]
    assert types == ["run:start", "subagent:start", "subagent:result", "run:complete"]
    start = ok[1].data
    assert start["agent"] == refunds.name and start["depth"] == 1
    assert ok[2].data["child_turn_id"] == start["child_turn_id"]
    assert ok[2].data["result"] == {"order_id": "7", "refunded": 500}
    assert [e.seq for e in ok] == list(range(len(ok)))

    child = await events_of(client, refunds.name, start["child_turn_id"])
    assert child[-1].type == "run:complete"
    # Who called, from the request's lineage headers (what the UI shows as "called by").
    assert child[0].data["parent"] == {"agent": triage.name, "turn_id": ok[0].turn_id}
    tree = await asyncio.wait_for(_tree(client, triage.name, ok[0].turn_id), 60)
    assert [(e.turn_id, e.seq) for e in tree if e.turn_id == ok[0].turn_id] == [
        (e.turn_id, e.seq) for e in ok
    ]
    assert [e.type for e in tree if e.turn_id == start["child_turn_id"]] == [e.type for e in child]
    assert {e.agent for e in tree} == {triage.name, refunds.name}
    # The child's request carries its lineage in headers; there is exactly one of it.
    requests = [
        r for r in read_topic(kafka_bootstrap_servers, refunds.topics.turns) if r[0] is not None
    ]
    assert len(requests) == 2
    # Each parent leaves at most its terminal record: steps, reply and park are tombstoned
    # (and the terminal record too, once the committed input offset has passed it).
    keys = live_journal_keys(kafka_bootstrap_servers, triage.topics.journal)
    left = [k for k in keys if not k.startswith("cursor/")]
    assert set(left) <= {f"{e[0].turn_id}/terminal" for e in (ok, failed)}, left


async def test_a_parked_parent_resumes_when_the_childs_worker_comes_back(
    kafka_bootstrap_servers: str, client: KafkaAgentClient
) -> None:
    refunds = refunds_agent()
    triage = triage_agent(refunds)
    apply_topics(kafka_bootstrap_servers, refunds.topic_specs())  # deployed, but no worker up
    async with running_worker(triage, kafka_bootstrap_servers, QUICK, all_partitions=True) as w:
        handle = await client.submit(triage.name, order_id="9", cents=900)
        await wait_for(lambda: w.parked_turns == 1, 60, "the parent parked")
        # Parked: no task, and its input offset no longer pins the partition.
        assert w.running_turns == 0
        scraped = w.metrics.exposition().decode()
        assert f'pyrula_turns_parked{{agent="{triage.name}"}} 1.0' in scraped
        assert f'pyrula_turns_in_flight{{agent="{triage.name}"}} 0.0' in scraped

        def offset_passed() -> bool:
            done = committed_offsets(kafka_bootstrap_servers, w.group_id, triage.topics.turns)
            return done.get(handle.partition, -1) > handle.offset

        await wait_for(offset_passed, 30, "the parked turn's request offset was committed")
    # The parent's worker is gone too; the child runs and replies while nobody owns it.
    async with running_worker(refunds, kafka_bootstrap_servers, QUICK, all_partitions=True):
        start = next(e for e in await _until(client, triage.name, handle.turn_id, "subagent:start"))
        child = await events_of(client, refunds.name, start.data["child_turn_id"])
        assert child[-1].type == "run:complete"
    async with running_worker(triage, kafka_bootstrap_servers, QUICK, all_partitions=True):
        events = await events_of(client, triage.name, handle.turn_id)
    assert events[-1].data["result"] == "refunded 900"
    types = [e.type for e in events]
    assert types.count("run:start") == 1 and types.count("subagent:start") == 1
    assert types.count("subagent:result") == 1
    assert [e.seq for e in events] == list(range(len(events)))
    # One child turn ran for the one call, whatever was replayed.
    child_starts = [
        r
        for r in read_topic(kafka_bootstrap_servers, refunds.topics.events)
        if b"run:start" in (r[1] or b"")
    ]
    assert len(child_starts) == 1


async def _until(
    client: KafkaAgentClient, agent: str, turn_id: str, event_type: str
) -> list[Event]:
    async def read() -> list[Event]:
        seen: list[Event] = []
        async for e in client.stream(agent, turn_id):
            seen.append(e)
            if e.type == event_type:
                return [e]
        return seen

    return await asyncio.wait_for(read(), 60)


async def test_gather_keeps_at_most_max_parallel_subagents_outstanding(
    kafka_bootstrap_servers: str, client: KafkaAgentClient
) -> None:
    refunds = refunds_agent()

    @kafka_agent(
        name=unique_name("fanout"),
        llm=FakeLLM(["ok"]),
        partitions=1,
        limits=AgentLimits(max_parallel_subagents=2),
    )
    async def fanout(ctx: AgentContext, n: int) -> list[int]:
        done = await ctx.gather_subagents(
            *((refunds, {"order_id": str(i), "cents": i}) for i in range(n))
        )
        return [d["refunded"] for d in done]

    async with (
        running_worker(refunds, kafka_bootstrap_servers, QUICK, all_partitions=True),
        running_worker(fanout, kafka_bootstrap_servers, QUICK, all_partitions=True),
    ):
        events = await client.run(fanout.name, n=5, timeout=90)
    assert events[-1].data["result"] == [0, 1, 2, 3, 4]
    outstanding, peak = 0, 0
    for e in events:
        outstanding += {"subagent:start": 1, "subagent:result": -1}.get(e.type, 0)
        peak = max(peak, outstanding)
    assert peak == 2
    assert Counter(e.type for e in events)["subagent:start"] == 5


async def test_gather_waits_for_every_child_then_raises_the_first_failure_in_order(
    kafka_bootstrap_servers: str, client: KafkaAgentClient
) -> None:
    refunds = refunds_agent()  # refuses a refund over 10,000

    @kafka_agent(name=unique_name("batch"), llm=FakeLLM(["ok"]), partitions=1)
    async def batch(ctx: AgentContext, amounts: list[int]) -> Any:
        calls = [(refunds, {"order_id": str(i), "cents": c}) for i, c in enumerate(amounts)]
        try:
            return await ctx.gather_subagents(*calls)
        except SubAgentError as exc:
            return {"failed": exc.child_turn_id, "code": exc.child_code}

    async with (
        running_worker(refunds, kafka_bootstrap_servers, QUICK, all_partitions=True),
        running_worker(batch, kafka_bootstrap_servers, QUICK, all_partitions=True),
    ):
        events = await client.run(batch.name, amounts=[5, 20_000, 30_000, 7], timeout=60)
    started = [e.data["child_turn_id"] for e in events if e.type == "subagent:start"]
    ended = {e.data["child_turn_id"]: e.data for e in events if e.type == "subagent:result"}
    assert len(started) == 4 and set(ended) == set(started)  # every child ended first
    assert events[-1].data["result"] == {"failed": started[1], "code": "agent_error"}
    assert [ended[c]["status"] for c in started] == ["completed", "failed", "failed", "completed"]


async def test_overlapping_call_agents_are_refused_with_a_pointer_to_gather(
    kafka_bootstrap_servers: str, client: KafkaAgentClient
) -> None:
    refunds = refunds_agent()

    @kafka_agent(name=unique_name("hasty"), llm=FakeLLM(["ok"]), partitions=1)
    async def hasty(ctx: AgentContext) -> Any:
        try:
            return await asyncio.gather(
                ctx.call_agent(refunds, order_id="1", cents=1),
                ctx.call_agent(refunds, order_id="2", cents=2),
            )
        except Exception as exc:  # a refusal ends the turn even if the body catches it
            return repr(exc)

    async with (
        running_worker(refunds, kafka_bootstrap_servers, QUICK, all_partitions=True),
        running_worker(hasty, kafka_bootstrap_servers, QUICK, all_partitions=True),
    ):
        events = await client.run(hasty.name, timeout=60)
    end = events[-1]
    assert (end.type, end.data["code"]) == ("run:error", "invalid_request"), end.data
    assert "ctx.gather_subagents" in end.data["message"]


async def test_a_call_past_max_agent_depth_fails_at_once_and_starts_no_child(
    kafka_bootstrap_servers: str, client: KafkaAgentClient
) -> None:
    leaf = refunds_agent()

    @kafka_agent(name=unique_name("middle"), llm=FakeLLM(["ok"]), partitions=1)
    async def middle(ctx: AgentContext) -> Any:
        return await ctx.call_agent(leaf, order_id="1", cents=1)

    @kafka_agent(
        name=unique_name("top"),
        llm=FakeLLM(["ok"]),
        partitions=1,
        limits=AgentLimits(max_agent_depth=1),
    )
    async def top(ctx: AgentContext) -> Any:
        try:
            return await ctx.call_agent(middle)
        except SubAgentError as exc:
            return {"code": exc.child_code, "message": exc.child_message}

    async with (
        running_worker(leaf, kafka_bootstrap_servers, QUICK, all_partitions=True),
        running_worker(middle, kafka_bootstrap_servers, QUICK, all_partitions=True),
        running_worker(top, kafka_bootstrap_servers, QUICK, all_partitions=True),
    ):
        events = await client.run(top.name, timeout=60)
    result = events[-1].data["result"]
    assert result["code"] == "agent_depth_exceeded"
    assert "max_agent_depth=1" in result["message"]
    assert read_topic(kafka_bootstrap_servers, leaf.topics.turns) == []


async def test_a_parent_that_spent_its_budget_starts_no_child(
    kafka_bootstrap_servers: str, client: KafkaAgentClient
) -> None:
    leaf = refunds_agent()

    @kafka_agent(
        name=unique_name("spent"),
        llm=FakeLLM(["a" * 400]),
        partitions=1,
        limits=AgentLimits(max_total_tokens=50),
    )
    async def spent(ctx: AgentContext) -> Any:
        await ctx.llm.run([{"role": "user", "content": "go"}])
        return await ctx.call_agent(leaf, order_id="1", cents=1)

    async with (
        running_worker(leaf, kafka_bootstrap_servers, QUICK, all_partitions=True),
        running_worker(spent, kafka_bootstrap_servers, QUICK, all_partitions=True),
    ):
        events = await client.run(spent.name, timeout=60)
    end = events[-1]
    assert (end.type, end.data["code"]) == ("run:error", "budget_exceeded"), end.data
    assert "max_total_tokens=50 reached" in end.data["message"]
    assert f"before calling '{leaf.name}'" in end.data["message"]
    assert read_topic(kafka_bootstrap_servers, leaf.topics.turns) == []


async def test_a_child_that_exceeds_the_budget_left_fails_and_its_usage_counts(
    kafka_bootstrap_servers: str, client: KafkaAgentClient
) -> None:
    @kafka_agent(name=unique_name("chatty"), llm=FakeLLM(["a" * 400] * 10), partitions=1)
    async def chatty(ctx: AgentContext) -> str:
        for _ in range(10):
            await ctx.llm.run([{"role": "user", "content": "more"}])
        return "never"

    @kafka_agent(
        name=unique_name("thrifty"),
        llm=FakeLLM(["ok"]),
        partitions=1,
        limits=AgentLimits(max_total_tokens=300),
    )
    async def thrifty(ctx: AgentContext) -> Any:
        try:
            return await ctx.call_agent(chatty)
        except SubAgentError as exc:
            return exc.child_code

    async with (
        running_worker(chatty, kafka_bootstrap_servers, QUICK, all_partitions=True),
        running_worker(thrifty, kafka_bootstrap_servers, QUICK, all_partitions=True),
    ):
        events = await client.run(thrifty.name, timeout=60)
    assert events[-1].data["result"] == "budget_exceeded"
    result = next(e for e in events if e.type == "subagent:result")
    assert result.data["error_code"] == "budget_exceeded"
    used = result.data["usage"]
    assert 300 <= used["input_tokens"] + used["output_tokens"] < 600
    # The parent's usage includes its child's.
    assert events[-1].data["usage"]["output_tokens"] == used["output_tokens"]


def patient_agent() -> KafkaAgent:
    @kafka_agent(name=unique_name("patient"), llm=FakeLLM(["ok"]), partitions=2)
    async def patient(ctx: AgentContext, order_id: str, cents: int) -> str:
        for _ in range(1200):  # until its cancel arrives (a minute at most)
            if ctx.cancelled:
                break
            await asyncio.sleep(0.05)
        return "never cancelled"

    return patient


@pytest.mark.parametrize("action", ["cancel", "terminate"])
async def test_cancelling_or_terminating_a_parent_cancels_its_running_child(
    kafka_bootstrap_servers: str, client: KafkaAgentClient, action: str
) -> None:
    patient = patient_agent()
    triage = triage_agent(patient)
    async with (
        running_worker(patient, kafka_bootstrap_servers, QUICK, all_partitions=True),
        running_worker(triage, kafka_bootstrap_servers, QUICK, all_partitions=True) as tw,
    ):
        handle = await client.submit(triage.name, order_id="5", cents=5)
        await wait_for(lambda: tw.parked_turns == 1, 60, "the parent parked")
        start = (await _until(client, triage.name, handle.turn_id, "subagent:start"))[0]
        if action == "cancel":
            await client.cancel(triage.name, handle.turn_id, reason="customer hung up")
        else:
            await client.terminate(triage.name, handle.turn_id, reason="customer hung up")
        parent = await events_of(client, triage.name, handle.turn_id)
        child = await events_of(client, patient.name, start.data["child_turn_id"])
    assert parent[-1].type == "run:error", [(e.type, e.data) for e in parent]
    assert parent[-1].data["code"] == "cancelled"
    assert child[-1].type == "run:error" and child[-1].data["code"] == "cancelled"
    assert "customer hung up" in child[-1].data["message"]


async def test_a_cancelled_child_raises_sub_agent_error_in_its_parent(
    kafka_bootstrap_servers: str, client: KafkaAgentClient
) -> None:
    patient = patient_agent()
    triage = triage_agent(patient)  # catches SubAgentError and returns its code
    async with (
        running_worker(patient, kafka_bootstrap_servers, QUICK, all_partitions=True),
        running_worker(triage, kafka_bootstrap_servers, QUICK, all_partitions=True),
    ):
        handle = await client.submit(triage.name, order_id="6", cents=6)
        start = (await _until(client, triage.name, handle.turn_id, "subagent:start"))[0]
        child_id = start.data["child_turn_id"]
        await client.cancel(patient.name, child_id, reason="refund desk closed")
        parent = await events_of(client, triage.name, handle.turn_id)
    assert parent[-1].type == "run:complete", [(e.type, e.data) for e in parent]
    assert parent[-1].data["result"] == "escalated: cancelled"
    taken = next(e for e in parent if e.type == "subagent:result")
    assert taken.data["child_turn_id"] == child_id
    assert (taken.data["status"], taken.data["error_code"]) == ("failed", "cancelled")


async def test_a_child_request_carries_root_parent_depth_budget_and_trace(
    kafka_bootstrap_servers: str, client: KafkaAgentClient
) -> None:
    leaf = refunds_agent()

    @kafka_agent(name=unique_name("middle"), llm=FakeLLM(["ok"]), partitions=1)
    async def middle(ctx: AgentContext) -> Any:
        return await ctx.call_agent(leaf, order_id="1", cents=1)

    @kafka_agent(
        name=unique_name("top"),
        llm=FakeLLM(["ok"]),
        partitions=1,
        limits=AgentLimits(max_agent_depth=3, max_total_tokens=10_000, max_cost_usd=2.5),
    )
    async def top(ctx: AgentContext) -> Any:
        return await ctx.call_agent(middle, id="ask-middle")

    trace_id = 0x4BF92F3577B34DA6A3CE929D0E0E4736
    submitted = trace.SpanContext(
        trace_id, 0x00F067AA0BA902B7, is_remote=True, trace_flags=trace.TraceFlags(1)
    )
    async with (
        running_worker(leaf, kafka_bootstrap_servers, QUICK, all_partitions=True),
        running_worker(middle, kafka_bootstrap_servers, QUICK, all_partitions=True),
        running_worker(top, kafka_bootstrap_servers, QUICK, all_partitions=True),
    ):
        token = otel_context.attach(trace.set_span_in_context(trace.NonRecordingSpan(submitted)))
        try:
            handle = await client.submit(top.name)
        finally:
            otel_context.detach(token)
        events = await events_of(client, top.name, handle.turn_id)
    assert events[-1].data["result"] == {"order_id": "1", "refunded": 1}
    tree = await asyncio.wait_for(_tree(client, top.name, handle.turn_id), 60)
    assert {e.agent for e in tree} == {top.name, middle.name, leaf.name}  # grandchild too
    assert [e.type for e in tree if e.type in ("run:complete", "run:error")] == ["run:complete"] * 3
    (middle_request,) = read_topic(kafka_bootstrap_servers, middle.topics.turns)
    (leaf_request,) = read_topic(kafka_bootstrap_servers, leaf.topics.turns)
    mid, low = middle_request[2], leaf_request[2]
    middle_turn = next(e for e in events if e.type == "subagent:start").data["child_turn_id"]
    assert mid["pyrula-root-turn-id"] == mid["pyrula-parent-turn-id"] == handle.turn_id
    assert mid["pyrula-parent-agent"] == top.name and mid["pyrula-depth"] == "1"
    assert mid["pyrula-call-key"] == f"agent:{middle.name}#id=ask-middle"
    assert low["pyrula-root-turn-id"] == handle.turn_id
    assert low["pyrula-parent-turn-id"] == middle_turn
    assert low["pyrula-parent-agent"] == middle.name and low["pyrula-depth"] == "2"
    for headers in (mid, low):  # the tightest limits on the path travel down
        assert headers["pyrula-max-depth"] == "3"
        assert headers["pyrula-budget-tokens-left"] == "10000"
        assert float(headers["pyrula-budget-cost-left-usd"]) == 2.5
        assert headers["traceparent"].split("-")[1] == f"{trace_id:032x}"


async def _ask_desk(
    bootstrap: str,
    client: KafkaAgentClient,
    refunds: KafkaAgent,
    model: Callable[[list[dict[str, Any]], list[ToolDefinition]], ModelResponse],
    question: str,
) -> list[Event]:
    """One turn of a desk agent whose model is offered ``refunds`` as a tool."""

    @kafka_agent(
        name=unique_name("desk"), llm=FakeLLM(model), tools=[as_tool(refunds)], partitions=1
    )
    async def desk(ctx: AgentContext, question: str) -> str:
        return await ctx.llm.run([{"role": "user", "content": question}])

    async with (
        running_worker(refunds, bootstrap, QUICK, all_partitions=True),
        running_worker(desk, bootstrap, QUICK, all_partitions=True),
    ):
        return await client.run(desk.name, question=question, timeout=60)


async def test_a_sub_agent_offered_as_a_tool_runs_as_a_child_turn(
    kafka_bootstrap_servers: str, client: KafkaAgentClient
) -> None:
    refunds = refunds_agent()
    seen: list[str] = []

    def model(messages: list[dict[str, Any]], tools: list[ToolDefinition]) -> ModelResponse:
        seen.append(repr(messages))  # the list grows later: keep what this call saw
        assert [t.name for t in tools] == [refunds.name]
        if len(seen) == 1:
            return reply_tool_call(refunds.name, order_id="3", cents=300)
        return reply_text("refund done")

    events = await _ask_desk(kafka_bootstrap_servers, client, refunds, model, "refund order 3")
    assert events[-1].data["result"] == "refund done"
    types = [e.type for e in events if e.type != "llm:delta"]
    assert types == [
        "run:start",
        "llm:complete",
        "subagent:start",
        "subagent:result",
        "llm:complete",
        "run:complete",
    ]
    assert "tool:start" not in types  # a sub-agent is a child turn, never a gated tool
    # Two model calls: the resumed turn took the first response from the journal; the
    # second read the child's result as the tool's result.
    assert len(seen) == 2
    assert '"refunded": 300' in seen[-1] and '"order_id": "3"' in seen[-1]


async def test_a_failed_sub_agent_tool_reads_as_an_error_result_to_the_model(
    kafka_bootstrap_servers: str, client: KafkaAgentClient
) -> None:
    refunds = refunds_agent()  # refuses a refund over 10,000
    seen: list[Any] = []

    def model(messages: list[dict[str, Any]], tools: list[ToolDefinition]) -> ModelResponse:
        seen.append(json.loads(json.dumps(messages)))  # the list grows later: copy it
        if len(seen) == 1:
            return reply_tool_call(refunds.name, order_id="9", cents=90_000)
        return reply_text("a person will call you")

    events = await _ask_desk(kafka_bootstrap_servers, client, refunds, model, "refund order 9")
    assert events[-1].data["result"] == "a person will call you"
    taken = next(e for e in events if e.type == "subagent:result")
    assert taken.data["error_code"] == "agent_error"
    results = [
        block
        for message in seen[-1]
        if isinstance(message.get("content"), list)
        for block in message["content"]
        if block.get("type") == "tool_result"
    ]
    assert len(results) == 1 and results[0]["is_error"] is True
    assert "agent_error" in results[0]["content"] and "needs a person" in results[0]["content"]


async def test_the_two_agent_example_runs_in_one_mesh_process(
    kafka_bootstrap_servers: str, client: KafkaAgentClient
) -> None:
    from examples.triage_refunds import refunds, triage

    async with MeshWorker(
        [triage, refunds], bootstrap_servers=kafka_bootstrap_servers, options=QUICK
    ) as mesh:
        await wait_for(
            lambda: all(w.assigned_partitions == w.agent.partitions for w in mesh.workers),
            60,
            "both agents own their partitions",
        )
        events = await client.run("triage", order_id="7", complaint="arrived broken", timeout=60)
    assert events[-1].data["result"] == "Sorry about that: your refund is on its way."
    taken = next(e for e in events if e.type == "subagent:result")
    assert taken.data["result"]["receipt"] == "refund-7-1200"
