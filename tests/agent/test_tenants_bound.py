"""How far over a quota a worker group can go: at most ``(2W - 1) * C * M`` past the cap
in one window (W workers, C turn slots each, M the most one model call used; see
docs/tenants.md). A tenant floods two workers with turns that each make one model call;
the usage the group committed, window by window, stays within the bound, which the
flood would pass about threefold with no quota at all."""

from __future__ import annotations

import asyncio
import json

from pyrula_stream import AgentContext, KafkaAgentClient, WorkerOptions, kafka_agent
from pyrula_stream.agent.tenants import TenantLimits
from pyrula_stream.llm import FakeLLM
from pyrula_stream.runtime.quotas import UsageWindows
from pyrula_stream.testing import read_topic, running_worker, unique_name, wait_for
from pyrula_stream.wire.serde import decode_turn_result_value

WORKERS = 2
SLOTS = 4
CAP = 30
TURNS = 40


async def test_a_flood_stays_within_the_documented_overshoot(
    kafka_bootstrap_servers: str, client: KafkaAgentClient
) -> None:
    @kafka_agent(
        name=unique_name("bound"),
        llm=FakeLLM(["ok"], latency_s=0.05),
        partitions=WORKERS,
        tenant=lambda request: request.metadata.get("tenant"),
        unknown_tenants="own",
        tenant_limits=TenantLimits(tokens_per_minute=CAP),
        on_quota="fail",
    )
    async def agent(ctx: AgentContext) -> str:
        return await ctx.llm.run([{"role": "user", "content": "hi"}])

    def options(i: int) -> WorkerOptions:
        return WorkerOptions(max_concurrent_turns=SLOTS, worker_id=f"b{i}", shutdown_grace=1)

    def results() -> list[str]:
        return [
            decode_turn_result_value(v).status
            for _, v, _ in read_topic(kafka_bootstrap_servers, agent.topics.results)
            if v is not None
        ]

    async with (
        running_worker(agent, kafka_bootstrap_servers, options(0)),
        running_worker(agent, kafka_bootstrap_servers, options(1)),
    ):
        await asyncio.gather(
            *(client.submit(agent.name, metadata={"tenant": "acme"}) for _ in range(TURNS))
        )
        await wait_for(lambda: len(results()) >= TURNS, 120, "every turn ended")

    usage = [
        (key.decode(), json.loads(value))
        for key, value, _ in read_topic(kafka_bootstrap_servers, agent.topics.tenant_usage)
        if key is not None and value is not None
    ]
    calls = [body["tokens"] for key, body in usage if body["tokens"]]
    biggest = max(calls)
    windows = UsageWindows()
    for key, body in usage:
        windows.fold(key, body)
    bound = CAP + (2 * WORKERS - 1) * SLOTS * biggest
    assert TURNS * biggest > bound, "without a quota the flood would pass the bound"
    for (tenant, minute), used in windows.minutes.items():
        assert used.tokens <= bound, f"{tenant} used {used.tokens} tokens in minute {minute}"
    statuses = results()
    assert statuses.count("failed") > 0, "the cap held some turns back"
    assert len(calls) < TURNS
