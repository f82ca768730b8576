"""Throughput of the framework: N one-tool turns through an in-process worker.

Turns/s is counted from the first submit to the moment the last ``run:complete`` is read
back under ``read_committed``: what a caller of the agent would observe. After a run the
journal, events and results topics are read back, so the floor can write the same records.
"""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pyrula_stream.agent.definition import KafkaAgent
from pyrula_stream.bench.harness import (
    agent_topics,
    drop_topics,
    in_process_worker,
    process_cpu_s,
    unique,
)
from pyrula_stream.bench.load import (
    CompletionReader,
    Headers,
    Submitter,
    read_records,
    turn_requests,
)
from pyrula_stream.bench.workload import QUESTION, tool_turn_agent
from pyrula_stream.runtime.worker import WorkerOptions
from pyrula_stream.testing import wait_for

TurnRecords = list[tuple[str, bytes, bytes | None, Headers]]
"""One turn's output: ``("journal" | "events" | "results", key, value, headers)``, each
topic's records in write order."""


@dataclass
class FrameworkRun:
    turns: int
    seconds: float
    commits: int
    records_committed: int
    commit_seconds: float
    templates: list[TurnRecords] = field(default_factory=list, repr=False)
    written: dict[str, float] = field(default_factory=dict)
    cpu_s: float = 0.0
    """CPU time of this process over the timed window (worker, submitter, reader)."""
    broker_cpu_s: float | None = None
    """The broker's CPU time over the same window (None: no local broker to read)."""

    @property
    def turns_per_s(self) -> float:
        return self.turns / self.seconds


async def run_framework(
    bootstrap: str,
    *,
    turns: int,
    partitions: int,
    concurrency: int,
    capture: bool = False,
    profile_to: Path | None = None,
    keep_topics: bool = False,
    telemetry: bool = True,
    steps: int = 1,
    broker: int | None = None,
) -> FrameworkRun:
    """One framework run; ``capture`` reads back what it wrote, ``profile_to`` profiles it,
    ``steps`` model-and-tool steps per turn, ``broker`` the broker's pid (its CPU time
    over the timed window is recorded)."""
    agent = tool_turn_agent(unique("tput"), latency_s=0.0, partitions=partitions, steps=steps)
    requests = turn_requests(agent.name, turns, QUESTION)
    options = WorkerOptions(max_concurrent_turns=concurrency, telemetry=telemetry)
    submitter = Submitter(bootstrap)
    try:
        async with in_process_worker(agent, bootstrap, options) as worker:
            reader = CompletionReader(bootstrap, agent.topics.events, partitions)
            profiler = _start_profiler() if profile_to is not None else None
            try:
                cpu0, broker0 = time.process_time(), process_cpu_s(broker)
                started = await asyncio.to_thread(submitter.send_all, agent.topics.turns, requests)
                await wait_for(
                    lambda: reader.reached(turns),
                    max(120.0, turns / 10),
                    f"framework run: {reader.terminal}/{turns} turns completed",
                )
                seconds = reader.last_done - started
                cpu_s, broker1 = time.process_time() - cpu0, process_cpu_s(broker)
            finally:
                if profiler is not None and profile_to is not None:
                    _save_profile(profiler, profile_to)
                reader.close()
            stats = worker.committer.stats
            run = FrameworkRun(turns, seconds, stats.commits, stats.records, stats.seconds)
            run.cpu_s = cpu_s
            if broker0 is not None and broker1 is not None:
                run.broker_cpu_s = broker1 - broker0
        if capture:
            run.templates, run.written = await asyncio.to_thread(capture_agent, bootstrap, agent)
        return run
    finally:
        submitter.close()
        if not keep_topics:
            await asyncio.to_thread(drop_topics, bootstrap, agent_topics(agent))


def capture_agent(bootstrap: str, agent: KafkaAgent) -> tuple[list[TurnRecords], dict[str, float]]:
    """``capture_turns`` of everything an agent's turns write: journal, events, results."""
    t = agent.topics
    return capture_turns(bootstrap, t.journal, t.events, t.results, agent.partitions)


def capture_turns(
    bootstrap: str, journal: str, events: str, results: str, partitions: int
) -> tuple[list[TurnRecords], dict[str, float]]:
    """Group the journal, events and result records by turn; also what one turn wrote on
    average. The result record is part of what the floor writes: the framework writes one
    per turn to ``<agent>.results``, so a floor without it would compare unlike with like."""
    by_turn: dict[str, TurnRecords] = defaultdict(list)
    sizes: dict[str, list[tuple[str, int, bool]]] = defaultdict(list)
    for kind, topic in (("journal", journal), ("events", events), ("results", results)):
        for _, key, value, headers in read_records(bootstrap, topic, partitions):
            turn_id = key.split("/", 1)[0]
            hdrs: Headers = [(k, v.encode()) for k, v in headers.items()]
            by_turn[turn_id].append((kind, key.encode(), value, hdrs))
            size = len(key) + len(value or b"") + sum(len(k) + len(v) for k, v in headers.items())
            sizes[turn_id].append((kind, size, value is None))
    # Partition-level journal records (``cursor/...``: the intake mark, the replies
    # position) belong to no turn: a group without events is not a turn's template.
    turn_ids = [t for t, records in by_turn.items() if any(r[0] == "events" for r in records)]
    totals: dict[str, float] = defaultdict(float)
    for turn_id in turn_ids:
        for kind, size, tombstone in sizes[turn_id]:
            totals[f"{kind}_records"] += 1
            totals[f"{kind}_bytes"] += size
            if tombstone:
                totals[f"{kind}_tombstones"] += 1
    n = max(1, len(turn_ids))
    per_turn = {f"{k}_per_turn": round(v / n, 2) for k, v in sorted(totals.items())}
    return [by_turn[t] for t in turn_ids], per_turn


def _start_profiler() -> Any:
    from pyinstrument import Profiler

    # The worker's event loop runs in this thread; "disabled" samples the whole thread
    # rather than one task, so every turn's coroutines and the committer show up.
    profiler = Profiler(interval=0.001, async_mode="disabled")
    profiler.start()
    return profiler


def _save_profile(profiler: Any, path: Path) -> None:
    profiler.stop()
    path.parent.mkdir(parents=True, exist_ok=True)
    # Text, not HTML: pyinstrument's page embeds every sample (10+ MB for one run).
    path.with_suffix(".txt").write_text(profiler.output_text(show_all=False))
    flat = profiler.output_text(flat=True, flat_time="self")
    path.with_name(path.stem + "-flat.txt").write_text(flat)
