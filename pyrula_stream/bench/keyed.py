"""Idempotency keys at rate: how long a worker's event loop stalls while it takes keys and
expires them.

Every turn carries its own idempotency key, sent at ``rate`` turns/s (2,000 by default)
for ``seconds``. The worker runs alone in a freshly spawned interpreter (as
``bench/parked.py`` runs it) with a short TTL and expiry interval (``ttl_s``,
``expiry_interval_s``), so the run crosses several expiries, each of the keys taken since
the previous one: the same work a day's TTL and the default 60 s interval give a worker
at that rate. In the worker's own loop a sampler sleeps ``SAMPLE_S`` over and over and
records how late it wakes: ``loop_stall_max_ms`` is the latest wake-up while the load
ran (the target: none over ``STALL_TARGET_MS``), ``loop_stall_max_ms_expiring`` the
latest within an expiry (from its first tombstoned batch to its last, give or take
``EXPIRY_MARGIN_S``) and ``loop_stall_max_ms_between`` the latest outside them: what
expiry adds is their difference. ``keyed_turns_per_s`` is what the worker finished per second of the
load, and the worker process's CPU time per turn is given with it. A stall is the time
the loop's own thread ran code past the wake-up it asked for (its CPU time, so a process
the machine did not schedule is not counted as the loop's stall); the wall-clock
lateness, which counts that too, is given beside it (``loop_stall_wall_max_ms``).
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import queue
import time
import uuid
from functools import partial
from typing import Any

from pyrula_stream.agent.definition import KafkaAgent, kafka_agent
from pyrula_stream.bench.harness import PREFIX, agent_topics, create_topics, drop_topics, unique
from pyrula_stream.bench.load import Record, Submitter
from pyrula_stream.bench.stats import percentile
from pyrula_stream.context.agent_context import AgentContext
from pyrula_stream.llm.fake import FakeLLM
from pyrula_stream.runtime import event_loop
from pyrula_stream.runtime.collector import tune_for_worker
from pyrula_stream.runtime.worker import KafkaWorker, WorkerOptions
from pyrula_stream.testing import running_worker, wait_for
from pyrula_stream.wire import serde
from pyrula_stream.wire.records import content_type_header
from pyrula_stream.wire.serde import TurnRequest

SLOTS = 500
"""Turns running at once (the throughput phase's concurrency)."""
SAMPLE_S = 0.005
"""How long the sampler sleeps each time: a stall shorter than this is not seen."""
STALL_TARGET_MS = 50.0
EXPIRY_MARGIN_S = 0.5
WARM_UP = 500
"""Keyed turns before the measured load: the worker's structures at their working size."""


def keyed_agent(name: str, partitions: int) -> KafkaAgent:
    """A turn that answers at once: what is measured is the worker's own work per key."""

    @kafka_agent(name=name, prefix=PREFIX, llm=FakeLLM(["-"]), partitions=partitions)
    async def keyed(ctx: AgentContext, n: int) -> str:
        return "ok"

    return keyed


def keyed_requests(agent: str, n: int) -> list[Record]:
    """``n`` turn requests, each with an idempotency key of its own."""
    now = int(time.time() * 1000)
    out: list[Record] = []
    for i in range(n):
        key = uuid.uuid4().hex
        request = TurnRequest(key, agent, {"n": i}, idempotency_key=key, submitted_ms=now)
        value = serde.encode("turn_request", request)
        out.append((request.key.encode(), value, [content_type_header("turn_request")]))
    return out


class LoopLag:
    """Wakes every ``SAMPLE_S`` and records how late: (when, ms late by the wall clock, ms
    of CPU the loop's thread spent meanwhile, keys expired by then).

    The wall clock counts every reason to wake late, the machine's other processes
    included (on 2 shared cores a process may wait hundreds of ms for a core); the loop
    thread's CPU time counts only what the loop itself was busy with, so the stall the
    worker's own code makes is the smaller of the two (``busy_ms``).
    """

    def __init__(self, worker: KafkaWorker) -> None:
        self._worker = worker
        self.samples: list[tuple[float, float, float, int]] = []

    async def run(self) -> None:
        while True:
            asked, cpu = time.perf_counter(), time.thread_time()
            await asyncio.sleep(SAMPLE_S)
            late_ms = (time.perf_counter() - asked - SAMPLE_S) * 1000
            busy_ms = min(late_ms, (time.thread_time() - cpu) * 1000)
            expired = self._worker.expired_keys
            self.samples.append((time.monotonic(), late_ms, busy_ms, expired))

    def report(self) -> dict[str, Any]:
        """The stalls since the samples were last cleared (see the module docstring)."""
        busy = [b for _, _, b, _ in self.samples]
        wall = [late for _, late, _, _ in self.samples]
        windows = self.expiries()
        expiring = [b for t, _, b, _ in self.samples if any(lo <= t <= hi for lo, hi in windows)]
        between = [b for t, _, b, _ in self.samples if not any(lo <= t <= hi for lo, hi in windows)]
        expired = self.samples[-1][3] - self.samples[0][3] if self.samples else 0
        return {
            "samples": len(busy),
            "loop_stall_max_ms": round(max(busy, default=0.0), 1),
            "loop_stall_p99_ms": round(percentile(busy, 99), 2) if busy else 0.0,
            "stalls_over_target": sum(1 for b in busy if b > STALL_TARGET_MS),
            "expiries": len(windows),
            "loop_stall_max_ms_expiring": round(max(expiring, default=0.0), 1),
            "loop_stall_max_ms_between": round(max(between, default=0.0), 1),
            "loop_stall_wall_max_ms": round(max(wall, default=0.0), 1),
            "loop_stall_wall_p99_ms": round(percentile(wall, 99), 2) if wall else 0.0,
            "expired_keys": expired,
        }

    def expiries(self) -> list[tuple[float, float]]:
        """Each expiry as (from, to): its tombstoned batches, those less than a second
        apart taken as one expiry, widened by ``EXPIRY_MARGIN_S`` on each side."""
        changed = [
            now[0]
            for now, before in zip(self.samples[1:], self.samples[:-1], strict=True)
            if now[3] != before[3]
        ]
        windows: list[tuple[float, float]] = []
        for t in changed:
            if windows and t - windows[-1][1] < 1.0:
                windows[-1] = (windows[-1][0], t)
            else:
                windows.append((t, t))
        return [(lo - EXPIRY_MARGIN_S, hi + EXPIRY_MARGIN_S) for lo, hi in windows]


def _worker_process(
    bootstrap: str,
    name: str,
    partitions: int,
    ttl_s: float,
    interval_s: float,
    owned: Any,
    finished: Any,
    ask: Any,
    answer: Any,
) -> None:
    """The spawned interpreter: one worker and its loop's sampler; ``start`` clears the
    samples and the CPU clock, ``stop`` answers with the figures and ends."""
    agent = keyed_agent(name, partitions)

    async def main() -> None:
        tune_for_worker()  # as run_worker does: the bench measures what a user runs
        options = WorkerOptions(
            max_concurrent_turns=SLOTS,
            idempotency_ttl_s=ttl_s,
            idempotency_expiry_interval_s=interval_s,
        )
        async with running_worker(agent, bootstrap, options, wait_assigned=False) as worker:
            lag = LoopLag(worker)
            sampler = asyncio.create_task(lag.run())
            cpu_started = time.process_time()
            try:
                while not worker.done:
                    owned.value = worker.assigned_partitions
                    finished.value = worker.turns_finished
                    try:
                        command = ask.get_nowait()
                    except queue.Empty:
                        await asyncio.sleep(0.05)
                        continue
                    if command == "start":
                        lag.samples.clear()
                        cpu_started = time.process_time()
                        answer.put({})
                    elif command == "stop":
                        cpu_s = time.process_time() - cpu_started
                        answer.put({**lag.report(), "worker_cpu_s": round(cpu_s, 3)})
                        return
            finally:
                sampler.cancel()

    event_loop.run(main())  # the loop `pyrula-stream worker` runs on


async def run_keyed(
    bootstrap: str,
    *,
    rate: float,
    seconds: float,
    ttl_s: float,
    expiry_interval_s: float,
    partitions: int,
) -> dict[str, Any]:
    """See the module docstring."""
    agent = keyed_agent(unique("keyed"), partitions)
    await asyncio.to_thread(create_topics, bootstrap, agent.topic_specs())
    context = multiprocessing.get_context("spawn")
    owned, finished = context.Value("i", 0), context.Value("i", 0)
    ask, answer = context.Queue(), context.Queue()
    proc = context.Process(
        target=_worker_process,
        args=(
            bootstrap,
            agent.name,
            partitions,
            ttl_s,
            expiry_interval_s,
            owned,
            finished,
            ask,
            answer,
        ),
        name="keyed-worker",
        daemon=True,
    )
    submitter = Submitter(bootstrap)
    turns = max(1, int(rate * seconds))

    def finished_by(n: int) -> bool:
        if not proc.is_alive():
            raise RuntimeError(f"the keyed-turns worker exited with {proc.exitcode}")
        return bool(finished.value >= n)

    async def command(name: str) -> dict[str, Any]:
        ask.put(name)
        got: dict[str, Any] = await asyncio.to_thread(answer.get, True, 120)
        return got

    proc.start()
    try:
        await wait_for(
            lambda: finished_by(0) and owned.value == partitions, 180, "keyed worker assigned"
        )
        warm = keyed_requests(agent.name, WARM_UP)
        await asyncio.to_thread(submitter.send_all, agent.topics.turns, warm)
        await wait_for(partial(finished_by, WARM_UP), 300, "keyed warm-up turns finished")
        requests = keyed_requests(agent.name, turns)
        await command("start")
        started = time.monotonic()
        await asyncio.to_thread(submitter.send_paced, agent.topics.turns, requests, rate)
        sent_s = time.monotonic() - started
        await wait_for(
            partial(finished_by, WARM_UP + turns), max(300.0, seconds * 5), "keyed turns finished"
        )
        took_s = time.monotonic() - started
        figures = await command("stop")
    finally:
        with contextlib.suppress(Exception):
            ask.put("stop")
        await asyncio.to_thread(proc.join, 60)
        if proc.is_alive():
            proc.kill()
        submitter.close()
        await asyncio.to_thread(drop_topics, bootstrap, agent_topics(agent))
    return {
        "turns": turns,
        "rate_asked": rate,
        "ttl_s": ttl_s,
        "expiry_interval_s": expiry_interval_s,
        "partitions": partitions,
        "send_seconds": round(sent_s, 2),
        "seconds": round(took_s, 2),
        "keyed_turns_per_s": round(turns / took_s, 1),
        "worker_cpu_ms_per_turn": round(figures.pop("worker_cpu_s") * 1000 / turns, 3),
        "stall_target_ms": STALL_TARGET_MS,
        **figures,
    }
