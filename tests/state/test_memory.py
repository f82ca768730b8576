"""``ctx.memory`` on the real broker: writes ride the turn's transaction, other workers
see them after catch-up, reads are journaled, values have a size limit."""

from __future__ import annotations

import asyncio
import json
import signal
import uuid
from pathlib import Path
from typing import Any

from pyrula_stream import (
    AgentContext,
    KafkaAgentClient,
    ToolContext,
    WorkerOptions,
    kafka_agent,
    tool,
)
from pyrula_stream.kafka.config import new_consumer, reader_config
from pyrula_stream.kafka.consumers import read_key
from pyrula_stream.kafka.offsets import partitions_of, read_to_end
from pyrula_stream.kafka.partitioner import partition_for
from pyrula_stream.llm import FakeLLM, reply_text, reply_tool_call
from pyrula_stream.state.memory import (
    MemoryBackend,
    MemoryItem,
    MemoryItems,
    MemorySource,
    SqliteMemory,
    record_key,
)
from pyrula_stream.testing import (
    agent_topics_ready,
    read_topic,
    running_worker,
    unique_name,
    wait_for,
)
from pyrula_stream.wire.events import decode_event
from tests.state.test_threads import start_worker

QUICK_STOP = WorkerOptions(shutdown_grace=0.2)


def result(events: list[Any]) -> Any:
    assert events[-1].type == "run:complete", events[-1]
    return events[-1].data["result"]


async def test_a_put_on_one_worker_is_read_and_found_on_another(
    kafka_bootstrap_servers: str, client: KafkaAgentClient
) -> None:
    ns = ("tests", uuid.uuid4().hex)

    @kafka_agent(name=unique_name("mem-writer"), llm=FakeLLM([reply_text("x")]), partitions=1)
    async def writer(ctx: AgentContext, city: str) -> Any:
        await ctx.memory.put(ns, "home", {"city": city, "note": "prefers trains"})
        item = await ctx.memory.get(ns, "home")  # read-your-writes inside the turn
        return None if item is None else item.value

    @kafka_agent(name=unique_name("mem-reader"), llm=FakeLLM([reply_text("x")]), partitions=1)
    async def reader(ctx: AgentContext) -> Any:
        item = await ctx.memory.get(ns, "home")
        found = await ctx.memory.search(ns, "trains")
        listed = await ctx.memory.list(ns)
        return {
            "value": None if item is None else item.value,
            "by": None if item is None else item.written_by_run_id,
            "found": [(i.namespace[-1], i.key) for i in found],
            "listed": [i.key for i in listed],
        }

    async with (
        running_worker(writer, kafka_bootstrap_servers, QUICK_STOP),
        running_worker(reader, kafka_bootstrap_servers, QUICK_STOP),
    ):
        wrote = await client.run(writer.name, city="Lyon", timeout=60)
        assert result(wrote) == {"city": "Lyon", "note": "prefers trains"}
        seen: dict[str, Any] = {}

        async def visible() -> bool:  # eventual: another worker sees it after catch-up
            seen.update(result(await client.run(reader.name, timeout=60)))
            return seen["value"] is not None

        for _ in range(30):
            if await visible():
                break
            await asyncio.sleep(0.5)
    assert seen["value"] == {"city": "Lyon", "note": "prefers trains"}
    assert seen["by"] == wrote[0].turn_id
    assert seen["found"] == [[ns[-1], "home"]]  # JSON, as the journal holds it
    assert seen["listed"] == ["home"]


async def test_a_replay_reads_the_journaled_value_and_writes_once(
    kafka_bootstrap_servers: str, client: KafkaAgentClient
) -> None:
    ns = ("tests", uuid.uuid4().hex)
    gate = asyncio.Event()
    started: list[str] = []

    @tool(writes=True)
    async def wait_here(ctx: ToolContext) -> str:
        """Blocks until the test lets it go."""
        started.append(ctx.idempotency_key or "")
        await gate.wait()
        return "ok"

    @kafka_agent(
        name=unique_name("mem-replay"),
        llm=FakeLLM([reply_tool_call("wait_here"), reply_text("done")]),
        tools=[wait_here],
        partitions=1,
    )
    async def agent(ctx: AgentContext) -> Any:
        before = await ctx.memory.get(ns, "k")
        await ctx.memory.put(ns, "counter", {"n": 1})
        await ctx.llm.run([{"role": "user", "content": "go"}])
        return None if before is None else before.value

    async with running_worker(agent, kafka_bootstrap_servers, QUICK_STOP) as worker:
        assert worker._memory is not None
        await asyncio.to_thread(
            worker._memory.put, ns, "k", {"v": "old"}, source="user", written_by_run_id=None
        )
        await wait_for(lambda: worker._memory.get(ns, "k") is not None, 30, "the item is seen")
        handle = await client.submit(agent.name)
        await wait_for(lambda: len(started) == 1, 30, "the tool started")
        # Memory changes while the turn is parked; the replay must not see it.
        await asyncio.to_thread(
            worker._memory.put, ns, "k", {"v": "new"}, source="user", written_by_run_id=None
        )
    gate.set()
    async with running_worker(agent, kafka_bootstrap_servers, QUICK_STOP) as worker:
        events = [e async for e in client.stream(agent.name, handle.turn_id)]
        assert worker._memory is not None
        await wait_for(lambda: worker._memory.get(ns, "counter") is not None, 30, "counter")
    assert len(started) == 2  # the turn did rerun after the first worker stopped
    assert result(events) == {"v": "old"}
    # The put ran on both attempts of the body, but was journaled (and written) once.
    written = await asyncio.to_thread(
        read_key,
        kafka_bootstrap_servers,
        "pyrula.memory",
        record_key(ns, "counter"),
        client_id="test-memory",
    )
    assert len(written) == 1


async def test_a_value_past_the_limit_fails_naming_the_key_and_limit(
    kafka_bootstrap_servers: str, client: KafkaAgentClient
) -> None:
    @kafka_agent(name=unique_name("mem-big"), llm=FakeLLM([reply_text("x")]), partitions=1)
    async def agent(ctx: AgentContext) -> None:
        await ctx.memory.put(("tests",), "huge", {"blob": "x" * 300_000})

    async with running_worker(agent, kafka_bootstrap_servers, QUICK_STOP):
        events = await client.run(agent.name, timeout=60)
    assert events[-1].type == "run:error"
    message = events[-1].data["message"]
    assert "'huge'" in message and "262144-byte limit" in message


def test_the_local_view_searches_lists_and_deletes(tmp_path: Any) -> None:
    view = SqliteMemory(tmp_path / "m.sqlite")
    a = MemoryItem(("users", "u1"), "prefs", {"likes": "green tea"})
    b = MemoryItem(("users", "u2"), "prefs", {"likes": "coffee"})
    c = MemoryItem(("usersx",), "other", {"likes": "tea"})
    for item in (a, b, c):
        view.apply(item.namespace, item.key, item)
    assert [i.namespace for i in view.search(("users",), "tea")] == [("users", "u1")]
    assert [i.namespace for i in view.list(("users",))] == [("users", "u1"), ("users", "u2")]
    assert view.search(("users",), 'tea" OR') == [a]  # user text is never FTS syntax
    view.apply(a.namespace, a.key, None)
    assert view.get(a.namespace, a.key) is None
    assert view.search(("users",), "tea") == []
    view.close()


async def test_a_branch_refuses_a_new_memory_write(
    kafka_bootstrap_servers: str, client: KafkaAgentClient
) -> None:
    ns = ("tests", uuid.uuid4().hex)

    @kafka_agent(name=unique_name("mem-branch"), llm=FakeLLM([reply_text("x")]), keep_history=True)
    async def agent(ctx: AgentContext, n: int) -> str:
        await ctx.memory.put(ns, "k", {"n": n})
        return "wrote"

    async with running_worker(agent, kafka_bootstrap_servers, QUICK_STOP) as worker:
        original = await client.run(agent.name, n=1, timeout=60)
        assert result(original) == "wrote"
        branch = await client.branch(agent.name, original[0].turn_id, from_step=1, n=2)
        events = [e async for e in client.stream(agent.name, branch.turn_id)]
        memory = worker._memory
        assert memory is not None
        await wait_for(lambda: memory.get(ns, "k") is not None, 30, "the original's write")
        kept = memory.get(ns, "k")
    end = events[-1]
    assert end.type == "run:error" and end.data["code"] == "write_tool_blocked"
    assert end.data["detail"]["reason"] == "effect"
    assert end.data["detail"]["call"] == "ctx.memory.put"
    assert kept is not None and kept.value == {"n": 1}


class DictMemory:
    """A user's own ``MemoryBackend``: a dict (what a Redis or Postgres store would be)."""

    def __init__(self) -> None:
        self.items: dict[tuple[tuple[str, ...], str], MemoryItem] = {}
        self.puts = 0

    def put(
        self,
        namespace: tuple[str, ...],
        key: str,
        value: dict[str, Any],
        *,
        source: MemorySource,
        written_by_run_id: str | None,
    ) -> None:
        self.puts += 1
        self.items[(namespace, key)] = MemoryItem(namespace, key, value, source, written_by_run_id)

    def get(self, namespace: tuple[str, ...], key: str) -> MemoryItem | None:
        return self.items.get((namespace, key))

    def delete(self, namespace: tuple[str, ...], key: str) -> None:
        self.items.pop((namespace, key), None)

    def list(
        self, namespace_prefix: tuple[str, ...], *, key_prefix: str = "", limit: int = 100
    ) -> MemoryItems:
        return [
            i
            for (ns, k), i in sorted(self.items.items())
            if ns[: len(namespace_prefix)] == namespace_prefix and k.startswith(key_prefix)
        ][:limit]

    def search(
        self, namespace_prefix: tuple[str, ...], query: str, *, limit: int = 10
    ) -> MemoryItems:
        return [i for i in self.list(namespace_prefix) if query in str(i.value)][:limit]


async def test_a_plugged_in_backend_serves_ctx_memory(
    kafka_bootstrap_servers: str, client: KafkaAgentClient
) -> None:
    backend = DictMemory()
    assert isinstance(backend, MemoryBackend)

    @kafka_agent(name=unique_name("mem-plug"), llm=FakeLLM([reply_text("x")]), partitions=1)
    async def agent(ctx: AgentContext) -> Any:
        await ctx.memory.put(("u",), "a", {"tea": "green"}, source="user")
        found = await ctx.memory.search(("u",), "green")
        return [i.key for i in found]

    options = WorkerOptions(shutdown_grace=0.2, memory_backend=backend)
    async with running_worker(agent, kafka_bootstrap_servers, options):
        events = await client.run(agent.name, timeout=60)
    assert result(events) == ["a"]
    assert backend.puts == 1
    assert backend.items[(("u",), "a")].source == "user"


async def test_a_sigkill_after_a_puts_commit_neither_loses_nor_doubles_it(
    kafka_bootstrap_servers: str, client: KafkaAgentClient, tmp_path: Path
) -> None:
    name, ns = unique_name("memorizer"), uuid.uuid4().hex
    env = {"MEMORIZER_AGENT_NAME": name, "MEMORIZER_DIR": str(tmp_path)}
    (tmp_path / "hold").touch()
    spec = "tests.agents.memorizer:memorizer"
    first = start_worker(kafka_bootstrap_servers, spec, "mem-a", tmp_path, env)
    try:
        handle = await client.submit(name, ns=ns)
        await wait_for(lambda: (tmp_path / "parked").exists(), 60, "the turn parked")
    finally:
        first.kill()  # SIGKILL while the tool runs: the put was committed before it
    (tmp_path / "hold").unlink()
    second = start_worker(kafka_bootstrap_servers, spec, "mem-b", tmp_path, env)
    try:
        events = [e async for e in client.stream(name, handle.turn_id)]
    finally:
        second.stop(10)
    assert result(events) == {"v": 1}
    assert events[-1].attempt == 2
    written = await asyncio.to_thread(
        read_key,
        kafka_bootstrap_servers,
        "pyrula.memory",
        record_key(("tests", ns), "k"),
        client_id="test-memory",
    )
    assert len(written) == 1, "the rerun took the put from the journal"


async def all_events(client: KafkaAgentClient, agent: str, turn_id: str) -> list[Any]:
    return [e async for e in client.stream(agent, turn_id)]


def memory_log(bootstrap: str, key: str, isolation: str) -> list[dict[str, Any]]:
    """The values of ``key`` in ``pyrula.memory`` now, oldest first: those committed
    (``read_committed``), or every one in the log, aborted ones too (``read_uncommitted``)."""
    conf = reader_config(bootstrap, client_id=unique_name("memory-log"))
    consumer = new_consumer({**conf, "isolation.level": isolation})
    try:
        partition = partition_for(key.encode(), len(partitions_of(consumer, "pyrula.memory")))
        return [
            json.loads(r.value)
            for r in read_to_end(consumer, "pyrula.memory", [partition], timeout_s=60)
            if r.key == key and r.value is not None
        ]
    finally:
        consumer.close()


async def test_a_sigkill_between_a_put_and_its_commit_neither_loses_nor_doubles_it(
    kafka_bootstrap_servers: str, client: KafkaAgentClient, tmp_path: Path
) -> None:
    bootstrap = kafka_bootstrap_servers
    name, ns = unique_name("uncommitted-put"), uuid.uuid4().hex
    key = record_key(("tests", ns), "k")
    spec, env = "tests.agents.uncommitted_put:uncommitted_put", {"UNCOMMITTED_PUT_AGENT_NAME": name}
    holding = {**env, "UNCOMMITTED_PUT_DIR": str(tmp_path)}

    def log(isolation: str) -> list[dict[str, Any]]:
        return memory_log(bootstrap, key, isolation)

    first = start_worker(bootstrap, spec, "put-1", tmp_path, holding, "--static-membership")
    try:
        await agent_topics_ready(bootstrap, name)
        handle = await client.submit(name, ns=ns)
        # The worker stops inside the transaction that journals the put, before its commit.
        await wait_for((tmp_path / "in-transaction").exists, 60, "the put's transaction")
        for _ in range(200):  # its records reach the log, still uncommitted
            sent = await asyncio.to_thread(log, "read_uncommitted")
            if sent:
                break
            await asyncio.sleep(0.1)
        assert [r["value"] for r in sent] == [{"v": 1, "pid": first.pid}]
        assert await asyncio.to_thread(log, "read_committed") == []
    finally:
        first.kill()  # SIGKILL with the put's transaction open
    assert first.exit_codes == [-signal.SIGKILL]
    # The same worker id, as a restarted pod has: its producer aborts the open transaction.
    second = start_worker(bootstrap, spec, "put-1", tmp_path, env, "--static-membership")
    try:
        events = await asyncio.wait_for(all_events(client, name, handle.turn_id), 120)
    finally:
        second.stop(10)
    written = {"v": 1, "pid": second.pid}
    assert result(events) == written

    ends = [
        event.type
        for _, value, headers in await asyncio.to_thread(
            read_topic, bootstrap, f"pyrula.{name}.events"
        )
        if value is not None
        for event in [decode_event(value, headers)]
        if event.turn_id == handle.turn_id and event.is_terminal
    ]
    assert ends == ["run:complete"]  # the turn completed once
    committed = await asyncio.to_thread(log, "read_committed")
    assert [r["value"] for r in committed] == [written]  # one committed record: not 0, not 2
    assert committed[0]["written_by_run_id"] == handle.turn_id
    # Both attempts' records are in the log; the killed one's transaction was aborted.
    assert [r["value"] for r in await asyncio.to_thread(log, "read_uncommitted")] == [
        {"v": 1, "pid": first.pid},
        written,
    ]

    @kafka_agent(name=unique_name("mem-get"), llm=FakeLLM([reply_text("x")]), partitions=1)
    async def reader(ctx: AgentContext) -> Any:
        item = await ctx.memory.get(("tests", ns), "k")
        return None if item is None else [item.value, item.written_by_run_id]

    async with running_worker(reader, bootstrap, QUICK_STOP):  # a fresh worker's view
        assert result(await client.run(reader.name, timeout=60)) == [written, handle.turn_id]
