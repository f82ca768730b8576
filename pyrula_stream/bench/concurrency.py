"""Many turns in flight on one worker: throughput against the ideal, and memory per turn.

Runs in a fresh interpreter (``run_in_subprocess``), so the resident set it starts from
is not inflated by the heap an earlier phase freed but never gave back. The worker runs
``in_flight`` turns at once (``max_concurrent_turns=in_flight``) of the one-tool workload
with a ``model_latency_s`` model, over ``waves x in_flight`` turns; a turn that only waited
on its model would take ``2 x model_latency_s``, so the ideal throughput is
``in_flight / (2 x model_latency_s)``. In-flight is observed from outside: turns whose
``run:start`` is committed and whose ``run:complete`` is not. RSS is sampled every 20 ms;
per-turn memory is ``(peak RSS - RSS before the burst) / peak in-flight``, everything the
process holds included (the bench's reader and producer too, a few MB at most).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import multiprocessing
import threading
import time
from typing import Any

from pyrula_stream.bench.harness import agent_topics, drop_topics, in_process_worker, unique
from pyrula_stream.bench.load import CompletionReader, Submitter, turn_requests
from pyrula_stream.bench.workload import QUESTION, tool_turn_agent
from pyrula_stream.runtime.worker import WorkerOptions
from pyrula_stream.testing import wait_for

MODEL_CALLS = 2


class _Sampler:
    """Samples the process's RSS and the observed in-flight count in a thread."""

    def __init__(self, reader: CompletionReader, interval_s: float = 0.02) -> None:
        import psutil  # type: ignore[import-untyped,unused-ignore]

        self._process = psutil.Process()
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


async def _measure(
    bootstrap: str, in_flight: int, model_latency_s: float, waves: int, partitions: int
) -> dict[str, Any]:
    agent = tool_turn_agent(unique("conc"), latency_s=model_latency_s, partitions=partitions)
    turns = in_flight * waves
    options = WorkerOptions(max_concurrent_turns=in_flight)
    submitter = Submitter(bootstrap)
    try:
        async with in_process_worker(agent, bootstrap, options):
            reader = CompletionReader(bootstrap, agent.topics.events, partitions)
            try:
                warm = min(50, in_flight)
                await asyncio.to_thread(
                    submitter.send_all,
                    agent.topics.turns,
                    turn_requests(agent.name, warm, QUESTION),
                )
                await wait_for(lambda: reader.reached(warm), 120, "concurrency warm-up")
                requests = turn_requests(agent.name, turns, QUESTION)
                sampler = _Sampler(reader)
                started = await asyncio.to_thread(submitter.send_all, agent.topics.turns, requests)
                try:
                    await wait_for(
                        lambda: reader.reached(warm + turns),
                        300 + turns * MODEL_CALLS * model_latency_s,
                        f"concurrency run: {reader.terminal - warm}/{turns} turns completed",
                    )
                finally:
                    sampler.stop()
                seconds = reader.last_done - started
            finally:
                reader.close()
    finally:
        submitter.close()
        await asyncio.to_thread(drop_topics, bootstrap, agent_topics(agent))
    ideal = in_flight / (MODEL_CALLS * model_latency_s)
    achieved = turns / seconds
    peak = max(1, sampler.peak_in_flight)
    return {
        "in_flight": in_flight,
        "turns": turns,
        "model_latency_s": model_latency_s,
        "seconds": round(seconds, 3),
        "turns_per_s": round(achieved, 1),
        "ideal_turns_per_s": round(ideal, 1),
        "fraction_of_ideal": round(achieved / ideal, 3),
        "peak_in_flight_observed": sampler.peak_in_flight,
        "rss_before_kb": sampler.before_kb,
        "rss_peak_kb": sampler.peak_kb,
        "rss_kb_per_inflight_turn": round((sampler.peak_kb - sampler.before_kb) / peak, 2),
    }


def measure(
    bootstrap: str, in_flight: int, model_latency_s: float, waves: int, partitions: int
) -> dict[str, Any]:
    """Blocking entry point (runs its own event loop); what the subprocess executes."""
    return asyncio.run(_measure(bootstrap, in_flight, model_latency_s, waves, partitions))


def run_in_subprocess(
    bootstrap: str, *, in_flight: int, model_latency_s: float, waves: int, partitions: int
) -> dict[str, Any]:
    """``measure`` in a freshly spawned interpreter, so its RSS starts clean."""
    context = multiprocessing.get_context("spawn")
    started = time.monotonic()
    with concurrent.futures.ProcessPoolExecutor(max_workers=1, mp_context=context) as pool:
        result: dict[str, Any] = pool.submit(
            measure, bootstrap, in_flight, model_latency_s, waves, partitions
        ).result()
    result["wall_s"] = round(time.monotonic() - started, 1)
    return result
