"""Sub-agent figures: memory per parked turn (``bench/parked.py``: N turns parked on a
durable timer in a fresh worker process), and the overhead of one ``call_agent`` round
trip against a model-free child (p50, p99).

Until issue 27 the parked figure came from turns parked on a call in the bench's own
process: the RSS growth then mostly reused arenas an earlier phase had freed (0.07 KB,
even negative), an artifact; ``parked.py`` measures it in a process of its own.

Round trip: parent and child workers both run; each parent turn makes one call. The
figure is ``subagent:result.ts_ms - subagent:start.ts_ms`` from the parent's events: the
call step's commit, the child's pickup, run and terminal commit (with the reply), the
reply's journal commit, and the parent's resumption by replay. The child does no work.
"""

from __future__ import annotations

import asyncio
from typing import Any

from pyrula_stream.agent.definition import KafkaAgent, kafka_agent
from pyrula_stream.bench.harness import agent_topics, create_topics, drop_topics, in_process_worker
from pyrula_stream.bench.harness import unique as unique_name
from pyrula_stream.bench.parked import run_parked
from pyrula_stream.bench.stats import percentile
from pyrula_stream.client.kafka_client import KafkaAgentClient
from pyrula_stream.context.agent_context import AgentContext
from pyrula_stream.llm.fake import FakeLLM
from pyrula_stream.runtime.worker import WorkerOptions

SLOTS = 50


def _pair(partitions: int) -> tuple[KafkaAgent, KafkaAgent]:
    @kafka_agent(name=unique_name("benchchild"), llm=FakeLLM(["-"]), partitions=partitions)
    async def child(ctx: AgentContext, i: int) -> int:
        return i

    @kafka_agent(name=unique_name("benchparent"), llm=FakeLLM(["-"]), partitions=partitions)
    async def parent(ctx: AgentContext, i: int) -> int:
        return int(await ctx.call_agent(child, i=i))

    return parent, child


async def run_subagents(
    bootstrap: str, *, parked: int, round_trips: int, partitions: int, keep_topics: bool
) -> dict[str, Any]:
    """The parked-turns figures (fresh process), then the ``call_agent`` round trips."""
    figures = await run_parked(bootstrap, parked=parked, partitions=partitions)
    options = WorkerOptions(max_concurrent_turns=SLOTS, shutdown_grace=0.5)
    parent, child = _pair(partitions)
    names = [*agent_topics(parent), *agent_topics(child)]
    for agent in (parent, child):
        await asyncio.to_thread(create_topics, bootstrap, agent.topic_specs())
    samples: list[float] = []
    try:
        async with (
            KafkaAgentClient(bootstrap) as client,
            in_process_worker(child, bootstrap, options, create=False),
            in_process_worker(parent, bootstrap, options, create=False),
        ):
            for i in range(round_trips):
                events = await client.run(parent.name, i=i, timeout=60)
                by_type = {e.type: e for e in events}
                started, taken = by_type["subagent:start"], by_type["subagent:result"]
                samples.append(float(taken.ts_ms - started.ts_ms))
    finally:
        if not keep_topics:
            await asyncio.to_thread(drop_topics, bootstrap, names)
    return {
        **figures,
        "round_trips": round_trips,
        "call_round_trip_p50_ms": round(percentile(samples, 50), 1),
        "call_round_trip_p99_ms": round(percentile(samples, 99), 1),
        "call_round_trip_ms": samples,
    }
