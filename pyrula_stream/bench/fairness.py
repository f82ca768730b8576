"""Fairness: how much one tenant's flood delays another tenant's turns on the same worker.

Tenant B sends ``paced`` turns at ``rate``/s alone, and its latency (submit to the
terminal event read back) is measured. Then tenant A floods ``flood`` turns at once and B
sends the same paced turns again, behind the flood on every partition. The worker admits
turns round-robin across tenants (``runtime/fairness.py``), reading ahead far enough
(``max_queued_turns``) to see B's turns behind A's. ``tenant_isolation_p99_ratio`` is B's
p99 during the flood divided by B's p99 alone, from the same run (target <= 2).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

from pyrula_stream import AgentContext, WorkerOptions, kafka_agent
from pyrula_stream.agent.definition import KafkaAgent
from pyrula_stream.bench.harness import agent_topics, drop_topics, in_process_worker, unique
from pyrula_stream.bench.load import CompletionReader, Record, Submitter
from pyrula_stream.bench.stats import percentile
from pyrula_stream.llm import FakeLLM
from pyrula_stream.wire.records import content_type_header
from pyrula_stream.wire.serde import TurnRequest, encode


def tenant_requests(agent: str, tenant: str, n: int) -> list[Record]:
    """``n`` turn requests of ``tenant`` (in their metadata), as ``submit`` writes them."""
    now = int(time.time() * 1000)
    out: list[Record] = []
    for _ in range(n):
        request = TurnRequest(
            uuid.uuid4().hex, agent, {}, metadata={"tenant": tenant}, submitted_ms=now
        )
        out.append(
            (
                request.key.encode(),
                encode("turn_request", request),
                [content_type_header("turn_request")],
            )
        )
    return out


def fairness_agent(model_s: float, partitions: int) -> KafkaAgent:
    @kafka_agent(
        name=unique("fair"),
        llm=FakeLLM(["ok"], latency_s=model_s),
        partitions=partitions,
        tenant=lambda request: request.metadata.get("tenant"),
        unknown_tenants="own",  # the bench's own two tenants, configured nowhere
    )
    async def agent(ctx: AgentContext) -> str:
        return await ctx.llm.run([{"role": "user", "content": "hi"}])

    return agent


async def _paced(
    submitter: Submitter,
    reader: CompletionReader,
    topic: str,
    records: list[Record],
    rate: float,
    timeout_s: float,
) -> list[float]:
    """Send ``records`` at ``rate``/s; each one's latency in ms once all have ended."""
    sent = await asyncio.to_thread(submitter.send_paced, topic, records, rate)
    deadline = time.monotonic() + timeout_s
    while not all(k in reader.done for k in sent):
        if reader.errors:
            raise RuntimeError(f"{len(reader.errors)} turns ended with run:error")
        if time.monotonic() > deadline:
            raise TimeoutError(f"tenant B's turns did not end within {timeout_s}s")
        await asyncio.sleep(0.05)
    return [(reader.done[k] - t) * 1000 for k, t in sent.items()]


async def run_fairness(
    bootstrap: str,
    *,
    flood: int = 5000,
    paced: int = 50,
    rate: float = 10.0,
    model_s: float = 0.05,
    partitions: int = 6,
    max_concurrent_turns: int = 50,
    keep_topics: bool = False,
) -> dict[str, Any]:
    agent = fairness_agent(model_s, partitions)
    options = WorkerOptions(
        max_concurrent_turns=max_concurrent_turns,
        max_queued_turns=flood + 2 * paced,  # reads past the whole flood: B's turns are seen
        shutdown_grace=1.0,
    )
    turns = agent.topics.turns
    submitter = Submitter(bootstrap)
    try:
        async with in_process_worker(agent, bootstrap, options):
            reader = CompletionReader(bootstrap, agent.topics.events, partitions)
            try:
                timeout_s = 120 + flood * model_s
                alone = await _paced(
                    submitter,
                    reader,
                    turns,
                    tenant_requests(agent.name, "B", paced),
                    rate,
                    timeout_s,
                )
                flood_records = tenant_requests(agent.name, "A", flood)
                await asyncio.to_thread(submitter.send_all, turns, flood_records)
                during = await _paced(
                    submitter,
                    reader,
                    turns,
                    tenant_requests(agent.name, "B", paced),
                    rate,
                    timeout_s,
                )
                a_done = sum(1 for key, _, _ in flood_records if key in reader.done)
            finally:
                reader.close()
    finally:
        submitter.close()
        if not keep_topics:
            await asyncio.to_thread(drop_topics, bootstrap, agent_topics(agent))
    alone99, during99 = percentile(alone, 99), percentile(during, 99)
    return {
        "flood_turns": flood,
        "paced_turns": paced,
        "paced_rate": rate,
        "model_ms": round(model_s * 1000, 1),
        "tenant_b_alone_p50_ms": round(percentile(alone, 50), 1),
        "tenant_b_alone_p99_ms": round(alone99, 1),
        "tenant_b_flood_p50_ms": round(percentile(during, 50), 1),
        "tenant_b_flood_p99_ms": round(during99, 1),
        "tenant_isolation_p99_ratio": round(during99 / alone99, 2) if alone99 else None,
        "flood_done_when_b_done": a_done,
    }
