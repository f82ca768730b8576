"""What a worker keeps of finished turns, on the real broker: memory and the journal hold a
finished turn only while its request can be read again (until the committed input offset
passes it); idempotency keys are kept for their TTL on disk, and survive a takeover."""

from __future__ import annotations

import asyncio
import gc
import sqlite3
import threading
import types
from collections import deque
from pathlib import Path

from pyrula_stream import (
    AgentContext,
    Event,
    KafkaAgentClient,
    ToolContext,
    WorkerOptions,
    kafka_agent,
    tool,
)
from pyrula_stream.durable.turn import TurnRuntime
from pyrula_stream.llm import FakeLLM
from pyrula_stream.llm.fake import reply_text, reply_tool_call
from pyrula_stream.runtime.worker import KafkaWorker
from pyrula_stream.testing import read_topic, running_worker, unique_name, wait_for
from pyrula_stream.wire.serde import TurnRequest


async def collect(client: KafkaAgentClient, agent: str, turn_id: str) -> list[Event]:
    return [e async for e in client.stream(agent, turn_id)]


def live_journal_keys(bootstrap: str, topic: str) -> set[str]:
    """The keys compaction keeps: those whose newest record is not a tombstone."""
    latest: dict[str, bytes | None] = {}
    for key, value, _ in read_topic(bootstrap, topic):
        if key is not None:
            latest[key.decode()] = value
    return {k for k, v in latest.items() if v is not None}


async def test_finished_turns_are_forgotten_and_their_terminal_records_tombstoned(
    kafka_bootstrap_servers: str, client: KafkaAgentClient
) -> None:
    @kafka_agent(name=unique_name("forget"), llm=FakeLLM(["ok"]), partitions=1)
    async def agent(ctx: AgentContext, n: int) -> str:
        return f"done {n}"

    async with running_worker(agent, kafka_bootstrap_servers) as worker:
        handles = [await client.submit(agent.name, n=n) for n in range(20)]
        keyed = await client.run(agent.name, idempotency_key="k-1", n=20, timeout=60)
        for handle in handles:
            events = await asyncio.wait_for(collect(client, agent.name, handle.turn_id), 60)
            assert events[-1].type == "run:complete"
        await wait_for(
            lambda: worker.turns_finished == 21 and worker.remembered_turns == 0,
            30,
            "the worker forgot its finished turns once their offsets committed",
        )
    live = live_journal_keys(kafka_bootstrap_servers, agent.topics.journal)
    # Nothing of a finished turn survives compaction but an idempotency key's record.
    assert live == {"idem/k-1"}, sorted(live)
    assert keyed[-1].type == "run:complete"


async def test_a_duplicate_key_is_caught_after_a_takeover_from_the_on_disk_table(
    kafka_bootstrap_servers: str, client: KafkaAgentClient, tmp_path: Path
) -> None:
    runs: list[str] = []

    @kafka_agent(name=unique_name("idemdisk"), llm=FakeLLM(["ok"]), partitions=1)
    async def agent(ctx: AgentContext, order: str) -> str:
        runs.append(order)
        return f"charged {order}"

    async with running_worker(agent, kafka_bootstrap_servers, WorkerOptions(worker_id="a")):
        first = await client.run(agent.name, idempotency_key="order-7", order="7", timeout=60)
        await client.run(agent.name, order="6", timeout=60)  # the offset moves past order 7
    state = tmp_path / "state"
    options = WorkerOptions(worker_id="b", state_dir=state)
    async with running_worker(agent, kafka_bootstrap_servers, options):
        # The new owner holds the key on disk, in its SQLite view of the journal.
        (db,) = state.glob("*journal-0.sqlite")
        with sqlite3.connect(db) as conn:
            keys = [row[0] for row in conn.execute("SELECT key FROM entries")]
        assert keys == ["order-7"]
        # The same key resubmitted (same turn id) and another producer's turn with it.
        again = await client.submit(agent.name, idempotency_key="order-7", order="7")
        foreign = TurnRequest("foreign-7", agent.name, {"order": "7"}, idempotency_key="order-7")
        handle = await client.submit_request(foreign)
        duplicate = await asyncio.wait_for(collect(client, agent.name, handle.turn_id), 60)
        marker = await client.run(agent.name, order="8", timeout=60)  # after both requests
    # A third owner: the duplicate's own terminal must not have taken the key over.
    async with running_worker(agent, kafka_bootstrap_servers, WorkerOptions(worker_id="c")):
        third = await client.submit(agent.name, idempotency_key="order-7", order="7")
        other = TurnRequest("foreign-7b", agent.name, {"order": "7"}, idempotency_key="order-7")
        handle_b = await client.submit_request(other)
        duplicate_b = await asyncio.wait_for(collect(client, agent.name, handle_b.turn_id), 60)
        await client.run(agent.name, order="9", timeout=60)
    assert third.turn_id == first[0].turn_id
    assert duplicate_b[0].data["original_turn_id"] == first[0].turn_id
    assert runs == ["7", "6", "8", "9"], "order 7 ran once, across two takeovers"
    assert again.turn_id == first[0].turn_id
    assert marker[-1].type == "run:complete"
    assert [e.type for e in duplicate] == ["run:error"]
    assert duplicate[0].data["code"] == "duplicate_run"
    assert duplicate[0].data["original_turn_id"] == first[0].turn_id
    replayed = await asyncio.wait_for(collect(client, agent.name, again.turn_id), 30)
    assert [e.type for e in replayed].count("run:complete") == 1


async def test_a_reread_request_of_a_finished_turn_is_a_no_op(
    kafka_bootstrap_servers: str, client: KafkaAgentClient
) -> None:
    runs: list[str] = []
    gate = asyncio.Event()

    @kafka_agent(name=unique_name("reread"), llm=FakeLLM(["ok"]), partitions=1)
    async def agent(ctx: AgentContext, name: str) -> str:
        runs.append(name)
        if name == "slow":
            await gate.wait()
        return name

    async with running_worker(agent, kafka_bootstrap_servers, WorkerOptions(shutdown_grace=0.2)):
        slow = await client.submit(agent.name, thread_id="a", name="slow")
        fast = await client.run(agent.name, thread_id="b", name="fast", timeout=60)
    # The slow turn never finished, so the committed offset stayed at its request, before
    # the fast one's: the next owner reads the fast turn's request again.
    assert runs == ["slow", "fast"]
    gate.set()
    async with running_worker(agent, kafka_bootstrap_servers) as worker:
        events = await asyncio.wait_for(collect(client, agent.name, slow.turn_id), 60)
        await wait_for(lambda: worker.remembered_turns == 0, 30, "the restored turns forgotten")
    assert events[-1].type == "run:complete"
    assert runs == ["slow", "fast", "slow"], "the finished turn's re-read request was a no-op"
    replayed = await asyncio.wait_for(collect(client, agent.name, fast[0].turn_id), 30)
    assert [e.type for e in replayed].count("run:complete") == 1
    assert live_journal_keys(kafka_bootstrap_servers, agent.topics.journal) == set()


def held_entries(root: object) -> int:
    """Entries of every dict, list, set, tuple and deque reachable from ``root``.

    Walks object references (``gc.get_referents``) without entering modules, classes or
    functions (their globals are the program, not what the worker holds), a thread (the
    pools' threads are bounded by their size), nor a SQLite connection (its list of
    cursor weakrefs is pruned every 200 cursors by the sqlite3 module). A map keyed by
    turn id, a set of finished ids or a list of spans, wherever it hangs, counts here.
    """
    seen: set[int] = set()
    stack: list[object] = [root]
    total = 0
    while stack:
        obj = stack.pop()
        if id(obj) in seen or isinstance(obj, _NOT_STATE):
            continue
        seen.add(id(obj))
        if isinstance(obj, dict | list | set | frozenset | tuple | deque):
            total += len(obj)
        stack.extend(gc.get_referents(obj))
    return total


_NOT_STATE = (
    type,
    types.ModuleType,
    types.FunctionType,
    types.CodeType,
    types.BuiltinFunctionType,
    threading.Thread,
    sqlite3.Connection,
)


@tool(read_only=True)
async def look_up(ctx: ToolContext, order_id: str) -> dict[str, str]:
    """Look an order up."""
    return {"order_id": order_id, "status": "shipped"}


async def test_what_a_worker_holds_does_not_grow_with_the_turns_it_finished(
    kafka_bootstrap_servers: str, client: KafkaAgentClient
) -> None:
    """Issue 9, defect 7: memory bounded by live turns, not by throughput. Counts entries
    (not bytes): after 40 and after 340 finished turns (tool calls, telemetry, plain and
    keyed) the worker, quiet, holds as many entries as before, give or take noise, and
    no turn's runtime is left alive (the committer once kept its last batch's)."""
    llm = FakeLLM([reply_tool_call("look_up", order_id="1"), reply_text("shipped")])

    @kafka_agent(name=unique_name("flat"), llm=llm, tools=[look_up], partitions=2)
    async def agent(ctx: AgentContext, question: str) -> str:
        return await ctx.llm.run([{"role": "user", "content": question}])

    async def run_turns(worker: KafkaWorker, n: int) -> int:
        target = worker.turns_finished + n
        for i in range(n):
            key = f"flat-{target}-{i}" if i % 2 else None
            await client.submit(agent.name, idempotency_key=key, question=f"order {i}?")
        await wait_for(
            lambda: (
                worker.turns_finished == target
                and worker.running_turns == 0
                and worker.remembered_turns == 0
            ),
            120,
            f"{n} turns finished and forgotten",
        )
        await worker.committer.flush()  # the tombstones of their terminal records
        gc.collect()
        runtimes = [
            o
            for o in gc.get_objects()
            if isinstance(o, TurnRuntime) and o.request.agent == agent.name
        ]
        assert runtimes == [], f"{len(runtimes)} finished turns' runtimes still alive"
        return held_entries(worker)

    async with running_worker(agent, kafka_bootstrap_servers, all_partitions=True) as worker:
        await run_turns(worker, 20)  # warm-up: every lazy structure made once
        before = await run_turns(worker, 20)
        after = await run_turns(worker, 300)
    assert worker.turns_finished == 340
    # One entry kept per finished turn would add 300; the slack is the moment-to-moment
    # bookkeeping of the event loop and the clients (about 20 seen).
    assert after - before < 50, f"the worker holds {after - before} more entries"


async def test_a_resumed_turns_terminal_record_goes_once_a_later_turn_moves_the_offset(
    kafka_bootstrap_servers: str, client: KafkaAgentClient
) -> None:
    """A turn that parked and resumed has no input offset of its own any more (it let go
    of it when it parked): its terminal record goes with the next commit that moves the
    partition's offset, and neither turn leaves a live journal key."""

    @kafka_agent(name=unique_name("resumed"), llm=FakeLLM(["ok"] * 4), partitions=1)
    async def agent(ctx: AgentContext, name: str) -> str:
        if name == "sleeper":
            await ctx.sleep(1.0)  # past durable_timer_after_s: the turn parks, then resumes
        return name

    options = WorkerOptions(shutdown_grace=0.2, durable_timer_after_s=0.2)
    async with running_worker(agent, kafka_bootstrap_servers, options) as worker:
        sleeper = await client.submit(agent.name, name="sleeper")
        events = await asyncio.wait_for(collect(client, agent.name, sleeper.turn_id), 60)
        assert events[-1].type == "run:complete" and events[-1].attempt >= 2
        later = await client.run(agent.name, name="later", timeout=60)
        assert later[-1].type == "run:complete"
        await wait_for(lambda: worker.remembered_turns == 0, 30, "finished turns forgotten")
    assert live_journal_keys(kafka_bootstrap_servers, agent.topics.journal) == set()
