"""Memory per parked turn, measured in a fresh worker process.

Each turn does ``await ctx.sleep_until(<an hour from now>)``: a durable timer far past
``durable_timer_after_s``, so the turn parks (no task, no slot) and only what the worker
keeps to wake it stays in memory. The worker runs alone in a freshly spawned interpreter
(as ``bench/cpu.py`` spawns them, tuned as ``pyrula-stream worker`` tunes its own
process), so its resident set holds neither the bench's load generator nor what an
earlier phase freed; it reports its parked count (``worker.parked_turns``) through shared
memory and reads its own RSS after a ``gc.collect()`` when asked.

The load generator sends at most ``BURST`` requests at a time and waits until they are
all parked; a warm-up burst parks first, so the backlog the consumer fetches ahead
(librdkafka's buffers, the malloc arenas' high-water mark) is in the RSS before the first
reading: the growth is what parked turns hold (the lesson of the soak, ``soak.py``).
``rss_kb_per_parked_turn`` is ``(RSS after N parked - RSS before) / N``. The cross-check
starts ``tracemalloc`` in the same process afterwards and parks ``N // 5`` more turns
(tracing slows allocation, and its own tables would be in an RSS read with it on):
``tracemalloc_kb_per_parked_turn`` is the growth of the traced Python heap per turn.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import multiprocessing
import queue
import time
from datetime import UTC, datetime
from functools import partial
from typing import Any

from pyrula_stream.agent.definition import KafkaAgent, kafka_agent
from pyrula_stream.bench.harness import PREFIX, agent_topics, create_topics, drop_topics, unique
from pyrula_stream.bench.load import Submitter, turn_requests
from pyrula_stream.context.agent_context import AgentContext
from pyrula_stream.llm.fake import FakeLLM
from pyrula_stream.runtime import event_loop
from pyrula_stream.runtime.collector import tune_for_worker
from pyrula_stream.runtime.worker import WorkerOptions
from pyrula_stream.testing import running_worker, wait_for

SLOTS = 500
"""Turns running at once while they park (the throughput phase's concurrency)."""
BURST = 2_500
"""Most requests out at once (the worker's fetch backlog), warm-up and measured alike."""
PARK_FOR_MS = 3_600_000
"""An hour: no timer fires during the phase."""


def sleeper_agent(name: str, partitions: int) -> KafkaAgent:
    """A turn that parks on a durable timer at ``wake_at_ms`` (given, so a replay agrees)."""

    @kafka_agent(name=name, prefix=PREFIX, llm=FakeLLM(["-"]), partitions=partitions)
    async def sleeper(ctx: AgentContext, wake_at_ms: int) -> str:
        await ctx.sleep_until(datetime.fromtimestamp(wake_at_ms / 1000, UTC))
        return "woke"

    return sleeper


def _reading(command: str, worker: Any) -> dict[str, int]:
    """The worker process's own figures after a full collection (``trace`` starts
    tracemalloc first, so the traced heap counts from this reading)."""
    import tracemalloc

    import psutil  # type: ignore[import-untyped,unused-ignore]

    if command == "trace":
        tracemalloc.start()
    gc.collect()
    traced = tracemalloc.get_traced_memory()[0] if tracemalloc.is_tracing() else 0
    return {
        "rss_kb": int(psutil.Process().memory_info().rss // 1024),
        "traced_bytes": traced,
        "parked": worker.parked_turns,
        "running": worker.running_turns,
    }


def _worker_process(
    bootstrap: str, name: str, partitions: int, owned: Any, parked: Any, ask: Any, answer: Any
) -> None:
    """The spawned interpreter: one worker; answers ``read``/``trace`` until ``stop``."""
    agent = sleeper_agent(name, partitions)

    async def main() -> None:
        tune_for_worker()  # as run_worker does: the bench measures what a user runs
        options = WorkerOptions(max_concurrent_turns=SLOTS)
        async with running_worker(agent, bootstrap, options, wait_assigned=False) as worker:
            while not worker.done:
                owned.value = worker.assigned_partitions
                parked.value = worker.parked_turns
                try:
                    command = ask.get_nowait()
                except queue.Empty:
                    await asyncio.sleep(0.05)
                    continue
                if command == "stop":
                    return
                answer.put(_reading(command, worker))

    event_loop.run(main())  # the loop `pyrula-stream worker` runs on


async def run_parked(bootstrap: str, *, parked: int, partitions: int) -> dict[str, Any]:
    """See the module docstring."""
    agent = sleeper_agent(unique("park"), partitions)
    await asyncio.to_thread(create_topics, bootstrap, agent.topic_specs())
    context = multiprocessing.get_context("spawn")
    owned, count = context.Value("i", 0), context.Value("i", 0)
    ask, answer = context.Queue(), context.Queue()
    proc = context.Process(
        target=_worker_process,
        args=(bootstrap, agent.name, partitions, owned, count, ask, answer),
        name="parked-worker",
        daemon=True,
    )
    submitter = Submitter(bootstrap)
    wake_at_ms = int(time.time() * 1000) + PARK_FOR_MS
    burst = max(1, min(BURST, parked))
    total = 0

    def alive() -> bool:
        if not proc.is_alive():
            raise RuntimeError(f"the parked-turns worker exited with {proc.exitcode}")
        return True

    def parked_by(n: int) -> bool:
        return alive() and count.value >= n

    async def park(n: int) -> float:
        """Park ``n`` more turns, ``burst`` at a time; the seconds it took."""
        nonlocal total
        started = time.monotonic()
        for size in [min(burst, n - i) for i in range(0, n, burst)]:
            requests = turn_requests(agent.name, size, {"wake_at_ms": wake_at_ms})
            await asyncio.to_thread(submitter.send_all, agent.topics.turns, requests)
            total += size
            await wait_for(
                partial(parked_by, total), max(300.0, size / 20), f"parked turns: {total} asked"
            )
        return time.monotonic() - started

    async def reading(command: str) -> dict[str, int]:
        await asyncio.sleep(1.0)  # the last commits (park records, offsets) land
        ask.put(command)
        got: dict[str, int] = await asyncio.to_thread(answer.get, True, 120)
        return got

    traced_turns = max(1, parked // 5)
    proc.start()
    try:
        await wait_for(
            lambda: alive() and owned.value == partitions, 180, "parked-turns worker assigned"
        )
        await park(burst)  # the warm-up: backlog and arenas at their working size
        before = await reading("read")
        seconds = await park(parked)
        after = await reading("read")
        trace_before = await reading("trace")
        await park(traced_turns)
        trace_after = await reading("read")
    finally:
        with contextlib.suppress(Exception):
            ask.put("stop")
        await asyncio.to_thread(proc.join, 60)
        if proc.is_alive():
            proc.kill()
        submitter.close()
        await asyncio.to_thread(drop_topics, bootstrap, agent_topics(agent))
    return {
        "parked_turns": parked,
        "max_concurrent_turns": SLOTS,
        "burst_turns": burst,
        "park_seconds": round(seconds, 1),
        "parked_turns_per_s": round(parked / seconds, 1),
        "parked_at_end": after["parked"],
        "running_while_parked": after["running"],
        "rss_before_kb": before["rss_kb"],
        "rss_after_kb": after["rss_kb"],
        "rss_kb_per_parked_turn": round((after["rss_kb"] - before["rss_kb"]) / parked, 3),
        "tracemalloc_parked_turns": traced_turns,
        "traced_before_kb": trace_before["traced_bytes"] // 1024,
        "traced_after_kb": trace_after["traced_bytes"] // 1024,
        "tracemalloc_kb_per_parked_turn": round(
            (trace_after["traced_bytes"] - trace_before["traced_bytes"]) / 1024 / traced_turns, 3
        ),
    }
