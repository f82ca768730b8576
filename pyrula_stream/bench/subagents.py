"""Sub-agent figures: how many parked turns a worker holds (memory per parked turn), and
the overhead of one ``call_agent`` round trip against a model-free child (p50, p99).

Parked: a parent agent's worker (``max_concurrent_turns=50``) takes turns that each call
a child whose agent has no worker running, so every turn parks. The figure is the growth
of the worker process's RSS per parked turn, once all are parked.

Round trip: parent and child workers both run; each parent turn makes one call. The
figure is ``subagent:result.ts_ms - subagent:start.ts_ms`` from the parent's events: the
call step's commit, the child's pickup, run and terminal commit (with the reply), the
reply's journal commit, and the parent's resumption by replay. The child does no work.
"""

from __future__ import annotations

import asyncio
import gc
from typing import Any

from pyrula_stream.agent import KafkaAgent, kafka_agent
from pyrula_stream.bench.harness import agent_topics, create_topics, drop_topics, in_process_worker
from pyrula_stream.bench.harness import unique as unique_name
from pyrula_stream.bench.stats import percentile
from pyrula_stream.client import KafkaAgentClient
from pyrula_stream.context import AgentContext
from pyrula_stream.llm.fake import FakeLLM
from pyrula_stream.runtime.worker import WorkerOptions
from pyrula_stream.testing import wait_for

SLOTS = 50


def _rss_kb() -> int:
    import psutil  # type: ignore[import-untyped,unused-ignore]

    return int(psutil.Process().memory_info().rss // 1024)


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
    options = WorkerOptions(max_concurrent_turns=SLOTS, shutdown_grace=0.5)
    parent, child = _pair(partitions)
    p2, c2 = _pair(partitions)
    names = [*agent_topics(parent), *agent_topics(child), *agent_topics(p2), *agent_topics(c2)]
    for agent in (parent, child, p2, c2):
        await asyncio.to_thread(create_topics, bootstrap, agent.topic_specs())
    try:
        async with KafkaAgentClient(bootstrap) as client:
            async with in_process_worker(parent, bootstrap, options, create=False) as worker:
                gc.collect()
                before = _rss_kb()
                for start in range(0, parked, 200):
                    await asyncio.gather(
                        *(
                            client.submit(parent.name, i=i)
                            for i in range(start, min(parked, start + 200))
                        )
                    )
                await wait_for(lambda: worker.parked_turns >= parked, 300, "every turn parked")
                gc.collect()
                after = _rss_kb()
                running = worker.running_turns
            samples: list[float] = []
            async with (
                in_process_worker(c2, bootstrap, options, create=False),
                in_process_worker(p2, bootstrap, options, create=False),
            ):
                for i in range(round_trips):
                    events = await client.run(p2.name, i=i, timeout=60)
                    by_type = {e.type: e for e in events}
                    started, taken = by_type["subagent:start"], by_type["subagent:result"]
                    samples.append(float(taken.ts_ms - started.ts_ms))
    finally:
        if not keep_topics:
            await asyncio.to_thread(drop_topics, bootstrap, names)
    return {
        "parked_turns": parked,
        "max_concurrent_turns": SLOTS,
        "running_while_parked": running,
        "rss_before_kb": before,
        "rss_after_kb": after,
        "rss_kb_per_parked_turn": round((after - before) / max(1, parked), 2),
        "round_trips": round_trips,
        "call_round_trip_p50_ms": round(percentile(samples, 50), 1),
        "call_round_trip_p99_ms": round(percentile(samples, 99), 1),
        "call_round_trip_ms": samples,
    }
