"""A record sized at the broker's limit, with many headers, on each topic the worker reads:
it ends in a (trimmed) dead letter, or is skipped and counted, and its partition keeps
flowing. Its dead letter (value plus every header as ``pyrula.original.*``) would be over
the producer's limit; sent as is, ``produce()`` refused it and the session restarted on it
for good."""

from __future__ import annotations

import pytest

from pyrula_stream import (
    AgentContext,
    KafkaAgentClient,
    SignalRefused,
    WorkerOptions,
    kafka_agent,
)
from pyrula_stream.errors import PayloadTooLarge, SubAgentError
from pyrula_stream.kafka.io import RecordProducer
from pyrula_stream.llm import FakeLLM
from pyrula_stream.runtime.quotas import TenantQuotas
from pyrula_stream.testing import read_topic, running_worker, unique_name, wait_for
from pyrula_stream.wire.signals import RECORD_TYPE_HEADER, SIGNAL_RECORD_TYPE
from tests.approvals_kit import all_events

BROKER_LIMIT = 1_048_588
"""The broker's default ``message.max.bytes``: the largest record batch it takes."""

HEADERS = 300

SIGNAL_KINDS = ("signal", "signals", "answers")


def _hostile(
    extra: list[tuple[str, str | bytes | None]] = (),  # type: ignore[assignment]
) -> tuple[bytes, list[tuple[str, str | bytes | None]]]:
    """A value and headers whose one-record batch is just under the broker's limit."""
    headers: list[tuple[str, str | bytes | None]] = [
        *extra,
        *((f"x-hostile-{i:03d}", b"h" * 24) for i in range(HEADERS)),
    ]
    header_bytes = sum(len(k) + len(v or b"") + 2 for k, v in headers)
    # batch header (61), record framing (under 32), the key and some slack
    value = b"\x00not-a-record" + b"x" * (BROKER_LIMIT - 61 - 32 - 64 - header_bytes - 13 - 64)
    return value, headers


def _hostile_producer(bootstrap: str) -> RecordProducer:
    """A producer whose own limit is above the broker's (as a hostile one's may be)."""
    return RecordProducer(bootstrap, message_max_bytes=4_000_000)


@pytest.mark.parametrize("topic", ["turns", "replies", "signal", "signals", "answers"])
async def test_an_oversize_record_is_dead_lettered_and_the_partition_flows(
    kafka_bootstrap_servers: str, client: KafkaAgentClient, topic: str
) -> None:
    """``signal``: a signal on the replies topic, where clients sent them before
    ``<agent>.signals``; ``signals`` and ``answers``: a signal record on those topics."""

    @kafka_agent(name=unique_name("big"), llm=FakeLLM(["fine"]), partitions=1)
    async def agent(ctx: AgentContext, question: str) -> str:
        return await ctx.llm.run([{"role": "user", "content": question}])

    extra: list[tuple[str, str | bytes | None]] = (
        [(RECORD_TYPE_HEADER, SIGNAL_RECORD_TYPE)] if topic in SIGNAL_KINDS else []
    )
    value, headers = _hostile(extra)
    target = {
        "turns": agent.topics.turns,
        "signals": agent.topics.signals,
        "answers": agent.topics.answers,
    }.get(topic, agent.topics.replies)
    producer = _hostile_producer(kafka_bootstrap_servers)
    async with running_worker(agent, kafka_bootstrap_servers):
        await producer.send(target, b"k1", value, headers)
        events = await client.run(agent.name, question="still there?", timeout=60)
        assert events[-1].type == "run:complete"

        def letters() -> list[tuple[bytes | None, bytes | None, dict[str, str]]]:
            return read_topic(kafka_bootstrap_servers, agent.topics.dlq)

        await wait_for(lambda: len(letters()) == 1, 30, "one dead letter")
    producer.close()
    [(key, letter, meta)] = letters()
    assert key == b"k1"
    assert meta["pyrula.dlq.source"].startswith(f"{target}[0]@")
    assert meta["pyrula.dlq.reason"]
    assert "pyrula.dlq.trimmed" in meta, sorted(meta)[:5]
    # what was cut is said; what is kept is the value's start and the first headers
    assert letter is not None and value.startswith(letter)
    assert len(letter) < len(value)
    assert "value" in meta["pyrula.dlq.trimmed"]
    assert meta["pyrula.original.x-hostile-000"] == "h" * 24


async def test_an_oversize_control_record_is_skipped_and_counted(
    kafka_bootstrap_servers: str, client: KafkaAgentClient
) -> None:
    """Control records are never dead-lettered (every worker reads them all from the
    start): skipped and counted, and the turns flow."""

    @kafka_agent(name=unique_name("bigctl"), llm=FakeLLM(["fine"]), partitions=1)
    async def agent(ctx: AgentContext, question: str) -> str:
        return await ctx.llm.run([{"role": "user", "content": question}])

    value, headers = _hostile()
    producer = _hostile_producer(kafka_bootstrap_servers)
    async with running_worker(agent, kafka_bootstrap_servers) as worker:
        await producer.send(agent.topics.control, b"k1", value, headers)
        events = await client.run(agent.name, question="still there?", timeout=60)
        metric = worker.metrics.registry.get_sample_value
        skipped = {"agent": agent.name, "source": "control"}
        await wait_for(
            lambda: metric("pyrula_skipped_records_total", skipped) == 1, 30, "a counted skip"
        )
        sessions = worker.sessions
    producer.close()
    assert events[-1].type == "run:complete"
    assert sessions == 1
    assert read_topic(kafka_bootstrap_servers, agent.topics.dlq) == []


def test_a_usage_record_keyed_by_a_long_tenant_id_is_refused_before_it_is_sent() -> None:
    """The tenant-usage record holds the (outside) tenant id in its key and its value: one
    past the producer's room fails its turn with a clear error (``stream_too_large``)
    instead of reaching ``produce()``, and is not counted."""

    @kafka_agent(
        name=unique_name("bigtenant"),
        llm=FakeLLM(["fine"]),
        tenant=lambda request: request.metadata.get("tenant"),
    )
    async def agent(ctx: AgentContext) -> str:
        return "unused"

    quotas = TenantQuotas(agent, "unused:9092", worker_id="w1", record_room=10_000)
    quotas.usage_record("acme", "turn-1", "start", turns=1)
    with pytest.raises(PayloadTooLarge, match="tenant-usage record of a tenant id of 6000"):
        quotas.usage_record("t" * 6_000, "turn-2", "start", turns=1)
    assert quotas.usage("t" * 6_000)[0].turns == 0
    assert quotas.usage("acme")[0].turns == 1


async def test_a_reply_too_large_to_journal_fails_the_call_instead_of_wedging(
    kafka_bootstrap_servers: str, client: KafkaAgentClient
) -> None:
    """The parent's journal copy of a child's reply must fit its producer: one that would
    not is dead-lettered, and the parent reads a failed reply (``stream_too_large``)."""

    @kafka_agent(name=unique_name("bigchild"), llm=FakeLLM(["unused"]), partitions=1)
    async def child(ctx: AgentContext, size: int) -> str:
        return "x" * size

    @kafka_agent(name=unique_name("smallparent"), llm=FakeLLM(["unused"]), partitions=1)
    async def parent(ctx: AgentContext, size: int) -> str:
        try:
            answer = await ctx.call_agent(child, size=size)
        except SubAgentError as exc:
            return f"failed: {exc.child_code}"
        return f"got {len(answer)}"

    small = WorkerOptions(producer_config={"message.max.bytes": 200_000})
    async with (
        running_worker(child, kafka_bootstrap_servers),
        running_worker(parent, kafka_bootstrap_servers, small) as worker,
    ):
        big = await client.run(parent.name, size=300_000, timeout=60)
        fine = await client.run(parent.name, size=10, timeout=60)
        sessions = worker.sessions
    assert big[-1].data["result"] == "failed: stream_too_large"
    assert fine[-1].data["result"] == "got 10"
    assert sessions == 1
    [(_, letter, meta)] = read_topic(kafka_bootstrap_servers, parent.topics.dlq)
    assert letter is not None and 0 < len(letter) < 200_000  # the reply's start
    assert meta["pyrula.dlq.reason"].startswith("reply refused: too_large: its journal copy")
    assert meta["pyrula.dlq.code"] == "unsolicited_reply"
    assert "pyrula.dlq.trimmed" in meta  # the copy of the reply is cut to fit too


async def test_a_signal_too_large_to_journal_is_refused_and_the_turn_runs_on(
    kafka_bootstrap_servers: str, client: KafkaAgentClient
) -> None:
    """The journal copy of a signal must fit the worker's producer: one that would not is
    refused back to its sender (``too_large``), and the turn takes the next one."""

    @kafka_agent(name=unique_name("bigsignal"), llm=FakeLLM(["unused"]), partitions=1)
    async def agent(ctx: AgentContext) -> object:
        return (await ctx.wait_for_signal("go")).payload

    small = WorkerOptions(producer_config={"message.max.bytes": 200_000})
    async with running_worker(agent, kafka_bootstrap_servers, small) as worker:
        handle = await client.submit(agent.name)
        await wait_for(lambda: worker.parked_turns == 1, 60, "the turn parked on 'go'")
        with pytest.raises(SignalRefused) as refused:
            await client.signal(agent.name, handle.turn_id, "go", "x" * 300_000)
        assert (await client.signal(agent.name, handle.turn_id, "go", "small")).accepted
        events = await all_events(client, agent.name, handle.turn_id)
        sessions = worker.sessions
    assert refused.value.reason == "too_large"
    assert "journal copy would be" in str(refused.value)
    assert events[-1].type == "run:complete"
    assert events[-1].data["result"] == "small"
    assert sessions == 1
