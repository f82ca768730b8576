"""Runs the phases in order and gathers one results dict (the JSON file's content).

Throughput alternates framework, floor and the framework on ``--processes auto`` worker
processes (A B C A B C ...) so drift in a noisy machine hits every side alike, and
reports the medians. The first framework run is read back to give the floor the exact
records to write.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pyrula_stream.bench.concurrency import run_concurrency
from pyrula_stream.bench.cpu import LONG_STEPS, STEPS, broker_pid, measure_processes, run_cpu
from pyrula_stream.bench.fairness import run_fairness
from pyrula_stream.bench.floor import FloorLatency, run_floor, run_floor_latency
from pyrula_stream.bench.framework import run_framework
from pyrula_stream.bench.gateway import run_gateway
from pyrula_stream.bench.harness import machine, unique
from pyrula_stream.bench.journal_size import run_journal_size
from pyrula_stream.bench.latency import LatencyRun, run_latency
from pyrula_stream.bench.load import turn_requests
from pyrula_stream.bench.restore import run_restore
from pyrula_stream.bench.soak import run_soak
from pyrula_stream.bench.stats import median, percentile
from pyrula_stream.bench.subagents import run_subagents
from pyrula_stream.bench.telemetry import run_telemetry_cost
from pyrula_stream.bench.threads import run_threads
from pyrula_stream.bench.workload import QUESTION
from pyrula_stream.runtime.supervisor import process_count

PHASES = (
    "throughput",
    "latency",
    "cpu",
    "concurrency",
    "journal",
    "restore",
    "threads",
    "soak",
    "subagents",
    "gateway",
    "fairness",
    "telemetry",
)
"""``telemetry`` runs last: it installs the OpenTelemetry SDK for the rest of the process."""


@dataclass
class BenchConfig:
    """Sizes of every phase; ``quick()`` shrinks them to prove the bench still works."""

    turns: int = 5000
    rounds: int = 3
    partitions: int = 6
    framework_concurrency: int = 500
    floor_batch: int = 1000
    latency_turns: int = 300
    latency_rate: float = 20.0
    latency_model_s: float = 0.2
    cpu_turns: int = 5000
    cpu_step_turns: int = 250
    cpu_long_turns: int = 250
    """As many as the 20-step turns: as many turns in flight, so commits batch alike."""
    cpu_rounds: int = 5
    """Each a one-process, a two-process and a 20-step run: figures are medians, and a
    round's per-step CPU is paired with its own one-step run."""
    telemetry_rounds: int = 5
    in_flight: int = 2000
    in_flight_model_s: float = 1.0
    in_flight_waves: int = 2
    journal_steps: tuple[int, ...] = (1, 5, 20)
    journal_turns: int = 50
    restore_sizes: tuple[int, ...] = (10_000, 100_000)
    restore_repeats: int = 3
    thread_restore_threads: int = 10_000
    thread_turns: int = 5
    memory_samples: int = 100
    soak_turns: int = 200_000
    soak_warmup: int = 5_000
    parked_turns: int = 50_000
    call_round_trips: int = 100
    gateway_streams: int = 5000
    fairness_flood: int = 5000
    fairness_paced: int = 50
    phases: tuple[str, ...] = PHASES
    profile: bool = False
    quick: bool = False
    keep_topics: bool = False
    out_dir: Path = field(default_factory=lambda: Path("bench/results"))

    @classmethod
    def quick_sizes(cls, **overrides: Any) -> BenchConfig:
        sizes: dict[str, Any] = {
            "turns": 30,
            "rounds": 2,
            "latency_turns": 10,
            "latency_rate": 10.0,
            "cpu_turns": 30,
            "cpu_step_turns": 5,
            "cpu_long_turns": 5,
            "cpu_rounds": 1,
            "telemetry_rounds": 2,
            "in_flight": 20,
            "in_flight_waves": 1,
            "journal_turns": 2,
            "restore_sizes": (200, 1000),
            "restore_repeats": 1,
            "thread_restore_threads": 200,
            "thread_turns": 3,
            "memory_samples": 10,
            "soak_turns": 1000,
            "soak_warmup": 200,
            "parked_turns": 200,
            "call_round_trips": 5,
            "gateway_streams": 10,
            "fairness_flood": 200,
            "fairness_paced": 10,
            "quick": True,
        }
        return cls(**{**sizes, **overrides})


def progress(message: str) -> None:
    """Progress goes to stderr: stdout ends with the JSON line and nothing after it."""
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def git_commit() -> str | None:
    """The checked-out commit (short), so a results file can serve as a ``--baseline``."""
    import subprocess

    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def over_floor(overheads_ms: list[float], floor_ms: list[float]) -> dict[str, float]:
    """The latency floor and the framework's overhead above it, p50 and p99.

    The framework's overhead already has the model's time taken out; the floor calls no
    model, so its whole end-to-end time is the floor. Each percentile is taken on its own
    side, then subtracted.
    """
    floor50, floor99 = percentile(floor_ms, 50), percentile(floor_ms, 99)
    return {
        "latency_floor_p50_ms": round(floor50, 1),
        "latency_floor_p99_ms": round(floor99, 1),
        "overhead_over_floor_p50_ms": round(percentile(overheads_ms, 50) - floor50, 1),
        "overhead_over_floor_p99_ms": round(percentile(overheads_ms, 99) - floor99, 1),
    }


async def _latency_with_floor(
    config: BenchConfig, bootstrap: str, *, read_only: bool
) -> tuple[LatencyRun, FloorLatency]:
    """One framework latency run and, right after it, its floor at the same rate: one
    commit per input for the read-only tool, two in sequence for the tool with effects."""
    commits = 1 if read_only else 2
    what = "read-only tool" if read_only else "tool with effects"
    progress(
        f"latency ({what}): {config.latency_turns} turns at {config.latency_rate:g}/s, "
        f"{config.latency_model_s * 1000:.0f} ms model"
    )
    lat = await run_latency(
        bootstrap,
        turns=config.latency_turns,
        rate=config.latency_rate,
        model_latency_s=config.latency_model_s,
        partitions=config.partitions,
        keep_topics=config.keep_topics,
        capture=True,
        read_only=read_only,
    )
    progress(
        f"latency floor: the raw loop at {config.latency_rate:g}/s, "
        f"{commits} transaction{'s' if commits > 1 else ''} per input"
    )
    floor = await asyncio.to_thread(
        run_floor_latency,
        bootstrap,
        agent=unique("floorlat"),
        turns=config.latency_turns,
        rate=config.latency_rate,
        templates=lat.templates,
        partitions=config.partitions,
        keep_topics=config.keep_topics,
        commits=commits,
    )
    return lat, floor


async def run_latency_phase(config: BenchConfig, bootstrap: str) -> dict[str, Any]:
    """The read-only tool against the one-commit floor (today's keys), then the tool with
    effects against the two-commit floor (``*_effect_*`` keys)."""
    lat, floor = await _latency_with_floor(config, bootstrap, read_only=True)
    effect, floor2 = await _latency_with_floor(config, bootstrap, read_only=False)
    e = effect.summary()
    return {
        **lat.summary(),
        **over_floor(lat.overheads_ms, floor.latencies_ms),
        **{
            k.replace("latency_floor", "latency_floor_two_commit").replace(
                "over_floor", "over_floor_effect"
            ): v
            for k, v in over_floor(effect.overheads_ms, floor2.latencies_ms).items()
        },
        "floor_transactions": floor.transactions,
        "overheads_ms": [round(v, 1) for v in lat.overheads_ms],
        "in_worker_ms": [round(v, 1) for v in lat.in_worker_ms],
        "floor_latencies_ms": [round(v, 1) for v in floor.latencies_ms],
        "effect_overhead_p50_ms": e["overhead_p50_ms"],
        "effect_overhead_p99_ms": e["overhead_p99_ms"],
        "effect_in_worker_overhead_p50_ms": e["in_worker_overhead_p50_ms"],
        "effect_pickup_p50_ms": e["pickup_p50_ms"],
        "effect_finish_p50_ms": e["finish_p50_ms"],
        "effect_commits": e["commits"],
        "effect_commit_ms_mean": e["commit_ms_mean"],
        "floor_two_commit_transactions": floor2.transactions,
        "effect_overheads_ms": [round(v, 1) for v in effect.overheads_ms],
        "floor_two_commit_latencies_ms": [round(v, 1) for v in floor2.latencies_ms],
    }


async def run_throughput(config: BenchConfig, bootstrap: str, stamp: str) -> dict[str, Any]:
    framework: list[dict[str, Any]] = []
    floor: list[dict[str, Any]] = []
    templates: list[Any] = []
    written: dict[str, float] = {}
    all_cores: list[dict[str, Any]] = []
    processes = process_count("auto")  # what `pyrula-stream worker --processes auto` runs
    broker, cores = broker_pid(bootstrap), os.cpu_count() or 1
    for i in range(config.rounds):
        progress(f"throughput round {i + 1}/{config.rounds}: framework, {config.turns} turns")
        run = await run_framework(
            bootstrap,
            turns=config.turns,
            partitions=config.partitions,
            concurrency=config.framework_concurrency,
            capture=not templates,
            keep_topics=config.keep_topics,
        )
        if not templates:
            templates, written = run.templates, run.written
        framework.append(
            {
                "turns_per_s": round(run.turns_per_s, 1),
                "seconds": round(run.seconds, 3),
                "commits": run.commits,
                "records_committed": run.records_committed,
                "commit_ms_mean": round(1000 * run.commit_seconds / max(1, run.commits), 1),
            }
        )
        progress(f"  framework {run.turns_per_s:.1f} turns/s; now the floor")
        requests = turn_requests("floor", config.turns, QUESTION)
        f = await asyncio.to_thread(
            run_floor,
            bootstrap,
            requests=requests,
            templates=templates,
            partitions=config.partitions,
            batch=config.floor_batch,
            keep_topics=config.keep_topics,
        )
        floor.append(
            {
                "turns_per_s": round(f.turns_per_s, 1),
                "seconds": round(f.seconds, 3),
                "transactions": f.transactions,
                "records_written": f.records_written,
            }
        )
        progress(f"  floor {f.turns_per_s:.1f} turns/s; now {processes} worker processes")
        many = await measure_processes(
            bootstrap,
            processes=processes,
            steps=1,
            turns=config.turns,
            warmup=0,  # as the one-process run and the floor: none warms up
            partitions=config.partitions,
            concurrency=config.framework_concurrency,
            broker=broker,
            cores=cores,
        )
        all_cores.append(many)
        progress(f"  {processes} processes {many['turns_per_s']:.1f} turns/s")
    fw = median([r["turns_per_s"] for r in framework])
    fl = median([r["turns_per_s"] for r in floor])
    fa = median([r["turns_per_s"] for r in all_cores])
    out: dict[str, Any] = {
        "turns": config.turns,
        "partitions": config.partitions,
        "framework_max_concurrent_turns": config.framework_concurrency,
        "floor_max_inputs_per_transaction": config.floor_batch,
        "framework_runs": framework,
        "floor_runs": floor,
        "framework_turns_per_s": round(fw, 1),
        "floor_turns_per_s": round(fl, 1),
        "ratio": round(fw / fl, 4),
        "all_cores_processes": processes,
        "all_cores_runs": all_cores,
        "turns_per_s_all_cores": round(fa, 1),
        "ratio_all_cores": round(fa / fl, 4),
        "written_per_turn": written,
    }
    if config.profile:
        path = config.out_dir / f"{stamp}-profile"
        progress(f"profiling one more framework run (not counted) into {path}.txt")
        profiled = await run_framework(
            bootstrap,
            turns=min(config.turns, 2000),
            partitions=config.partitions,
            concurrency=config.framework_concurrency,
            profile_to=path,
            keep_topics=config.keep_topics,
        )
        out["profile"] = {
            "tree": str(path.with_suffix(".txt")),
            "flat": str(path.with_name(path.stem + "-flat.txt")),
            "turns_per_s_under_profiler": round(profiled.turns_per_s, 1),
        }
    return out


async def run_all(config: BenchConfig, bootstrap: str, broker: str) -> dict[str, Any]:
    """Every selected phase; the results dict also holds the machine and the config."""
    started = time.monotonic()
    now = datetime.now(UTC)
    stamp = now.strftime("%Y-%m-%dT%H%M%SZ")
    results: dict[str, Any] = {
        "date": now.isoformat(timespec="seconds"),
        "stamp": stamp,
        "command": "python -m pyrula_stream.bench " + " ".join(sys.argv[1:]),
        "commit": git_commit(),
        "machine": machine(),
        "broker": broker,
        "config": {k: str(v) if isinstance(v, Path) else v for k, v in asdict(config).items()},
    }
    if "throughput" in config.phases:
        results["throughput"] = await run_throughput(config, bootstrap, stamp)
    if "latency" in config.phases:
        results["latency"] = await run_latency_phase(config, bootstrap)
    if "cpu" in config.phases:
        progress(
            f"cpu: {config.cpu_turns} turns on 1 then 2 worker processes "
            f"and {config.cpu_step_turns} turns of {STEPS} steps, x {config.cpu_rounds} rounds; "
            f"{config.cpu_long_turns} of {LONG_STEPS} (fresh processes)"
        )
        results["cpu"] = await run_cpu(
            bootstrap,
            turns=config.cpu_turns,
            step_turns=config.cpu_step_turns,
            long_turns=config.cpu_long_turns,
            rounds=config.cpu_rounds,
            partitions=config.partitions,
            concurrency=config.framework_concurrency,
        )
    if "concurrency" in config.phases:
        progress(
            f"concurrency: {config.in_flight} in flight x {config.in_flight_waves} waves, "
            f"{config.in_flight_model_s:g} s model (a spawned worker)"
        )
        results["concurrency"] = await run_concurrency(
            bootstrap,
            in_flight=config.in_flight,
            model_latency_s=config.in_flight_model_s,
            waves=config.in_flight_waves,
            partitions=config.partitions,
        )
    if "journal" in config.phases:
        progress(f"journal: turns of {config.journal_steps} steps, {config.journal_turns} each")
        results["journal"] = await run_journal_size(
            bootstrap,
            steps=config.journal_steps,
            turns_per_size=config.journal_turns,
            keep_topics=config.keep_topics,
        )
    if "restore" in config.phases:
        progress(f"restore: journals of {config.restore_sizes} live entries")
        results["restore"] = await run_restore(
            bootstrap,
            sizes=config.restore_sizes,
            repeats=config.restore_repeats,
            keep_topics=config.keep_topics,
        )
    if "threads" in config.phases:
        progress(
            f"threads: restore {config.thread_restore_threads} threads of "
            f"{config.thread_turns} turns; memory visibility x {config.memory_samples}"
        )
        results["threads"] = await run_threads(
            bootstrap,
            threads=config.thread_restore_threads,
            turns=config.thread_turns,
            memory_samples=config.memory_samples,
            keep_topics=config.keep_topics,
        )
    if "soak" in config.phases:
        progress(
            f"soak: {config.soak_turns} turns after {config.soak_warmup} warm-up "
            "(worker in a fresh process)"
        )
        results["soak"] = await run_soak(
            bootstrap,
            turns=config.soak_turns,
            warmup=config.soak_warmup,
            partitions=config.partitions,
        )
    if "subagents" in config.phases:
        progress(
            f"subagents: {config.parked_turns} parked turns, "
            f"{config.call_round_trips} call_agent round trips"
        )
        results["subagents"] = await run_subagents(
            bootstrap,
            parked=config.parked_turns,
            round_trips=config.call_round_trips,
            partitions=config.partitions,
            keep_topics=config.keep_topics,
        )
    if "gateway" in config.phases:
        progress(
            f"gateway: {config.gateway_streams} SSE streams on one gateway process, "
            "against KafkaAgentClient.stream"
        )
        results["gateway"] = await run_gateway(
            bootstrap, streams=config.gateway_streams, keep_topics=config.keep_topics
        )
    if "fairness" in config.phases:
        progress(
            f"fairness: tenant A floods {config.fairness_flood} turns, tenant B sends "
            f"{config.fairness_paced} paced turns (and as many alone first)"
        )
        results["fairness"] = await run_fairness(
            bootstrap,
            flood=config.fairness_flood,
            paced=config.fairness_paced,
            partitions=config.partitions,
            keep_topics=config.keep_topics,
        )
    if "telemetry" in config.phases:
        progress(
            f"telemetry: {config.turns} turns x {config.telemetry_rounds} rounds and "
            f"{config.latency_turns} latency turns, metrics and tracing off then on"
        )
        results["telemetry"] = await run_telemetry_cost(
            bootstrap,
            turns=config.turns,
            rounds=config.telemetry_rounds,
            partitions=config.partitions,
            concurrency=config.framework_concurrency,
            latency_turns=config.latency_turns,
            latency_rate=config.latency_rate,
            latency_model_s=config.latency_model_s,
            keep_topics=config.keep_topics,
        )
    results["seconds"] = round(time.monotonic() - started, 1)
    return results
