"""CPU per turn and per step, and turns/s with one and with two worker processes.

Each worker runs in a freshly spawned interpreter, so the CPU time read from its process
(user + system, psutil) is the worker's alone: the load generator and the completion
reader stay in this process. Two processes join one consumer group and split the
partitions. After the workers own every partition and a warm-up ran, the timed turns are
sent at once; the window is from just before the first submit to the moment the last
terminal event is read back, and every CPU figure is the difference of two readings at
its ends. The broker's CPU is read over the same window when it runs on this machine
(the process listening on the bootstrap port), so "what share the broker takes" of the
cores is measured, not guessed.

``cpu_ms_per_turn`` is the one-tool turn (one step: a model call and a tool call, then
the answering model call); ``cpu_ms_per_step`` is ``(CPU of a 20-step turn - CPU of a
1-step turn) / 19`` in each round (the two runs a few seconds apart), its median over the
rounds. How a step's cost grows with a turn's length is the ``long_turns`` phase's
(up to 1,000 steps, with a context window).
Each worker process is tuned as ``pyrula-stream worker`` tunes its own (``tune_for_worker``).

The model answers at once in those runs, so with 500 turns in flight about 200 turns share
a commit and most of their journal records cancel out inside it. A real model's latency
spreads the turns over many commits: ``cpu_ms_per_turn_200ms_model`` and
``cpu_ms_per_turn_2s_model`` are the one-process one-tool run again with a 200 ms and a
2 s model (same turns, same 500 in flight). ``records_per_turn*`` are the records the
worker wrote per timed turn at each latency: the growth of the high offsets of every
topic of the agent but its requests topic, so transaction markers (one per partition a
commit touched) count too, and records compaction later removes count as written.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from pyrula_stream.agent.definition import KafkaAgent
from pyrula_stream.bench.harness import agent_topics, create_topics, drop_topics, unique
from pyrula_stream.bench.load import CompletionReader, Submitter, turn_requests
from pyrula_stream.bench.stats import median
from pyrula_stream.bench.workload import QUESTION, tool_turn_agent
from pyrula_stream.kafka.consumers import reader_consumer
from pyrula_stream.kafka.offsets import watermarks
from pyrula_stream.runtime import event_loop
from pyrula_stream.runtime.collector import tune_for_worker
from pyrula_stream.runtime.worker import WorkerOptions
from pyrula_stream.testing import running_worker, wait_for

STEPS = 20
MODEL_LATENCIES = {"200ms": 0.2, "2s": 2.0}
"""The real-model runs: key suffix (``cpu_ms_per_turn_200ms_model``) and latency."""


def _worker_process(
    bootstrap: str,
    name: str,
    steps: int,
    partitions: int,
    concurrency: int,
    latency_s: float,
    spread: float,
    owned: Any,
    stop: Any,
) -> None:
    """The spawned interpreter: one worker until ``stop``; ``owned`` is its partition count."""
    agent = tool_turn_agent(
        name, latency_s=latency_s, partitions=partitions, steps=steps, spread=spread
    )

    async def main() -> None:
        options = WorkerOptions(max_concurrent_turns=concurrency)
        tune_for_worker()  # as run_worker does: the bench measures what a user runs
        async with running_worker(agent, bootstrap, options, wait_assigned=False) as worker:
            while not stop.is_set() and not worker.done:
                owned.value = worker.assigned_partitions
                await asyncio.sleep(0.2)

    event_loop.run(main())  # the loop `pyrula-stream worker` runs on


def _cpu_seconds(pid: int, *, with_children: bool = False) -> float:
    import psutil  # type: ignore[import-untyped,unused-ignore]

    process = psutil.Process(pid)
    procs = [process, *(process.children(recursive=True) if with_children else [])]
    total = 0.0
    for p in procs:
        with contextlib.suppress(psutil.Error):
            t = p.cpu_times()
            total += t.user + t.system
    return total


def broker_pid(bootstrap: str) -> int | None:
    """The local process listening on the first bootstrap address's port, if any."""
    import psutil

    first = bootstrap.split(",")[0].strip()
    port = urlsplit(f"//{first}").port
    if port is None:
        return None
    with contextlib.suppress(psutil.Error, OSError):
        for conn in psutil.net_connections(kind="tcp"):
            if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port:
                return int(conn.pid) if conn.pid is not None else None
    return None


@dataclass
class _Workers:
    pids: list[int]
    owned: list[Any]

    def cpu_seconds(self) -> float:
        return sum(_cpu_seconds(pid) for pid in self.pids)


@contextlib.asynccontextmanager
async def worker_processes(
    bootstrap: str,
    name: str,
    *,
    count: int,
    steps: int,
    partitions: int,
    concurrency: int,
    latency_s: float = 0.0,
    spread: float = 0.0,
) -> AsyncIterator[_Workers]:
    """``count`` spawned workers of one group (``tool_turn_agent(name, ...)``, a model of
    ``latency_s`` and ``spread``), yielded once they share every partition."""
    context = multiprocessing.get_context("spawn")
    stop = context.Event()
    owned = [context.Value("i", 0) for _ in range(count)]
    procs = [
        context.Process(
            target=_worker_process,
            args=(
                bootstrap,
                name,
                steps,
                partitions,
                concurrency,
                latency_s,
                spread,
                owned[i],
                stop,
            ),
            name=f"cpu-worker-{i}",
            daemon=True,
        )
        for i in range(count)
    ]
    for proc in procs:
        proc.start()

    def settled() -> bool:
        dead = [p for p in procs if not p.is_alive()]
        if dead:
            raise RuntimeError(f"bench worker {dead[0].name} exited with {dead[0].exitcode}")
        counts = [o.value for o in owned]
        return sum(counts) == partitions and all(c > 0 for c in counts)

    try:
        await wait_for(settled, 180, f"{count} worker processes sharing {partitions} partitions")
        yield _Workers([p.pid for p in procs if p.pid is not None], owned)
    finally:
        stop.set()
        for proc in procs:
            await asyncio.to_thread(proc.join, 60)
            if proc.is_alive():
                proc.kill()


def written_offsets(bootstrap: str, agent: KafkaAgent) -> int:
    """The sum of the high offsets of every topic of ``agent`` the worker writes (all but
    its requests topic): what it has written, transaction markers included."""
    consumer = reader_consumer(bootstrap, client_id=unique("bench-offsets"))
    try:
        return sum(
            watermarks(consumer, spec.name, p)[1]
            for spec in agent.topic_specs()
            if spec.name != agent.topics.turns
            for p in range(spec.partitions)
        )
    finally:
        consumer.close()


async def _settled_offsets(bootstrap: str, agent: KafkaAgent, timeout_s: float = 5.0) -> int:
    """``written_offsets`` once two readings 0.3 s apart agree: a finished turn's clean-up
    may ride a commit after its terminal event's."""
    last = await asyncio.to_thread(written_offsets, bootstrap, agent)
    deadline = asyncio.get_running_loop().time() + timeout_s
    while asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.3)
        now = await asyncio.to_thread(written_offsets, bootstrap, agent)
        if now == last:
            break
        last = now
    return last


async def measure_processes(
    bootstrap: str,
    *,
    processes: int,
    steps: int,
    turns: int,
    warmup: int,
    partitions: int,
    concurrency: int,
    broker: int | None,
    cores: int,
    latency_s: float = 0.0,
) -> dict[str, Any]:
    """One timed run on ``processes`` freshly spawned workers of one group (see the
    module docstring), with a model of ``latency_s``; the throughput phase's
    ``--processes auto`` run is one too."""
    agent = tool_turn_agent(unique("cpu"), latency_s=latency_s, partitions=partitions, steps=steps)
    await asyncio.to_thread(create_topics, bootstrap, agent.topic_specs())
    submitter = Submitter(bootstrap)
    reader = CompletionReader(bootstrap, agent.topics.events, partitions)
    here = os.getpid()
    try:
        async with worker_processes(
            bootstrap,
            agent.name,
            count=processes,
            steps=steps,
            partitions=partitions,
            concurrency=concurrency,
            latency_s=latency_s,
        ) as workers:
            await asyncio.to_thread(
                submitter.send_all, agent.topics.turns, turn_requests(agent.name, warmup, QUESTION)
            )
            await wait_for(lambda: reader.reached(warmup), 180, "cpu phase warm-up")
            written_before = await asyncio.to_thread(written_offsets, bootstrap, agent)
            requests = turn_requests(agent.name, turns, QUESTION)

            def readings() -> tuple[float, float, float]:
                """CPU seconds so far of the workers, the broker and this process."""
                return (
                    workers.cpu_seconds(),
                    _cpu_seconds(broker, with_children=True) if broker is not None else 0.0,
                    _cpu_seconds(here),
                )

            before = readings()
            started = await asyncio.to_thread(submitter.send_all, agent.topics.turns, requests)
            await wait_for(
                lambda: reader.reached(warmup + turns),
                max(180.0, turns * steps / 10, 4 * turns * latency_s * (steps + 1) / concurrency),
                f"cpu phase: {reader.terminal - warmup}/{turns} turns completed",
            )
            after = readings()
            seconds = reader.last_done - started
            written = await _settled_offsets(bootstrap, agent) - written_before
    finally:
        reader.close()
        submitter.close()
        await asyncio.to_thread(drop_topics, bootstrap, agent_topics(agent))
    worker_s, broker_s, bench_s = (a - b for a, b in zip(after, before, strict=True))
    return {
        "processes": processes,
        "steps_per_turn": steps,
        "model_latency_s": latency_s,
        "turns": turns,
        "seconds": round(seconds, 3),
        "turns_per_s": round(turns / seconds, 1),
        "worker_cpu_s": round(worker_s, 3),
        "cpu_ms_per_turn": round(1000 * worker_s / turns, 3),
        "records_per_turn": round(written / turns, 2),
        "worker_cores_used": round(worker_s / seconds, 2),
        "broker_cpu_s": round(broker_s, 3) if broker is not None else None,
        "broker_cores_used": round(broker_s / seconds, 2) if broker is not None else None,
        "broker_share_of_cores": round(broker_s / seconds / cores, 3)
        if broker is not None
        else None,
        "bench_client_cores_used": round(bench_s / seconds, 2),
    }


async def run_cpu(
    bootstrap: str,
    *,
    turns: int,
    step_turns: int,
    partitions: int,
    concurrency: int,
    rounds: int = 1,
    warmup: int = 50,
    model_latencies: bool = True,
) -> dict[str, Any]:
    """``rounds`` times (A B C D A B C D ..., so drift on a busy machine hits all alike;
    the figures are medians): one process then two of one-tool turns, one process of
    20-step turns, whose per-step CPU is taken against its own round's one-step run, and
    (``model_latencies``) one process of one-tool turns with a 200 ms model. Then one of
    one-tool turns with a 2 s model."""
    broker = broker_pid(bootstrap)
    cores = os.cpu_count() or 1
    common = {"warmup": warmup, "partitions": partitions, "concurrency": concurrency}
    runs: list[dict[str, Any]] = []
    model_runs: list[dict[str, Any]] = []
    step_costs: list[float] = []
    for _ in range(rounds):
        for processes in (1, 2):
            runs.append(
                await measure_processes(
                    bootstrap,
                    processes=processes,
                    steps=1,
                    turns=turns,
                    broker=broker,
                    cores=cores,
                    **common,
                )
            )
        many = await measure_processes(
            bootstrap,
            processes=1,
            steps=STEPS,
            turns=step_turns,
            broker=broker,
            cores=cores,
            **common,
        )
        step_costs.append(_per_step(many, runs[-2]["cpu_ms_per_turn"]))
        runs.append(many)
        if model_latencies:
            model_runs.append(
                await measure_processes(
                    bootstrap,
                    processes=1,
                    steps=1,
                    turns=turns,
                    broker=broker,
                    cores=cores,
                    latency_s=MODEL_LATENCIES["200ms"],
                    **common,
                )
            )
    if model_latencies:
        model_runs.append(
            await measure_processes(
                bootstrap,
                processes=1,
                steps=1,
                turns=turns,
                broker=broker,
                cores=cores,
                latency_s=MODEL_LATENCIES["2s"],
                warmup=max(1, warmup // 10),  # each warm-up turn takes 4 s
                partitions=partitions,
                concurrency=concurrency,
            )
        )
    one_step = [r for r in runs if r["steps_per_turn"] == 1]
    many_steps = [r for r in runs if r["steps_per_turn"] == STEPS]

    def med(key: str, processes: int) -> Any:
        values = [r[key] for r in one_step if r["processes"] == processes]
        return None if None in values else round(median(values), 3)

    cpu_one = med("cpu_ms_per_turn", 1)
    step_20 = median(step_costs)
    return {
        "cpu_ms_per_turn": cpu_one,
        "records_per_turn": med("records_per_turn", 1),
        **_model_figures(model_runs, [r for r in one_step if r["processes"] == 1]),
        "cpu_ms_per_step": round(step_20, 3),
        "steps": STEPS,
        "rounds": rounds,
        "turns_per_s_1_process": med("turns_per_s", 1),
        "turns_per_s_2_processes": med("turns_per_s", 2),
        "turns_per_s_1_step": med("turns_per_s", 1),
        f"turns_per_s_{STEPS}_steps": round(median([r["turns_per_s"] for r in many_steps]), 1),
        "cpu_ms_per_step_runs": [round(x, 3) for x in step_costs],
        "cpu_ms_per_turn_2_processes": med("cpu_ms_per_turn", 2),
        "broker_measured": broker is not None,
        "broker_cores_used_1_process": med("broker_cores_used", 1),
        "broker_cores_used_2_processes": med("broker_cores_used", 2),
        "broker_share_of_cores_2_processes": med("broker_share_of_cores", 2),
        "runs": runs,
        "model_latency_runs": model_runs,
    }


def _model_figures(
    model_runs: list[dict[str, Any]], instant: list[dict[str, Any]]
) -> dict[str, Any]:
    """CPU and records per turn at each of ``MODEL_LATENCIES`` (medians), and the 200 ms
    model's CPU over the instant model's, each round's pair taken together."""
    out: dict[str, Any] = {}
    for suffix, latency in MODEL_LATENCIES.items():
        at = [r for r in model_runs if r["model_latency_s"] == latency]
        for key in ("cpu_ms_per_turn", "records_per_turn", "turns_per_s"):
            out[f"{key}_{suffix}_model"] = round(median([r[key] for r in at]), 3) if at else None
    paired = [
        m["cpu_ms_per_turn"] / i["cpu_ms_per_turn"]
        for m, i in zip(
            [r for r in model_runs if r["model_latency_s"] == MODEL_LATENCIES["200ms"]],
            instant,
            strict=False,
        )
        if i["cpu_ms_per_turn"] > 0
    ]
    out["cpu_200ms_model_over_instant"] = round(median(paired), 3) if paired else None
    return out


def _per_step(run: dict[str, Any], one_step_ms: float) -> float:
    """The CPU of each step past the first: ``run``'s turns against one-step turns."""
    return float((run["cpu_ms_per_turn"] - one_step_ms) / (run["steps_per_turn"] - 1))
