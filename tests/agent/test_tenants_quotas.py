"""Per-tenant quotas with one worker on the real broker: a turn over its tenant's turn
rate is deferred (``run:deferred``, status ``deferred``) and resumes when the window has
room, or fails with ``budget_exceeded`` under ``on_quota="fail"``; a running turn stops
at its tenant's token cap; an operator's override through the tenants topic holds
without a restart."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

from pyrula_stream import AgentContext, KafkaAgentClient, WorkerOptions, kafka_agent
from pyrula_stream.agent.definition import KafkaAgent
from pyrula_stream.agent.tenants import OnQuota, TenantLimits
from pyrula_stream.cli import main as cli_main
from pyrula_stream.llm import FakeLLM
from pyrula_stream.runtime.quotas import MINUTE_MS
from pyrula_stream.testing import running_worker, unique_name, wait_for

QUICK_STOP = WorkerOptions(shutdown_grace=0.5)


async def fresh_minute(room_s: float = 10.0) -> None:
    """Set-up, not an assertion: start where at least ``room_s`` of the current quota
    minute is left, so the steps of a test fall in one window. Ten seconds hold a few
    turns on a busy machine; more room only makes a deferred turn wait longer."""
    left = MINUTE_MS / 1000 - (time.time() % 60)
    if left < room_s:
        await asyncio.sleep(left + 0.2)


def tenanted(name: str, limits: TenantLimits, on_quota: OnQuota = "defer") -> KafkaAgent:
    @kafka_agent(
        name=unique_name(name),
        llm=FakeLLM(["ok"]),
        partitions=1,
        tenant=lambda request: request.metadata.get("tenant"),
        unknown_tenants="own",
        tenant_limits=limits,
        on_quota=on_quota,
    )
    async def agent(ctx: AgentContext, calls: int = 1) -> str:
        answer = ""
        for _ in range(calls):
            answer = await ctx.llm.run([{"role": "user", "content": "hi"}])
        return answer

    return agent


async def test_on_quota_fail_ends_the_turn_over_the_turn_rate(
    kafka_bootstrap_servers: str, client: KafkaAgentClient
) -> None:
    agent = tenanted("qfail", TenantLimits(turns_per_minute=2), on_quota="fail")
    await fresh_minute(15)  # four turns
    async with running_worker(agent, kafka_bootstrap_servers, QUICK_STOP):
        runs = [
            await client.run(agent.name, metadata={"tenant": "acme"}, timeout=60) for _ in range(3)
        ]
        other = await client.run(agent.name, metadata={"tenant": "zenith"}, timeout=60)
    assert [r[-1].type for r in runs] == ["run:complete", "run:complete", "run:error"]
    error = runs[2][-1].data
    assert error["code"] == "budget_exceeded"
    assert error["detail"] == {
        "reason": "tenant_quota",
        "limit": "turns_per_minute",
        "tenant": "acme",
    }
    assert other[-1].type == "run:complete", "another tenant's quota is its own"


async def test_a_running_turn_stops_at_its_tenants_token_cap(
    kafka_bootstrap_servers: str, client: KafkaAgentClient
) -> None:
    """The first model call is under the cap (nothing used yet) and uses a few tokens;
    the second would pass the cap, so the turn stops before it."""
    agent = tenanted("qtokens", TenantLimits(tokens_per_minute=1))
    await fresh_minute()
    async with running_worker(agent, kafka_bootstrap_servers, QUICK_STOP):
        events = await client.run(
            agent.name,
            metadata={"tenant": "acme"},
            calls=3,
            timeout=60,
        )
    assert [e.type for e in events].count("llm:complete") == 1
    assert events[-1].type == "run:error"
    assert events[-1].data["code"] == "budget_exceeded"
    assert events[-1].data["detail"]["reason"] == "tenant_quota"
    assert events[-1].data["detail"]["limit"] == "tokens_per_minute"


async def test_a_turn_over_the_turn_rate_is_deferred_then_resumes(
    kafka_bootstrap_servers: str, client: KafkaAgentClient
) -> None:
    agent = tenanted("qdefer", TenantLimits(turns_per_minute=1))
    async with running_worker(agent, kafka_bootstrap_servers, QUICK_STOP) as worker:
        await fresh_minute()
        first = await client.run(agent.name, metadata={"tenant": "acme"}, timeout=60)
        handle = await client.submit(agent.name, metadata={"tenant": "acme"})
        stream = client.stream(agent.name, handle.turn_id)
        deferred = await anext(stream)
        status = await client.status(agent.name, handle.turn_id)
        rest = [e async for e in stream]
        sample = worker.metrics.registry.get_sample_value
        tenant = {"agent": agent.name, "tenant": "acme"}
        completed = {**tenant, "outcome": "completed"}
        # Counted once the worker sees its terminal commit, which a reader may see first.
        await wait_for(
            lambda: sample("pyrula_tenant_turns_total", completed) == 2, 30, "both counted"
        )
        metrics = (
            sample("pyrula_tenant_deferred_total", {**tenant, "reason": "turns_per_minute"}),
            sample("pyrula_tenant_turns_total", completed),
            sample("pyrula_tenant_model_tokens_total", tenant),
        )
    assert first[-1].type == "run:complete"
    assert metrics[:2] == (1, 2), "one deferral, two completed turns"
    assert metrics[2] is not None and metrics[2] > 0
    assert deferred.type == "run:deferred"
    assert deferred.data["reason"] == "turns_per_minute"
    assert deferred.data["tenant"] == "acme"
    resume_at = deferred.data["resume_at"]
    assert resume_at % MINUTE_MS == 0 and resume_at > deferred.ts_ms
    assert (status.state, status.tenant, status.resume_at) == ("deferred", "acme", resume_at)
    assert rest[-1].type == "run:complete"
    started = next(e for e in rest if e.type == "run:start")
    assert started.ts_ms >= resume_at, "it started once its tenant's window had room"


async def test_an_operator_override_holds_without_a_restart(
    kafka_bootstrap_servers: str, client: KafkaAgentClient, caplog: pytest.LogCaptureFixture
) -> None:
    agent = tenanted("qoverride", TenantLimits(turns_per_minute=1), on_quota="fail")
    name = agent.name
    caplog.set_level(logging.INFO, logger="pyrula_stream.runtime.quotas")
    await fresh_minute(30)
    async with running_worker(agent, kafka_bootstrap_servers, QUICK_STOP):
        before = [await client.run(name, metadata={"tenant": "acme"}, timeout=60) for _ in range(2)]
        code = await asyncio.to_thread(
            cli_main,
            [
                "tenants",
                "set",
                name,
                "acme",
                "turns_per_minute=5",
                "--bootstrap-servers",
                kafka_bootstrap_servers,
            ],
        )
        await wait_for(
            lambda: any("tenant acme of" in r.getMessage() for r in caplog.records),
            30,
            "the worker read the override",
        )
        after = await client.run(name, metadata={"tenant": "acme"}, timeout=60)
    assert code == 0
    assert [r[-1].type for r in before] == ["run:complete", "run:error"]
    assert after[-1].type == "run:complete"
