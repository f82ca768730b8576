"""``/metrics`` on the worker's health port, scraped while turns run and after, on the real
broker: the counters match the events actually committed and the lag drains to 0."""

from __future__ import annotations

import asyncio
import secrets
from collections import Counter
from collections.abc import Callable
from functools import partial

import httpx
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ResourceType,
)
from prometheus_client.parser import text_string_to_metric_families

from pyrula_stream import (
    AgentContext,
    KafkaAgentClient,
    ToolContext,
    WorkerOptions,
    kafka_agent,
    tool,
)
from pyrula_stream.agent.definition import KafkaAgent
from pyrula_stream.chaos.processes import free_port
from pyrula_stream.kafka.consumers import read_topic
from pyrula_stream.kafka.io import RecordProducer
from pyrula_stream.kafka.transactions import BatchWriter
from pyrula_stream.llm import FakeLLM, reply_tool_call
from pyrula_stream.testing import running_worker, unique_name, wait_for
from pyrula_stream.wire import serde
from pyrula_stream.wire.events import decode_event
from pyrula_stream.wire.records import OutRecord, content_type_header
from pyrula_stream.wire.serde import TurnRequest

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


async def scrape(http: httpx.AsyncClient, port: int) -> Samples:
    response = await http.get(f"http://127.0.0.1:{port}/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    return parse(response.text)


def parse(text: str) -> Samples:
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    """The sum over the samples of ``name`` whose labels include ``labels``."""
    wanted = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and wanted <= ls)


def lags(samples: Samples, topic: str) -> dict[str, float]:
    return {
        dict(ls)["partition"]: v
        for (n, ls), v in samples.items()
        if n == "pyrula_consumer_lag" and dict(ls)["topic"] == topic
    }


async def test_metrics_count_what_was_committed_and_lag_drains(
    kafka_bootstrap_servers: str, client: KafkaAgentClient
) -> None:
    gate = asyncio.Event()
    entered: list[str] = []

    @tool(read_only=True)
    async def lookup(ctx: ToolContext, key: str) -> str:
        """Waits for the test's go-ahead, so the turns are in flight when it scrapes."""
        entered.append(key)
        await gate.wait()
        return f"value of {key}"

    @kafka_agent(
        name=unique_name("metrics"),
        llm=FakeLLM([reply_tool_call("lookup", key="k"), "done"]),
        tools=[lookup],
        partitions=2,
    )
    async def agent(ctx: AgentContext, fail: bool) -> str:
        answer = await ctx.llm.run([{"role": "user", "content": "look it up"}])
        if fail:
            raise ValueError("this turn fails on purpose")
        return answer

    port = free_port()
    options = WorkerOptions(
        health_port=port, consumer_config={"statistics.interval.ms": 200}, shutdown_grace=1.0
    )
    turns_topic = agent.topics.turns
    async with (
        running_worker(agent, kafka_bootstrap_servers, options, all_partitions=True) as worker,
        httpx.AsyncClient() as http,
    ):
        handles = [await client.submit(agent.name, fail=i % 3 == 0) for i in range(6)]
        producer = RecordProducer(kafka_bootstrap_servers)
        try:  # one record that is no turn request: dead-lettered, counted by reason
            await producer.send(turns_topic, b"bad", b"\x00\x01garbage")
        finally:
            await asyncio.to_thread(producer.close)

        # During the run: every turn is held in its tool, none has ended.
        await wait_for(lambda: len(entered) == 6, 60, "every turn reached its tool")
        during = await scrape(http, port)
        assert value(during, "pyrula_turns_in_flight") == 6
        assert value(during, "pyrula_turns_total") == 0
        assert value(during, "pyrula_model_calls_total", outcome="ok") == 6
        await scrape_until(
            http, port, lambda m: sum(lags(m, turns_topic).values()) > 0, "lag above 0"
        )

        gate.set()
        for handle in handles:
            events = [e async for e in client.stream(agent.name, handle.turn_id)]
            assert events[-1].is_terminal
        after = await scrape_until(
            http,
            port,
            lambda m: (
                len(lags(m, turns_topic)) == 2
                and sum(lags(m, turns_topic).values()) == 0
                and value(m, "pyrula_turns_total") == len(handles)
            ),
            "lag of both partitions back to 0 and every turn counted",
        )

    committed = [
        decode_event(r.value, r.headers)
        for r in await asyncio.to_thread(read_topic, kafka_bootstrap_servers, agent.topics.events)
        if r.value is not None
    ]
    types = Counter(e.type for e in committed)
    codes = Counter(e.data["code"] for e in committed if e.type == "run:error")
    assert types["run:complete"] == 4 and types["run:error"] == 2
    assert (
        value(after, "pyrula_turns_total", agent=agent.name, outcome="completed")
        == (types["run:complete"])
    )
    assert (
        value(after, "pyrula_turns_total", agent=agent.name, outcome="failed")
        == (types["run:error"])
    )
    assert value(after, "pyrula_turn_failures_total", code="agent_error") == codes["agent_error"]
    for outcome, terminal in (("completed", "run:complete"), ("failed", "run:error")):
        count = value(after, "pyrula_turn_duration_seconds_count", outcome=outcome)
        assert count == types[terminal]
        assert value(after, "pyrula_turn_duration_seconds_sum", outcome=outcome) > 0
    assert value(after, "pyrula_turns_started_total", resumed="false") == 6
    assert value(after, "pyrula_turns_in_flight") == 0
    assert (
        value(after, "pyrula_model_calls_total", provider="fake", model="fake")
        == (types["llm:complete"])
    )
    assert (
        value(after, "pyrula_tool_calls_total", tool="lookup", status="ok")
        == (types["tool:result"])
    )
    assert value(after, "pyrula_model_tokens_total", kind="output") > 0
    assert value(after, "pyrula_tool_call_duration_seconds_count", tool="lookup") == 6
    assert value(after, "pyrula_commit_duration_seconds_count") >= 1
    assert value(after, "pyrula_commit_batch_records_sum") >= len(committed)
    # What the worker says it journaled is what the journal topic holds, record for record.
    final = parse(worker.metrics.exposition().decode())
    journal = await asyncio.to_thread(read_topic, kafka_bootstrap_servers, agent.topics.journal)
    assert value(final, "pyrula_journal_records_total") == len(journal) > 0
    assert value(final, "pyrula_journal_bytes_total") == sum(
        len(r.key.encode())
        + len(r.value or b"")
        + sum(len(k.encode()) + len(v.encode()) for k, v in r.headers.items())
        for r in journal
    )
    assert value(after, "pyrula_restore_duration_seconds_count") == 2  # one per partition
    assert value(after, "pyrula_transaction_aborts_total") == 0
    dead = await asyncio.to_thread(read_topic, kafka_bootstrap_servers, agent.topics.dlq)
    assert len(dead) == 1
    assert value(after, "pyrula_dead_letters_total", reason="invalid_request") == len(dead)
    assert set(lags(after, turns_topic)) == {"0", "1"}


async def scrape_until(
    http: httpx.AsyncClient, port: int, ok: Callable[[Samples], bool], what: str
) -> Samples:
    """Scrape until ``ok`` holds (the counters move as commits land); fail naming ``what``."""
    deadline = asyncio.get_running_loop().time() + 60
    while True:
        samples = await scrape(http, port)
        if ok(samples):
            return samples
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"{what} never held; last scrape: {sorted(samples.items())}")
        await asyncio.sleep(0.1)


async def test_metrics_of_two_workers_in_one_process_do_not_collide(
    kafka_bootstrap_servers: str,
) -> None:
    def make() -> KafkaAgent:
        @kafka_agent(name=unique_name("registry"), llm=FakeLLM(["ok"]), partitions=1)
        async def agent(ctx: AgentContext) -> str:
            return "ok"

        return agent

    first, second = make(), make()
    ports = free_port(), free_port()
    async with (
        running_worker(first, kafka_bootstrap_servers, WorkerOptions(health_port=ports[0])),
        running_worker(second, kafka_bootstrap_servers, WorkerOptions(health_port=ports[1])),
        httpx.AsyncClient() as http,
    ):
        await client_run(kafka_bootstrap_servers, second.name)
        two = await scrape_until(
            http, ports[1], lambda m: value(m, "pyrula_turns_total") == 1, "the turn counted"
        )
        one = await scrape(http, ports[0])
    assert value(two, "pyrula_turns_total", agent=second.name, outcome="completed") == 1
    assert value(one, "pyrula_turns_total", outcome="completed") == 0
    assert {dict(ls).get("agent") for _, ls in one} <= {first.name, None}


async def client_run(bootstrap: str, agent: str) -> None:
    async with KafkaAgentClient(bootstrap) as c:
        events = await c.run(agent, timeout=60)
    assert events[-1].type == "run:complete"


async def test_lag_reaches_zero_past_transaction_markers(
    kafka_bootstrap_servers: str, client: KafkaAgentClient
) -> None:
    """Requests produced in a transaction (as agent-to-agent calls are) leave a marker
    after the last record: drained, the lag is still 0, not stuck at 1."""

    @kafka_agent(name=unique_name("txnlag"), llm=FakeLLM(["ok"]), partitions=1)
    async def agent(ctx: AgentContext) -> str:
        return "ok"

    port = free_port()
    options = WorkerOptions(health_port=port, consumer_config={"statistics.interval.ms": 200})
    request = TurnRequest(unique_name("turn"), agent.name, {})
    record = OutRecord(
        agent.topics.turns,
        request.key.encode(),
        serde.encode("turn_request", request),
        [content_type_header("turn_request")],
    )
    writer = BatchWriter(kafka_bootstrap_servers, transactional_id=unique_name("submitter"))
    async with (
        running_worker(agent, kafka_bootstrap_servers, options),
        httpx.AsyncClient() as http,
    ):
        try:
            await asyncio.to_thread(writer.start)
            await asyncio.to_thread(writer.write, [record], {}, None, None)
        finally:
            await asyncio.to_thread(writer.close)
        events = [e async for e in client.stream(agent.name, request.turn_id)]
        assert events[-1].type == "run:complete"
        after = await scrape_until(
            http,
            port,
            lambda m: (
                lags(m, agent.topics.turns) == {"0": 0} and value(m, "pyrula_turns_total") == 1
            ),
            "lag of the drained partition back to 0 and the turn counted",
        )
    assert value(after, "pyrula_turns_total", outcome="completed") == 1


def set_max_message_bytes(bootstrap: str, topic: str, value: str | None) -> None:
    """Set (or, with ``None``, remove) a topic's ``max.message.bytes`` override."""
    op = AlterConfigOpType.SET if value is not None else AlterConfigOpType.DELETE
    entry = ConfigEntry("max.message.bytes", value or "", incremental_operation=op)
    resource = ConfigResource(ResourceType.TOPIC, topic, incremental_configs=[entry])
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.incremental_alter_configs([resource]).values():
        future.result(timeout=30)


async def test_an_aborted_transaction_is_counted_and_its_turn_reruns(
    kafka_bootstrap_servers: str, client: KafkaAgentClient
) -> None:
    """The broker refuses an event bigger than the events topic allows: the transaction
    aborts, ``pyrula_transaction_aborts_total`` counts it, and once the topic takes the
    record the rerun turn completes once."""

    @tool(read_only=True)
    async def big(ctx: ToolContext) -> str:
        """A result larger than the events topic accepts for now, even compressed."""
        return secrets.token_hex(20_000)

    @kafka_agent(
        name=unique_name("aborts"),
        llm=FakeLLM([reply_tool_call("big"), "done"]),
        tools=[big],
        partitions=1,
    )
    async def agent(ctx: AgentContext) -> str:
        return await ctx.llm.run([{"role": "user", "content": "go"}])

    events_topic = agent.topics.events
    options = WorkerOptions(shutdown_grace=1.0)
    async with running_worker(agent, kafka_bootstrap_servers, options) as worker:
        aborts = partial(
            worker.metrics.registry.get_sample_value,
            "pyrula_transaction_aborts_total",
            {"agent": agent.name},
        )
        await asyncio.to_thread(
            set_max_message_bytes, kafka_bootstrap_servers, events_topic, "4000"
        )
        try:
            handle = await client.submit(agent.name)
            await wait_for(lambda: (aborts() or 0) >= 1, 60, "a transaction aborted")
        finally:
            await asyncio.to_thread(
                set_max_message_bytes, kafka_bootstrap_servers, events_topic, None
            )
        events = [e async for e in client.stream(agent.name, handle.turn_id)]
        started = worker.metrics.registry.get_sample_value(
            "pyrula_turns_started_total", {"agent": agent.name, "resumed": "true"}
        )
        assert aborts() == worker.committer.stats.aborts
        assert (started or 0) >= 1  # each abort reruns the turn from its journal
    assert [e.type for e in events].count("run:complete") == 1
    assert [e.seq for e in events] == list(range(len(events)))
