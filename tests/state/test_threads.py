"""Threads on the real broker: a turn sees its thread's earlier turns on any worker; the
thread record rides the terminal transaction; trimming, delete, failed turns."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from pyrula_stream import (
    AgentContext,
    AgentLimits,
    Event,
    KafkaAgentClient,
    ToolContext,
    WorkerOptions,
    kafka_agent,
    tool,
)
from pyrula_stream.chaos.processes import Managed, child_env, free_port
from pyrula_stream.context.compaction import SUMMARY_REQUEST, summary_messages
from pyrula_stream.errors import ErrorCode, ThreadDeleteFailed, UnknownTopicError, UserError
from pyrula_stream.kafka.admin import apply_topics
from pyrula_stream.kafka.consumers import reader_consumer
from pyrula_stream.kafka.table import PartitionedTable
from pyrula_stream.llm import FakeLLM, ModelResponse, ToolDefinition, reply_text, reply_tool_call
from pyrula_stream.state.threads import PartitionThreads
from pyrula_stream.testing import read_topic, running_worker, unique_name, wait_for
from pyrula_stream.wire.events import decode_event
from tests.agents.threaded import echo_users, user_texts

QUICK_STOP = WorkerOptions(shutdown_grace=0.2)


def result(events: list[Event]) -> Any:
    assert events[-1].type == "run:complete", events[-1]
    return events[-1].data["result"]


def worker_of(events: list[Event]) -> str:
    return str(next(e for e in events if e.type == "run:start").data["worker"])


def cli(bootstrap: str, action: str, agent: str, thread_id: str) -> str:
    """``pyrula-stream thread ACTION AGENT THREAD_ID``; its standard output."""
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pyrula_stream.cli",
            "thread",
            action,
            agent,
            thread_id,
            "--bootstrap-servers",
            bootstrap,
        ],
        env=child_env({}),
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return done.stdout


def start_worker(
    bootstrap: str, spec: str, worker_id: str, log_dir: Path, env: dict[str, str], *flags: str
) -> Managed:
    """A ``pyrula-stream worker`` subprocess (with extra command-line ``flags``), once its
    /readyz answers."""
    port = free_port()
    argv = [
        sys.executable,
        "-m",
        "pyrula_stream.cli",
        "worker",
        spec,
        "--bootstrap-servers",
        bootstrap,
        "--worker-id",
        worker_id,
        "--health-port",
        str(port),
        *flags,
    ]
    worker = Managed(worker_id, argv, child_env(env), log_dir / f"{worker_id}.log")
    worker.start()
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        assert worker.alive(), (log_dir / f"{worker_id}.log").read_text()
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as r:
                if r.status == 200:
                    return worker
        except OSError:
            pass
        time.sleep(0.2)
    worker.kill()
    raise TimeoutError(f"worker {worker_id} was not ready in 90s")


async def test_a_thread_continues_on_another_worker_after_its_owner_is_killed(
    kafka_bootstrap_servers: str, client: KafkaAgentClient, tmp_path: Path
) -> None:
    name = unique_name("thread")
    thread = "t-42"
    spec, env = "tests.agents.threaded:threaded", {"THREADED_AGENT_NAME": name}
    first = start_worker(kafka_bootstrap_servers, spec, "thread-a", tmp_path, env)
    try:
        one = await client.run(name, thread_id=thread, text="one", timeout=90)
    finally:
        first.kill()  # SIGKILL: the owner of turn 1 is gone before turn 2
    second = start_worker(kafka_bootstrap_servers, spec, "thread-b", tmp_path, env)
    try:
        two = await client.run(name, thread_id=thread, text="two", timeout=90)
    finally:
        second.stop(10)

    seen: list[list[dict[str, Any]]] = []

    def model(messages: list[dict[str, Any]], tools: list[ToolDefinition]) -> ModelResponse:
        seen.append(list(messages))  # the loop appends to the same list later
        return echo_users(messages, tools)

    @kafka_agent(name=name, llm=FakeLLM(model), partitions=2)
    async def threaded(ctx: AgentContext, text: str) -> str:
        assert ctx.thread is not None and ctx.thread.thread_id == thread
        return await ctx.llm.run([{"role": "user", "content": text}])

    async with running_worker(threaded, kafka_bootstrap_servers, QUICK_STOP, all_partitions=True):
        three = await client.run(name, thread_id=thread, text="three", timeout=90)

    assert result(one) == "one"
    assert result(two) == "one|two"
    assert result(three) == "one|two|three"
    assert len({worker_of(one), worker_of(two), worker_of(three)}) == 3
    # Turn 3's model request: turns 1 and 2's messages in order, then its own.
    assert seen[0] == [
        {"role": "user", "content": "one"},
        {"role": "assistant", "content": [{"type": "text", "text": "one"}]},
        {"role": "user", "content": "two"},
        {"role": "assistant", "content": [{"type": "text", "text": "one|two"}]},
        {"role": "user", "content": "three"},
    ]
    stored = await client.get_thread(name, thread)
    assert [t.n for t in stored.turns] == [1, 2, 3]
    assert [t.turn_id for t in stored.turns] == [one[0].turn_id, two[0].turn_id, three[0].turn_id]
    assert stored.turns[2].outcome == {"status": "completed", "result": "one|two|three"}


async def test_a_failed_turn_leaves_the_thread_unchanged_and_delete_empties_it(
    kafka_bootstrap_servers: str, client: KafkaAgentClient
) -> None:
    @kafka_agent(name=unique_name("thread-fail"), llm=FakeLLM(echo_users), partitions=1)
    async def agent(ctx: AgentContext, text: str, fail: bool = False) -> str:
        answer = await ctx.llm.run([{"role": "user", "content": text}])
        if fail:
            raise ValueError("the body failed after the model answered")
        return answer

    async with running_worker(agent, kafka_bootstrap_servers, QUICK_STOP):
        await client.run(agent.name, thread_id="t", text="one", timeout=60)
        failed = await client.run(agent.name, thread_id="t", text="lost", fail=True, timeout=60)
        after = await client.run(agent.name, thread_id="t", text="two", timeout=60)
        assert failed[-1].type == "run:error"
        assert result(after) == "one|two"
        assert [len(t.messages) for t in (await client.get_thread(agent.name, "t")).turns] == [
            2,
            2,
        ]

        assert await client.delete_thread(agent.name, "t", timeout=60) == 2
        assert (await client.get_thread(agent.name, "t")).turns == ()
        fresh = await client.run(agent.name, thread_id="t", text="again", timeout=60)
        assert result(fresh) == "again"
    stored = await client.get_thread(agent.name, "t")
    assert [(t.n, t.turn_id) for t in stored.turns] == [(1, fresh[0].turn_id)]


async def test_max_thread_turns_keeps_the_newest_turns(
    kafka_bootstrap_servers: str, client: KafkaAgentClient
) -> None:
    @kafka_agent(
        name=unique_name("thread-trim"), llm=FakeLLM(echo_users), partitions=1, max_thread_turns=2
    )
    async def agent(ctx: AgentContext, text: str) -> str:
        return await ctx.llm.run([{"role": "user", "content": text}])

    async with running_worker(agent, kafka_bootstrap_servers, QUICK_STOP):
        for text in ("one", "two", "three"):
            last = await client.run(agent.name, thread_id="t", text=text, timeout=60)
        assert result(last) == "one|two|three"  # trimmed when turn 3 completed
        stored = await client.get_thread(agent.name, "t")
        assert [t.n for t in stored.turns] == [2, 3]
        shown = await asyncio.to_thread(cli, kafka_bootstrap_servers, "show", agent.name, "t")
        assert [t["n"] for t in json.loads(shown)["turns"]] == [2, 3]
    # A restored worker sees the trimmed thread too.
    async with running_worker(agent, kafka_bootstrap_servers, QUICK_STOP):
        four = await client.run(agent.name, thread_id="t", text="four", timeout=60)
        deleted = await asyncio.to_thread(cli, kafka_bootstrap_servers, "delete", agent.name, "t")
    assert result(four) == "two|three|four"
    assert deleted.strip() == "deleted thread t: 2 turns"  # turns 3 and 4: 2 was trimmed


async def test_history_false_sends_only_the_bodys_messages(
    kafka_bootstrap_servers: str, client: KafkaAgentClient
) -> None:
    @kafka_agent(name=unique_name("thread-nohist"), llm=FakeLLM(echo_users), partitions=1)
    async def agent(ctx: AgentContext, text: str) -> str:
        return await ctx.llm.run([{"role": "user", "content": text}], history=False)

    async with running_worker(agent, kafka_bootstrap_servers, QUICK_STOP):
        await client.run(agent.name, thread_id="t", text="one", timeout=60)
        two = await client.run(agent.name, thread_id="t", text="two", timeout=60)
    assert result(two) == "two"
    assert len((await client.get_thread(agent.name, "t")).turns) == 2


def test_max_thread_turns_must_not_be_negative() -> None:
    from pyrula_stream.errors import AgentRegistrationError

    with pytest.raises(AgentRegistrationError, match="max_thread_turns must be >= 0"):

        @kafka_agent(name="neg", llm=FakeLLM([reply_text("x")]), max_thread_turns=-1)
        async def agent(ctx: AgentContext) -> str:
            return ""


def test_user_texts_reads_plain_user_messages() -> None:
    assert user_texts([{"role": "user", "content": "a"}, {"role": "user", "content": []}]) == ["a"]


async def test_compaction_is_journaled_once_and_later_turns_start_from_it(
    kafka_bootstrap_servers: str, client: KafkaAgentClient
) -> None:
    summaries: list[int] = []
    gate = asyncio.Event()
    parked: list[str] = []

    def compactor(history: list[dict[str, Any]]) -> str:
        summaries.append(len(history))
        return f"SUMMARY({len(user_texts(history))} questions)"

    @tool(writes=True)
    async def park(ctx: ToolContext) -> str:
        """Blocks the first time until the test lets it go."""
        parked.append(ctx.idempotency_key or "")
        await gate.wait()
        return "parked"

    def model(messages: list[dict[str, Any]], tools: list[ToolDefinition]) -> ModelResponse:
        if messages[-1]["content"] == "park":
            return reply_tool_call("park")
        return echo_users(messages, tools)

    limits = AgentLimits(context_window=1000, compaction_fraction=0.5, history_compactor=compactor)

    @kafka_agent(
        name=unique_name("thread-compact"),
        llm=FakeLLM(model),
        tools=[park],
        partitions=1,
        limits=limits,
    )
    async def agent(ctx: AgentContext, text: str) -> str:
        return await ctx.llm.run([{"role": "user", "content": text}])

    long = "x" * 2400  # one turn of this is past half the 1000-token window
    async with running_worker(agent, kafka_bootstrap_servers, QUICK_STOP):
        await client.run(agent.name, thread_id="t", text=long, timeout=60)
        assert summaries == []  # no history before the first turn
        handle = await client.submit(agent.name, thread_id="t", text="park")
        await wait_for(lambda: len(parked) == 1, 30, "the compacting turn parked")
    assert summaries == [2]  # compacted before its first model call, then journaled
    gate.set()
    async with running_worker(agent, kafka_bootstrap_servers, QUICK_STOP):
        parked_turn = [e async for e in client.stream(agent.name, handle.turn_id)]
        assert summaries == [2], "the replay took the compaction from the journal"
        after = await client.run(agent.name, thread_id="t", text="next", timeout=60)
    assert len(parked) == 2 and result(parked_turn)
    stored = await client.get_thread(agent.name, "t")
    assert [t.n for t in stored.turns] == [2, 3]  # turn 1 was summarized away
    assert stored.turns[0].base is not None
    assert stored.messages[0]["content"].endswith("SUMMARY(1 questions)")
    # Turn 3 started from the summary, then turn 2; it was short enough not to compact again.
    assert result(after) == "Summary of our conversation so far:\nSUMMARY(1 questions)|park|next"


async def test_a_turn_too_large_for_its_thread_record_fails_and_adds_nothing(
    kafka_bootstrap_servers: str, client: KafkaAgentClient
) -> None:
    @kafka_agent(name=unique_name("thread-big"), llm=FakeLLM([reply_text("ok")]), partitions=1)
    async def agent(ctx: AgentContext, size: int) -> str:
        return await ctx.llm.run([{"role": "user", "content": "y" * size}])

    options = WorkerOptions(shutdown_grace=0.2, max_record_bytes=20_000)
    async with running_worker(agent, kafka_bootstrap_servers, options):
        await client.run(agent.name, thread_id="t", size=10, timeout=60)
        big = await client.run(agent.name, thread_id="t", size=50_000, timeout=60)
        after = await client.run(agent.name, thread_id="t", size=20, timeout=60)
    assert big[-1].type == "run:error"
    assert "20000-byte limit" in big[-1].data["message"]
    assert result(after) == "ok"
    stored = await client.get_thread(agent.name, "t")
    assert [len(t.messages[0]["content"]) for t in stored.turns] == [10, 20]


async def test_without_a_compactor_the_agents_model_writes_the_summary(
    kafka_bootstrap_servers: str, client: KafkaAgentClient
) -> None:
    def model(messages: list[dict[str, Any]], tools: list[ToolDefinition]) -> ModelResponse:
        if messages[-1]["content"] == SUMMARY_REQUEST:
            return reply_text(f"the user sent {len(user_texts(messages)) - 1} long message")
        return reply_text(f"{len(messages)} messages")

    limits = AgentLimits(context_window=1000, compaction_fraction=0.5)

    @kafka_agent(name=unique_name("thread-sum"), llm=FakeLLM(model), partitions=1, limits=limits)
    async def agent(ctx: AgentContext, text: str) -> str:
        return await ctx.llm.run([{"role": "user", "content": text}])

    async with running_worker(agent, kafka_bootstrap_servers, QUICK_STOP):
        await client.run(agent.name, thread_id="t", text="x" * 2400, timeout=60)
        second = await client.run(agent.name, thread_id="t", text="again", timeout=60)
    assert result(second) == "3 messages"  # the summary pair, then "again"
    stored = await client.get_thread(agent.name, "t")
    assert stored.turns[-1].base == summary_messages("the user sent 1 long message")


async def test_a_replay_whose_history_changed_fails_with_replay_input_changed(
    kafka_bootstrap_servers: str, client: KafkaAgentClient
) -> None:
    gate = asyncio.Event()
    parked: list[str] = []

    @tool(writes=True)
    async def park(ctx: ToolContext) -> str:
        """Blocks until the test lets it go."""
        parked.append(ctx.idempotency_key or "")
        await gate.wait()
        return "parked"

    def model(messages: list[dict[str, Any]], tools: list[ToolDefinition]) -> ModelResponse:
        if messages[-1]["content"] == "park":
            return reply_tool_call("park")
        return echo_users(messages, tools)

    name = unique_name("thread-replay")

    def bind(history: bool) -> Any:
        @kafka_agent(name=name, llm=FakeLLM(model), tools=[park], partitions=1)
        async def agent(ctx: AgentContext, text: str) -> str:
            return await ctx.llm.run([{"role": "user", "content": text}], history=history)

        return agent

    with_history = bind(True)
    async with running_worker(with_history, kafka_bootstrap_servers, QUICK_STOP):
        await client.run(name, thread_id="t", text="one", timeout=60)
        handle = await client.submit(name, thread_id="t", text="park")
        await wait_for(lambda: len(parked) == 1, 30, "the turn parked")
    gate.set()
    # The rerun sends the model a request without the thread's history: not the recorded one.
    async with running_worker(bind(False), kafka_bootstrap_servers, QUICK_STOP):
        events = [e async for e in client.stream(name, handle.turn_id)]
    assert events[-1].type == "run:error"
    assert events[-1].data["code"] == "replay_input_changed"
    assert "messages" in events[-1].data["message"]


def cli_fails(bootstrap: str, *args: str) -> tuple[int, str, str]:
    """``pyrula-stream ARGS`` expected to fail: its exit code, stdout and stderr."""
    done = subprocess.run(
        [sys.executable, "-m", "pyrula_stream.cli", *args, "--bootstrap-servers", bootstrap],
        env=child_env({}),
        capture_output=True,
        text=True,
        timeout=120,
    )
    return done.returncode, done.stdout, done.stderr


async def test_an_agent_without_a_threads_topic_gets_a_clear_error_from_show_and_delete(
    kafka_bootstrap_servers: str, client: KafkaAgentClient
) -> None:
    @kafka_agent(name=unique_name("no-threads"), llm=FakeLLM(echo_users), partitions=1)
    async def agent(ctx: AgentContext) -> None: ...

    # Topics made before threads existed: the turns topic is there, the threads one is not.
    threads = f"pyrula.{agent.name}.threads"
    specs = [s for s in agent.topic_specs() if s.name != threads]
    await asyncio.to_thread(apply_topics, kafka_bootstrap_servers, specs)
    expected = (
        f"no topic {threads}: start a worker for '{agent.name}' or run "
        f"`pyrula-stream topics apply {agent.name}`"
    )
    with pytest.raises(UnknownTopicError) as caught:
        await client.delete_thread(agent.name, "t-1", timeout=60)
    assert str(caught.value) == expected
    with pytest.raises(UnknownTopicError, match=f"^no topic {threads}"):
        await client.get_thread(agent.name, "t-1")  # not an empty thread: the topic is missing
    code, out, err = await asyncio.to_thread(
        cli_fails, kafka_bootstrap_servers, "thread", "show", agent.name, "t-1"
    )
    assert (code, out, err) == (2, "", f"error: {expected}\n")
    with pytest.raises(UserError, match="thread_id must be a non-empty string"):
        await client.delete_thread(agent.name, "")  # else it would run the body as a turn
    code, out, err = await asyncio.to_thread(
        cli_fails, kafka_bootstrap_servers, "thread", "delete", agent.name, "t-1"
    )
    assert (code, out, err) == (2, "", f"error: {expected}\n")
    turns = await asyncio.to_thread(
        read_topic, kafka_bootstrap_servers, f"pyrula.{agent.name}.turns"
    )
    assert turns == []  # refused before anything was queued


async def test_a_delete_no_worker_runs_in_time_fails_clearly_and_runs_once_one_starts(
    kafka_bootstrap_servers: str, client: KafkaAgentClient
) -> None:
    @kafka_agent(name=unique_name("thread-late"), llm=FakeLLM(echo_users), partitions=1)
    async def agent(ctx: AgentContext, text: str) -> str:
        return await ctx.llm.run([{"role": "user", "content": text}])

    await asyncio.to_thread(apply_topics, kafka_bootstrap_servers, agent.topic_specs())
    with pytest.raises(ThreadDeleteFailed) as caught:  # no worker is running
        await client.delete_thread(agent.name, "t-1", timeout=3)
    failure = caught.value
    assert failure.code == ErrorCode.WAIT_TIMEOUT and failure.retriable
    assert str(failure) == (
        f"deleting thread 't-1' of agent '{agent.name}' timed out: no worker finished it "
        f"within 3s (is a worker for '{agent.name}' running?); the delete stays queued in "
        f"pyrula.{agent.name}.turns and runs when a worker takes it"
    )
    code, out, err = await asyncio.to_thread(
        cli_fails,
        kafka_bootstrap_servers,
        "thread",
        "delete",
        agent.name,
        "t-1",
        "--timeout",
        "3",
    )
    assert (code, out) == (1, "")
    assert err.splitlines() == [f"error: {failure}"]
    # As it says: both queued deletes run once a worker starts.
    events = f"pyrula.{agent.name}.events"

    def deletes_done() -> list[Any]:
        return [
            e.data["result"]
            for _, value, headers in read_topic(kafka_bootstrap_servers, events)
            if value is not None
            for e in [decode_event(value, headers)]
            if e.type == "run:complete"
        ]

    async with running_worker(agent, kafka_bootstrap_servers, QUICK_STOP):
        for _ in range(300):
            done = await asyncio.to_thread(deletes_done)
            if len(done) >= 2:
                break
            await asyncio.sleep(0.1)
    assert done == [{"deleted_turns": 0}, {"deleted_turns": 0}]


def _restored_threads(bootstrap: str, topic: str) -> PartitionThreads:
    """Partition 0 of ``topic`` folded in as a worker's takeover folds it."""
    reader = reader_consumer(bootstrap, client_id=unique_name("restore"))
    try:
        threads = PartitionThreads()
        threads.restore(PartitionedTable(topic).restore(reader, 0))
        return threads
    finally:
        reader.close()


async def test_a_takeover_decodes_a_thread_only_when_it_runs_again(
    kafka_bootstrap_servers: str, client: KafkaAgentClient
) -> None:
    @kafka_agent(name=unique_name("thread-lazy"), llm=FakeLLM(echo_users), partitions=1)
    async def agent(ctx: AgentContext, text: str) -> str:
        return await ctx.llm.run([{"role": "user", "content": text}])

    async with running_worker(agent, kafka_bootstrap_servers, QUICK_STOP):
        for thread_id, text in [("a", "one"), ("b", "two"), ("a", "three"), ("b", "four")]:
            await client.run(agent.name, thread_id=thread_id, text=text, timeout=60)
    stored = await client.get_thread(agent.name, "a")

    threads = await asyncio.to_thread(
        _restored_threads, kafka_bootstrap_servers, agent.topics.threads
    )
    assert threads.live_threads == 2
    assert threads.decoded_records == 0  # held as they came, none decoded at takeover
    a = threads.handle("a")
    assert threads.decoded_records == 2  # thread a's two turns, not b's
    assert a.turns == stored.turns and a.next_turn == 3
    assert user_texts(a.messages) == ["one", "three"]
    assert threads.handle("a") == a and threads.decoded_records == 2  # decoded once

    # A worker that takes the partition over gives the next turn the same history.
    async with running_worker(agent, kafka_bootstrap_servers, QUICK_STOP):
        after = await client.run(agent.name, thread_id="a", text="five", timeout=60)
    assert result(after) == "one|three|five"


def test_an_unreadable_turn_record_is_skipped_when_its_thread_is_read() -> None:
    threads = PartitionThreads()
    threads.apply("a/head", json.dumps({"thread_id": "a", "next": 3}).encode())
    threads.apply("a/1", b"{not json")
    good = {"n": 2, "turn_id": "t2", "messages": [], "outcome": {}, "ts_ms": 0}
    threads.apply("a/2", json.dumps(good).encode())
    assert threads.skipped_records == 0
    handle = threads.handle("a")
    assert [t.n for t in handle.turns] == [2]
    assert threads.skipped_records == 1 and threads.decoded_records == 1
