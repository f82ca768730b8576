"""Soak: does a worker's memory stay flat while turns keep finishing?

A worker must hold what is live (turns in flight, idempotency keys within their TTL on
disk), not what has finished: memory that grows with throughput runs a long-lived worker
out of memory. The worker runs alone in a freshly spawned interpreter, so its resident
set holds nothing of the bench; the load generator and the completion reader (which keep
per-turn timings) stay in this process. After a warm-up of plain and keyed turns (the
heap, librdkafka's buffers and SQLite's page caches reach their working size) the RSS is
read, then ``turns`` one-tool turns run in chunks, every other chunk's turns with an
idempotency key; the RSS is read again after each chunk. ``rss_bytes_per_finished_turn``
is ``(RSS at the end - RSS after the warm-up) / turns``.

The load generator sends at most ``BURST`` requests at a time, in the warm-up and in the
measured chunks alike, and waits for them to finish. The backlog a worker fetches ahead
(librdkafka's fetch buffers) sets the high-water mark of its malloc arenas, which stays
in the RSS after the buffers are freed. A measured chunk sent whole (20,000 requests)
after a warm-up sent 2,500 at a time raised the worker's RSS by 8 MB while malloc's bytes
in use grew 0.4 MB, its free bytes 9 MB, and Python's objects not at all: growth that no
finished turn held, divided by the turns.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import time
import uuid
from dataclasses import dataclass
from functools import partial
from typing import Any

from pyrula_stream.bench.harness import (
    agent_topics,
    create_topics,
    drop_topics,
    in_process_worker,
    unique,
)
from pyrula_stream.bench.load import CompletionReader, Record, Submitter
from pyrula_stream.bench.workload import QUESTION, tool_turn_agent
from pyrula_stream.runtime import event_loop
from pyrula_stream.runtime.worker import WorkerOptions
from pyrula_stream.testing import wait_for
from pyrula_stream.wire import serde

CONCURRENCY = 200
BURST = 2_500
"""Most requests the load generator has out at once (the worker's backlog)."""


def bursts(n: int, size: int) -> list[int]:
    """``n`` turns as sends of at most ``size`` each."""
    return [min(size, n - i) for i in range(0, n, size)]


@dataclass(frozen=True)
class SoakPlan:
    """How many requests go out at a time: the warm-up's two chunks (plain, then keyed)
    and each measured chunk, as lists of burst sizes."""

    burst: int
    warmup: tuple[list[int], list[int]]
    measured: list[list[int]]


def soak_plan(turns: int, warmup: int, chunks: int) -> SoakPlan:
    """Bursts no larger than the warm-up's, so the backlog (and with it the allocator's
    high-water mark) is reached before the baseline RSS is read."""
    burst = max(1, min(BURST, warmup // 2))
    size = max(1, turns // chunks)
    measured = [bursts(min(size, turns - done), burst) for done in range(0, turns, size)]
    warm = (bursts(warmup - warmup // 2, burst), bursts(warmup // 2, burst))
    return SoakPlan(burst, warm, measured)


def soak_requests(agent: str, n: int, *, keyed: bool) -> list[Record]:
    """``n`` turn requests; ``keyed`` ones carry an idempotency key (kept for its TTL)."""
    ctype = serde.content_type("turn_request").encode()
    now = int(time.time() * 1000)
    out: list[Record] = []
    for _ in range(n):
        turn_id = uuid.uuid4().hex
        request = serde.TurnRequest(
            turn_id,
            agent,
            dict(QUESTION),
            idempotency_key=f"soak-{turn_id}" if keyed else None,
            submitted_ms=now,
        )
        value = serde.encode("turn_request", request)
        out.append((request.key.encode(), value, [(serde.CONTENT_TYPE_HEADER, ctype)]))
    return out


def _worker_process(bootstrap: str, name: str, partitions: int, ready: Any, stop: Any) -> None:
    """The spawned interpreter: one worker until ``stop`` is set."""
    agent = tool_turn_agent(name, latency_s=0.0, partitions=partitions)

    async def main() -> None:
        options = WorkerOptions(max_concurrent_turns=CONCURRENCY, shared_tool_cache=False)
        async with in_process_worker(agent, bootstrap, options, create=False):
            ready.set()
            await asyncio.to_thread(stop.wait)

    event_loop.run(main())  # the loop `pyrula-stream worker` runs on


async def run_soak(
    bootstrap: str, *, turns: int, warmup: int, partitions: int, chunks: int = 10
) -> dict[str, Any]:
    """See the module docstring."""
    import psutil  # type: ignore[import-untyped,unused-ignore]

    agent = tool_turn_agent(unique("soak"), latency_s=0.0, partitions=partitions)
    await asyncio.to_thread(create_topics, bootstrap, agent.topic_specs())
    context = multiprocessing.get_context("spawn")
    ready, stop = context.Event(), context.Event()
    worker = context.Process(
        target=_worker_process,
        args=(bootstrap, agent.name, partitions, ready, stop),
        name="soak-worker",
        daemon=True,
    )
    submitter = Submitter(bootstrap)
    reader = CompletionReader(bootstrap, agent.topics.events, partitions)
    worker.start()
    try:
        await wait_for(lambda: ready.is_set() or not worker.is_alive(), 120, "soak worker")
        if not worker.is_alive():
            raise RuntimeError(f"the soak worker exited with code {worker.exitcode}")
        rss = psutil.Process(worker.pid).memory_info
        sent = keyed_turns = 0

        async def run_chunk(sends: list[int], keyed: bool) -> None:
            nonlocal sent, keyed_turns
            for n in sends:
                keyed_turns += n if keyed else 0
                requests = soak_requests(agent.name, n, keyed=keyed)
                await asyncio.to_thread(submitter.send_all, agent.topics.turns, requests)
                sent += n
                await wait_for(
                    partial(reader.reached, sent),
                    max(120.0, n / 10),
                    f"soak: {reader.terminal}/{sent} turns completed",
                )

        plan = soak_plan(turns, warmup, chunks)
        await run_chunk(plan.warmup[0], keyed=False)
        await run_chunk(plan.warmup[1], keyed=True)
        keyed_turns = 0  # of the measured turns
        await asyncio.sleep(1.0)  # the last commits (offsets, tombstones) land
        before = rss().rss
        samples: list[dict[str, int]] = []
        started = time.monotonic()
        done = 0
        for sends in plan.measured:
            await run_chunk(sends, keyed=len(samples) % 2 == 0)
            done += sum(sends)
            samples.append({"turns": done, "rss_bytes": rss().rss})
        seconds = time.monotonic() - started
        await asyncio.sleep(1.0)
        after = rss().rss
    finally:
        stop.set()
        await asyncio.to_thread(worker.join, 60)
        if worker.is_alive():
            worker.kill()
        reader.close()
        submitter.close()
        await asyncio.to_thread(drop_topics, bootstrap, agent_topics(agent))
    return {
        "turns": turns,
        "warmup_turns": warmup,
        "keyed_turns": keyed_turns,
        "burst_turns": plan.burst,
        "seconds": round(seconds, 1),
        "rss_after_warmup_bytes": before,
        "rss_end_bytes": after,
        "rss_bytes_per_finished_turn": round((after - before) / turns, 2),
        "samples": samples,
    }
