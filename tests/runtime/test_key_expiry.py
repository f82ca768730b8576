"""Idempotency keys past their TTL, on the real broker: the worker expires them off its
event loop, tombstones them in transactions of at most ``idempotency_expiry_batch`` keys,
and a restore does not bring them back; a duplicate within the TTL is still refused, at
once (before the key reached disk) and after a restart."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

from pyrula_stream import AgentContext, Event, KafkaAgentClient, WorkerOptions, kafka_agent
from pyrula_stream.kafka.consumers import read_topic
from pyrula_stream.kafka.offsets import ConsumedRecord
from pyrula_stream.llm import FakeLLM
from pyrula_stream.testing import running_worker, unique_name, wait_for
from pyrula_stream.wire.serde import TurnRequest


async def collect(client: KafkaAgentClient, agent: str, turn_id: str) -> list[Event]:
    return [e async for e in client.stream(agent, turn_id)]


def transactions(records: list[ConsumedRecord]) -> list[list[ConsumedRecord]]:
    """A partition's records split where an offset is skipped: one writer, so each gap is
    a transaction's commit marker, and each run of offsets one transaction's records."""
    runs: list[list[ConsumedRecord]] = []
    for record in sorted(records, key=lambda r: r.offset):
        if runs and record.offset == runs[-1][-1].offset + 1:
            runs[-1].append(record)
        else:
            runs.append([record])
    return runs


def keys_on_disk(state: Path) -> list[str]:
    (db,) = state.glob("*journal-0.sqlite")
    with sqlite3.connect(db) as conn:
        return sorted(str(row[0]) for row in conn.execute("SELECT key FROM entries"))


async def test_expired_keys_are_tombstoned_in_bounded_batches_and_stay_gone(
    kafka_bootstrap_servers: str, client: KafkaAgentClient, tmp_path: Path
) -> None:
    runs: list[str] = []

    @kafka_agent(name=unique_name("keyexpiry"), llm=FakeLLM(["ok"]), partitions=1)
    async def agent(ctx: AgentContext, order: str) -> str:
        runs.append(order)
        return f"charged {order}"

    options = WorkerOptions(
        worker_id="a",
        idempotency_ttl_s=1.0,
        idempotency_expiry_interval_s=0.3,
        idempotency_expiry_batch=4,
    )
    async with running_worker(agent, kafka_bootstrap_servers, options) as worker:
        # Submitted at once, so their keys expire together and need several batches.
        handles = [
            await client.submit(agent.name, idempotency_key=f"order-{i}", order=str(i))
            for i in range(10)
        ]
        for handle in handles:
            events = await asyncio.wait_for(collect(client, agent.name, handle.turn_id), 60)
            assert events[-1].type == "run:complete"
        await wait_for(lambda: worker.expired_keys == 10, 30, "all ten keys expired")
    journal = read_topic(kafka_bootstrap_servers, agent.topics.journal, client_id=unique_name("r"))
    taken = {r.key for r in journal if r.key.startswith("idem/") and r.value is not None}
    assert taken == {f"idem/order-{i}" for i in range(10)}
    per_transaction = [
        sum(1 for r in run if r.key.startswith("idem/") and r.value is None)
        for run in transactions(journal)
    ]
    assert sum(per_transaction) == 10, per_transaction
    assert max(per_transaction) <= 4, f"tombstones per transaction: {per_transaction}"
    # A new owner restores the journal: the expired keys do not come back, so the same
    # key submitted again (by another producer) runs as a new turn.
    state = tmp_path / "state"
    restarted = WorkerOptions(worker_id="b", state_dir=state)
    async with running_worker(agent, kafka_bootstrap_servers, restarted):
        assert keys_on_disk(state) == []
        again = TurnRequest("again-3", agent.name, {"order": "3"}, idempotency_key="order-3")
        handle = await client.submit_request(again)
        events = await asyncio.wait_for(collect(client, agent.name, handle.turn_id), 60)
    assert events[-1].type == "run:complete"
    assert sorted(runs) == sorted([*map(str, range(10)), "3"])


async def test_a_duplicate_within_the_ttl_is_refused_at_once_and_after_a_restart(
    kafka_bootstrap_servers: str, client: KafkaAgentClient, tmp_path: Path
) -> None:
    """The key waits in memory before the keys task writes it: a duplicate right behind
    the first turn still finds it; the next owner finds it restored from the journal."""
    runs: list[str] = []

    @kafka_agent(name=unique_name("keydup"), llm=FakeLLM(["ok"]), partitions=1)
    async def agent(ctx: AgentContext, order: str) -> str:
        runs.append(order)
        return f"charged {order}"

    async def duplicate(turn_id: str) -> list[Event]:
        request = TurnRequest(turn_id, agent.name, {"order": "7"}, idempotency_key="order-7")
        handle = await client.submit_request(request)
        return await asyncio.wait_for(collect(client, agent.name, handle.turn_id), 60)

    async with running_worker(agent, kafka_bootstrap_servers, WorkerOptions(worker_id="a")):
        first = await client.run(agent.name, idempotency_key="order-7", order="7", timeout=60)
        at_once = await duplicate("dup-1")
    state = tmp_path / "state"
    async with running_worker(
        agent, kafka_bootstrap_servers, WorkerOptions(worker_id="b", state_dir=state)
    ):
        assert keys_on_disk(state) == ["order-7"]
        after_restart = await duplicate("dup-2")
        resubmitted = await client.submit(agent.name, idempotency_key="order-7", order="7")
        await client.run(agent.name, order="8", timeout=60)  # after the resubmit
    assert runs == ["7", "8"], "order 7 ran once"
    assert resubmitted.turn_id == first[0].turn_id
    for refused in (at_once, after_restart):
        assert [e.type for e in refused] == ["run:error"]
        assert refused[0].data["code"] == "duplicate_run"
        assert refused[0].data["original_turn_id"] == first[0].turn_id
