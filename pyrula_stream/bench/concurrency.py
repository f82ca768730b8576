"""Many turns in flight on one worker: throughput against the ideal, memory and CPU per turn.

The worker runs in its own freshly spawned interpreter (as ``pyrula-stream worker`` runs
it, tuned the same way), so its resident set starts clean and holds the worker alone: the
load generator and the completion reader stay in the bench's process. It runs
``in_flight`` turns at once (``max_concurrent_turns=in_flight``) of the one-tool workload
over ``waves x in_flight`` turns, all submitted at once. The model takes
``model_latency_s``, or (``spread`` > 0) a latency drawn per call uniformly within
``model_latency_s x (1 +- spread)``, as real calls return spread out.

The ideal is a worker that costs nothing: its ``in_flight`` slots each take the next turn
the moment one ends, and a turn lasts its two model calls. Without spread that is
``in_flight / (2 x model_latency_s)`` turns/s; with spread the ideal's time is that
schedule simulated on latencies drawn from the same distribution (the last turns' tail
included), so ``fraction_of_ideal`` compares like with like. In-flight is observed from
outside: turns whose ``run:start`` is committed and whose ``run:complete`` is not. The
worker's RSS is sampled every 20 ms; per-turn memory is ``(peak RSS - RSS before the
burst) / peak in-flight``, everything the worker process holds included (its clients'
buffers, the requests it has read ahead and the freed memory its allocators keep). CPU is
the worker process's user + system time over the window.
"""

from __future__ import annotations

import asyncio
import heapq
import os
import random
import threading
from typing import Any

from pyrula_stream.bench.cpu import worker_processes
from pyrula_stream.bench.harness import agent_topics, create_topics, drop_topics, unique
from pyrula_stream.bench.load import CompletionReader, Submitter, turn_requests
from pyrula_stream.bench.workload import QUESTION, model_latency, tool_turn_agent
from pyrula_stream.testing import wait_for

MODEL_CALLS = 2


class _Sampler:
    """Samples the worker's RSS and the observed in-flight count in a thread."""

    def __init__(self, reader: CompletionReader, pid: int, interval_s: float = 0.02) -> None:
        import psutil  # type: ignore[import-untyped,unused-ignore]

        self._process = psutil.Process(pid)
        self._reader = reader
        self._interval_s = interval_s
        self.before_kb = self._rss_kb()
        self.peak_kb = self.before_kb
        self.peak_in_flight = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)
        self._thread.start()

    def _rss_kb(self) -> int:
        return int(self._process.memory_info().rss // 1024)

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            self.peak_kb = max(self.peak_kb, self._rss_kb())
            self.peak_in_flight = max(self.peak_in_flight, self._reader.in_flight)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)


def ideal_seconds(
    turns: int, in_flight: int, model_latency_s: float, spread: float, seed: int = 1
) -> float:
    """How long ``turns`` take on ``in_flight`` slots that cost nothing (module docstring)."""
    if spread <= 0:
        return -(-turns // in_flight) * MODEL_CALLS * model_latency_s
    rng = random.Random(seed)

    def turn_s() -> float:
        return sum(model_latency(model_latency_s, spread, rng) for _ in range(MODEL_CALLS))

    ends = [turn_s() for _ in range(min(turns, in_flight))]
    heapq.heapify(ends)
    for _ in range(turns - len(ends)):
        heapq.heappush(ends, heapq.heappop(ends) + turn_s())
    return max(ends)


async def run_concurrency(
    bootstrap: str,
    *,
    in_flight: int,
    model_latency_s: float,
    waves: int,
    partitions: int,
    spread: float = 0.0,
) -> dict[str, Any]:
    """One run of ``waves x in_flight`` turns on a spawned worker (see the module docstring)."""
    agent = tool_turn_agent(
        unique("conc"), latency_s=model_latency_s, partitions=partitions, spread=spread
    )
    await asyncio.to_thread(create_topics, bootstrap, agent.topic_specs())
    turns = in_flight * waves
    submitter = Submitter(bootstrap)
    reader = CompletionReader(bootstrap, agent.topics.events, partitions)
    try:
        async with worker_processes(
            bootstrap,
            agent.name,
            count=1,
            steps=1,
            partitions=partitions,
            concurrency=in_flight,
            latency_s=model_latency_s,
            spread=spread,
        ) as workers:
            warm = min(50, in_flight)
            await asyncio.to_thread(
                submitter.send_all, agent.topics.turns, turn_requests(agent.name, warm, QUESTION)
            )
            await wait_for(lambda: reader.reached(warm), 120, "concurrency warm-up")
            requests = turn_requests(agent.name, turns, QUESTION)
            sampler = _Sampler(reader, workers.pids[0])
            cpu_before = workers.cpu_seconds()
            started = await asyncio.to_thread(submitter.send_all, agent.topics.turns, requests)
            try:
                await wait_for(
                    lambda: reader.reached(warm + turns),
                    300 + turns * MODEL_CALLS * model_latency_s,
                    f"concurrency run: {reader.terminal - warm}/{turns} turns completed",
                )
            finally:
                sampler.stop()
            cpu_s = workers.cpu_seconds() - cpu_before
            seconds = reader.last_done - started
    finally:
        reader.close()
        submitter.close()
        await asyncio.to_thread(drop_topics, bootstrap, agent_topics(agent))
    ideal = turns / ideal_seconds(turns, in_flight, model_latency_s, spread)
    achieved = turns / seconds
    peak = max(1, sampler.peak_in_flight)
    return {
        "in_flight": in_flight,
        "turns": turns,
        "model_latency_s": model_latency_s,
        "model_latency_spread": spread,
        "seconds": round(seconds, 3),
        "turns_per_s": round(achieved, 1),
        "ideal_turns_per_s": round(ideal, 1),
        "fraction_of_ideal": round(achieved / ideal, 3),
        "peak_in_flight_observed": sampler.peak_in_flight,
        "rss_before_kb": sampler.before_kb,
        "rss_peak_kb": sampler.peak_kb,
        "rss_kb_per_inflight_turn": round((sampler.peak_kb - sampler.before_kb) / peak, 2),
        "worker_cpu_s": round(cpu_s, 3),
        "cpu_ms_per_turn": round(1000 * cpu_s / turns, 3),
        "worker_cores_used": round(cpu_s / seconds, 2),
        "load_avg_1m_at_end": round(os.getloadavg()[0], 2),  # a starved worker reads low
    }
