"""``TenantLimits.max_concurrent_turns`` on the real broker: it caps one tenant's turns
holding a task on each worker (so a group of W workers runs at most W times it), other
tenants are not held back, and a parked turn of the tenant takes no slot."""

from __future__ import annotations

import asyncio
from collections import Counter

from pyrula_stream import AgentContext, KafkaAgentClient, WorkerOptions, kafka_agent
from pyrula_stream.agent.tenants import TenantLimits
from pyrula_stream.kafka.partitioner import partition_for
from pyrula_stream.llm import FakeLLM
from pyrula_stream.testing import read_topic, running_worker, unique_name, wait_for
from pyrula_stream.wire.serde import decode_turn_result_value

CAP = 1


def thread_on(partition: int, name: str) -> str:
    """A thread id whose key lands on ``partition`` of two."""
    i = 0
    while partition_for(f"{name}-{i}".encode(), 2) != partition:
        i += 1
    return f"{name}-{i}"


async def test_a_tenants_cap_holds_per_worker_and_a_parked_turn_takes_no_slot(
    kafka_bootstrap_servers: str, client: KafkaAgentClient
) -> None:
    gate = asyncio.Event()
    inside: Counter[str] = Counter()
    peak: Counter[str] = Counter()

    @kafka_agent(
        name=unique_name("tenantcap"),
        llm=FakeLLM(["ok"]),
        partitions=2,
        tenant=lambda request: request.metadata.get("tenant"),
        unknown_tenants="own",
        tenant_limits=TenantLimits(max_concurrent_turns=CAP),
    )
    async def agent(ctx: AgentContext, who: str, park: bool = False) -> str:
        if park:  # past durable_timer_after_s: the turn parks with a timer, holding no task
            await ctx.sleep(3600)
            return "woke"
        inside[who] += 1
        peak[who] = max(peak[who], inside[who])
        try:
            await gate.wait()
        finally:
            inside[who] -= 1
        return who

    def finished() -> int:
        return sum(
            1
            for _, v, _ in read_topic(kafka_bootstrap_servers, agent.topics.results)
            if v is not None and decode_turn_result_value(v).status == "completed"
        )

    async def submit(tenant: str, partition: int, n: int, **params: object) -> None:
        for i in range(n):
            await client.submit(
                agent.name,
                metadata={"tenant": tenant},
                thread_id=thread_on(partition, f"{tenant}{partition}{i}{params.get('park', '')}"),
                who=tenant,
                **params,
            )

    options = [WorkerOptions(worker_id=f"cap{i}", shutdown_grace=0.2) for i in range(2)]
    async with (
        running_worker(agent, kafka_bootstrap_servers, options[0]) as first,
        running_worker(agent, kafka_bootstrap_servers, options[1]) as second,
    ):
        await wait_for(
            lambda: first.assigned_partitions == 1 and second.assigned_partitions == 1,
            60,
            "each worker owns one partition",
        )
        for p in (0, 1):
            await submit("acme", p, 1, park=True)
        await wait_for(lambda: first.parked_turns + second.parked_turns == 2, 60, "two parked")
        for p in (0, 1):
            await submit("acme", p, 3)
        await submit("zenith", 0, 1)
        # Parked turns hold no slot: one acme turn runs on each worker, and zenith too.
        await wait_for(
            lambda: inside["acme"] == 2 and inside["zenith"] == 1, 60, "acme on both, zenith"
        )
        assert first.running_turns + second.running_turns == 3
        gate.set()
        await wait_for(lambda: finished() == 7, 60, "every gated turn completed")

    assert peak["acme"] == 2 * CAP, "one acme turn at a time per worker, two workers"
    assert peak["zenith"] == 1
