"""Runs the phases in order and gathers one results dict (the JSON file's content).

Throughput alternates framework, floor (in its own process) and the framework on
``--processes auto`` worker processes, and ``--baseline-commit``'s framework (A B C D A B
C D ...), and reports medians of per-round ratios, so drift in a noisy machine hits every
side of a pair alike. The first framework run is read back to give the floor the exact
records to write. Latency alternates blocks of the framework and its floor on one schedule.
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

from pyrula_stream.bench.baseline import baseline_tree, run_baseline_framework
from pyrula_stream.bench.concurrency import run_concurrency
from pyrula_stream.bench.cost import run_cost
from pyrula_stream.bench.cpu import STEPS, broker_pid, measure_processes, run_cpu
from pyrula_stream.bench.fairness import run_fairness
from pyrula_stream.bench.floor import FloorLatency, FloorLatencySession, run_floor_process
from pyrula_stream.bench.framework import run_framework
from pyrula_stream.bench.gateway import run_gateway
from pyrula_stream.bench.harness import (
    FLOOR_UNSTABLE,
    cpu_ticks,
    machine,
    neighbours,
    unique,
)
from pyrula_stream.bench.journal_size import run_journal_size
from pyrula_stream.bench.keyed import run_keyed
from pyrula_stream.bench.latency import FrameworkLatency, LatencyRun
from pyrula_stream.bench.long_turns import STEP_COUNTS, run_long_turns
from pyrula_stream.bench.paired import median_of, over_floor, per_turn_ms, throughput_figures
from pyrula_stream.bench.payloads import run_payloads
from pyrula_stream.bench.restore import run_restore
from pyrula_stream.bench.soak import run_soak
from pyrula_stream.bench.subagents import run_subagents
from pyrula_stream.bench.telemetry import run_telemetry_cost
from pyrula_stream.bench.threads import run_threads
from pyrula_stream.runtime.supervisor import process_count

PHASES = (
    "throughput",
    "latency",
    "cpu",
    "long_turns",
    "concurrency",
    "journal",
    "restore",
    "threads",
    "soak",
    "subagents",
    "gateway",
    "fairness",
    "keyed",
    "payloads",
    "cost",
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
    floor_turns: int = 30_000
    """Inputs per floor run: at ~10k inputs/s, 30 transactions over ~3 s, not six in
    0.45 s (whose figure landed in one of two modes)."""
    baseline_commit: str | None = None
    """``--baseline-commit``: an older commit whose framework runs in every round."""
    baseline_tree: Path | None = None
    """Its unpacked source tree (``baseline.baseline_tree``), set when the run starts."""
    latency_turns: int = 2000
    """Per side: the framework and its floor each run this many on the same schedule."""
    latency_blocks: int = 4
    """The latency run's blocks: framework, floor, framework, floor ... on one schedule."""
    telemetry_latency_turns: int = 300
    latency_rate: float = 20.0
    latency_model_s: float = 0.2
    cpu_turns: int = 5000
    cpu_step_turns: int = 250
    """As many as the 20-step turns: as many turns in flight, so commits batch alike."""
    cpu_rounds: int = 5
    """Each a one-process, a two-process and a 20-step run: figures are medians, and a
    round's per-step CPU is paired with its own one-step run."""
    long_turn_steps: int = 20_000
    """Steps per run of each length (20, 200, 1,000 steps a turn; one-step turns alike)."""
    long_turn_concurrency: int = 10
    long_turn_rounds: int = 3
    telemetry_rounds: int = 5
    in_flight: int = 20_000
    in_flight_model_s: float = 5.0
    in_flight_spread: float = 0.5
    """Each model call of the in-flight run takes 5 s x (1 +- 0.5), uniformly drawn."""
    in_flight_waves: int = 2
    in_flight_together: int = 2000
    in_flight_together_model_s: float = 1.0
    """The second in-flight run: every model call takes exactly this, so they return together."""
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
    keyed_rate: float = 2000.0
    keyed_seconds: float = 45.0
    keyed_ttl_s: float = 5.0
    keyed_expiry_interval_s: float = 15.0
    """Three expiries in the load, each of ~30,000 keys: a day's TTL at 2,000 keys/s
    expires 120,000 keys per default 60 s interval; the stall per batch is what counts."""
    payload_sizes: tuple[int, ...] = (1_000_000, 5_000_000, 20_000_000)
    payload_turns: int = 5
    """Turns of each value size on each store (local directory, S3), one at a time."""
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
            "floor_turns": 60,
            "latency_turns": 10,
            "telemetry_latency_turns": 10,
            "latency_blocks": 2,
            "latency_rate": 10.0,
            "cpu_turns": 30,
            "cpu_step_turns": 5,
            "cpu_rounds": 1,
            "long_turn_steps": 200,
            "long_turn_concurrency": 2,
            "long_turn_rounds": 1,
            "telemetry_rounds": 2,
            "in_flight": 20,
            "in_flight_model_s": 1.0,
            "in_flight_waves": 1,
            "in_flight_together": 20,
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
            "keyed_rate": 200.0,
            "keyed_seconds": 6.0,
            "keyed_ttl_s": 1.0,
            "keyed_expiry_interval_s": 2.0,
            "payload_sizes": (1_000_000, 5_000_000),
            "payload_turns": 1,
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


def block_sizes(turns: int, blocks: int) -> list[int]:
    """``turns`` split into ``blocks`` near-equal blocks (no empty one)."""
    blocks = max(1, min(blocks, turns))
    return [turns // blocks + (1 if i < turns % blocks else 0) for i in range(blocks)]


async def _latency_with_floor(
    config: BenchConfig, bootstrap: str, *, read_only: bool
) -> tuple[LatencyRun, FloorLatency]:
    """The framework and its floor taking turns, block by block, on the same schedule
    (the same rate, the same block sizes): one commit per input for the read-only tool,
    two in sequence for the tool with effects. The floor writes the records the
    framework's warm-up turns wrote."""
    commits = 1 if read_only else 2
    what = "read-only tool" if read_only else "tool with effects"
    sizes = block_sizes(config.latency_turns, config.latency_blocks)
    progress(
        f"latency ({what}): {config.latency_turns} turns per side at "
        f"{config.latency_rate:g}/s, {config.latency_model_s * 1000:.0f} ms model, "
        f"{len(sizes)} blocks alternating with the raw loop "
        f"({commits} transaction{'s' if commits > 1 else ''} per input)"
    )
    async with FrameworkLatency(
        bootstrap,
        rate=config.latency_rate,
        model_latency_s=config.latency_model_s,
        partitions=config.partitions,
        keep_topics=config.keep_topics,
        capture=True,
        read_only=read_only,
    ) as framework:
        floor = await asyncio.to_thread(
            FloorLatencySession,
            bootstrap,
            agent=unique("floorlat"),
            rate=config.latency_rate,
            templates=framework.templates,
            partitions=config.partitions,
            keep_topics=config.keep_topics,
            commits=commits,
        )
        await asyncio.to_thread(floor.__enter__)
        try:
            for i, size in enumerate(sizes):
                await framework.block(size)
                await asyncio.to_thread(floor.block, size)
                progress(f"  block {i + 1}/{len(sizes)}: {size} turns on each side")
        finally:
            await asyncio.to_thread(floor.__exit__, None, None, None)
        return framework.result(), floor.result()


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
    baseline: list[dict[str, Any]] = []
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
            broker=broker,
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
                "process_cpu_ms_per_turn": per_turn_ms(run.cpu_s, run.turns),
                "broker_cpu_ms_per_turn": per_turn_ms(run.broker_cpu_s, run.turns),
            }
        )
        progress(
            f"  framework {run.turns_per_s:.1f} turns/s; now the floor, "
            f"{config.floor_turns} inputs in its own process"
        )
        f = await asyncio.to_thread(
            run_floor_process,
            bootstrap,
            turns=config.floor_turns,
            templates=templates,
            partitions=config.partitions,
            batch=config.floor_batch,
            keep_topics=config.keep_topics,
            broker=broker,
        )
        floor.append(
            {
                "turns": f.turns,
                "turns_per_s": round(f.turns_per_s, 1),
                "seconds": round(f.seconds, 3),
                "transactions": f.transactions,
                "records_written": f.records_written,
                "process_cpu_ms_per_turn": per_turn_ms(f.cpu_s, f.turns),
                "broker_cpu_ms_per_turn": per_turn_ms(f.broker_cpu_s, f.turns),
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
        if config.baseline_tree is not None:
            b = await asyncio.to_thread(
                run_baseline_framework,
                config.baseline_tree,
                bootstrap,
                turns=config.turns,
                partitions=config.partitions,
                concurrency=config.framework_concurrency,
            )
            baseline.append(b)
            progress(f"  baseline {config.baseline_commit}: {b['turns_per_s']:.1f} turns/s")
    out: dict[str, Any] = {
        "turns": config.turns,
        "floor_turns": config.floor_turns,
        "partitions": config.partitions,
        "framework_max_concurrent_turns": config.framework_concurrency,
        "floor_max_inputs_per_transaction": config.floor_batch,
        "framework_runs": framework,
        "floor_runs": floor,
        "all_cores_processes": processes,
        "all_cores_runs": all_cores,
        "baseline_commit": config.baseline_commit,
        "baseline_runs": baseline,
        **throughput_figures(
            [r["turns_per_s"] for r in framework],
            [r["turns_per_s"] for r in floor],
            [r["turns_per_s"] for r in all_cores],
            [r["turns_per_s"] for r in baseline],
        ),
        "framework_broker_cpu_ms_per_turn": median_of(framework, "broker_cpu_ms_per_turn"),
        "floor_broker_cpu_ms_per_turn": median_of(floor, "broker_cpu_ms_per_turn"),
        "floor_process_cpu_ms_per_turn": median_of(floor, "process_cpu_ms_per_turn"),
        "written_per_turn": written,
    }
    if out["floor_unstable"]:
        progress(
            f"WARNING: the floor moved {100 * out['floor_spread']:.0f}% between its own runs "
            f"(> {100 * FLOOR_UNSTABLE:.0f}%): a noisy machine; the ratio targets are not judged"
        )
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
    ticks, load_at_start = cpu_ticks(), os.getloadavg()[0]
    minutes = expected_minutes(config)
    progress(
        f"expected duration: about {minutes:.0f} min on 2 cores"
        if minutes >= 1
        else "expected duration: under a minute or two"
    )
    if config.baseline_commit and config.baseline_tree is None:
        config.baseline_tree = baseline_tree(config.baseline_commit)
        progress(
            f"baseline {config.baseline_commit}: its framework runs from {config.baseline_tree}"
        )
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
            "one-tool turns on 200 ms and 2 s models (fresh processes)"
        )
        results["cpu"] = await run_cpu(
            bootstrap,
            turns=config.cpu_turns,
            step_turns=config.cpu_step_turns,
            rounds=config.cpu_rounds,
            partitions=config.partitions,
            concurrency=config.framework_concurrency,
        )
    if "long_turns" in config.phases:
        progress(
            f"long turns: about {config.long_turn_steps} steps of turns of {STEP_COUNTS} "
            f"steps (and one-step turns), {config.long_turn_concurrency} in flight, "
            f"context window on, x {config.long_turn_rounds} rounds (a spawned worker)"
        )
        results["long_turns"] = await run_long_turns(
            bootstrap,
            total_steps=config.long_turn_steps,
            concurrency=config.long_turn_concurrency,
            rounds=config.long_turn_rounds,
            partitions=config.partitions,
        )
    if "concurrency" in config.phases:
        progress(
            f"concurrency: {config.in_flight} in flight x {config.in_flight_waves} waves, "
            f"{config.in_flight_model_s:g} s model +- {config.in_flight_spread:.0%} "
            f"(a spawned worker); then {config.in_flight_together} whose calls return together"
        )
        results["concurrency"] = await run_concurrency(
            bootstrap,
            in_flight=config.in_flight,
            model_latency_s=config.in_flight_model_s,
            waves=config.in_flight_waves,
            partitions=config.partitions,
            spread=config.in_flight_spread,
        )
        results["concurrency"]["together"] = await run_concurrency(
            bootstrap,
            in_flight=config.in_flight_together,
            model_latency_s=config.in_flight_together_model_s,
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
    if "keyed" in config.phases:
        progress(
            f"keyed: {config.keyed_rate:g} keyed turns/s for {config.keyed_seconds:g} s, keys "
            f"expiring after {config.keyed_ttl_s:g} s, every {config.keyed_expiry_interval_s:g} s"
            " (a spawned worker; its event loop's stalls)"
        )
        results["keyed"] = await run_keyed(
            bootstrap,
            rate=config.keyed_rate,
            seconds=config.keyed_seconds,
            ttl_s=config.keyed_ttl_s,
            expiry_interval_s=config.keyed_expiry_interval_s,
            partitions=config.partitions,
        )
    if "payloads" in config.phases:
        progress(
            f"payloads: {config.payload_turns} turns of each of {config.payload_sizes} bytes "
            "and of small values, echoed back by reference, on the local store and on S3"
        )
        results["payloads"] = await run_payloads(
            bootstrap,
            sizes=config.payload_sizes,
            turns_per_size=config.payload_turns,
            keep_topics=config.keep_topics,
        )
    if "cost" in config.phases:
        progress(
            "cost: a 20-step turn with a 2,000-token system prompt on the local Anthropic "
            "server, prompt caching on and off; then the same after a history compaction"
        )
        results["cost"] = await run_cost(
            bootstrap, quick=config.quick, keep_topics=config.keep_topics
        )
        cost = results["cost"]
        progress(
            f"cost: cache_cost_fraction {cost['cache_cost_fraction']}, "
            f"cache_cost_fraction_after_compaction {cost['cache_cost_fraction_after_compaction']}"
        )
    if "telemetry" in config.phases:
        progress(
            f"telemetry: {config.turns} turns x {config.telemetry_rounds} rounds and "
            f"{config.telemetry_latency_turns} latency turns, metrics and tracing off then on"
        )
        results["telemetry"] = await run_telemetry_cost(
            bootstrap,
            turns=config.turns,
            rounds=config.telemetry_rounds,
            partitions=config.partitions,
            concurrency=config.framework_concurrency,
            latency_turns=config.telemetry_latency_turns,
            latency_rate=config.latency_rate,
            latency_model_s=config.latency_model_s,
            keep_topics=config.keep_topics,
        )
    results["seconds"] = round(time.monotonic() - started, 1)
    results["machine"] |= neighbours(ticks, load_at_start)
    tp = results.get("throughput", {})
    results["machine"]["floor_spread"] = tp.get("floor_spread")
    results["machine"]["floor_unstable"] = tp.get("floor_unstable")
    return results


def expected_minutes(config: BenchConfig) -> float:
    """A rough forecast from the sizes (2 cores, quiet machine): the throughput rounds and
    the paired latency runs are computed, the other phases taken at about their last
    measured length."""
    rounds = config.rounds * (
        2 * config.turns / 1500
        + config.floor_turns / 8000
        + 25
        + (config.turns / 400 + 15 if config.baseline_commit else 0)
    )
    latency = 4 * (config.latency_turns / config.latency_rate + 15)
    others = {
        "cpu": 150,
        "concurrency": 60,
        "journal": 15,
        "restore": 40,
        "threads": 40,
        "soak": 150,
        "subagents": 90,
        "gateway": 40,
        "fairness": 30,
        "payloads": 60,
        "cost": 240,
        "telemetry": 120,
    }
    seconds = (rounds if "throughput" in config.phases else 0) + (
        latency if "latency" in config.phases else 0
    )
    seconds += sum(v for k, v in others.items() if k in config.phases)
    return seconds / 60 / (10 if config.quick else 1)
