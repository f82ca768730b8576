"""Framework overhead per turn, with a model that takes 200 ms per call (asyncio sleep).

A turn's time is measured end to end, as its caller sees it: from just before its request
is produced to the moment its ``run:complete`` is read back under ``read_committed``.
Overhead is that time minus the simulated model time (2 calls x latency; the tool answers
at once). Turns are submitted at a steady rate well below the worker's capacity, so the
figure is the cost of one turn's path (poll, the commits it waits for, read-back), not of
a queue. The workload's tool is ``read_only`` by default; ``read_only=False`` prices a
tool with effects, whose turn waits for the model's response to be durable first.
The worker's own view, ``run:complete.ts_ms - run:start.ts_ms - model time``, is reported
beside it: the part spent between building the first and the last event.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field
from typing import Any

from pyrula_stream.bench.framework import TurnRecords, capture_agent
from pyrula_stream.bench.harness import agent_topics, drop_topics, in_process_worker, unique
from pyrula_stream.bench.load import CompletionReader, Submitter, turn_requests
from pyrula_stream.bench.stats import percentile
from pyrula_stream.bench.workload import QUESTION, tool_turn_agent
from pyrula_stream.runtime.worker import WorkerOptions
from pyrula_stream.testing import wait_for

MODEL_CALLS = 2


@dataclass
class LatencyRun:
    turns: int
    rate_per_s: float
    model_latency_s: float
    overheads_ms: list[float] = field(repr=False)
    in_worker_ms: list[float] = field(repr=False)
    pickup_ms: list[float] = field(default_factory=list, repr=False)
    """Request produced -> ``run:start`` stamped by the worker (clocks of one machine)."""
    finish_ms: list[float] = field(default_factory=list, repr=False)
    """``run:complete`` stamped -> read back committed: the terminal commit and read-back."""
    commits: int = 0
    commit_ms_mean: float = 0.0
    templates: list[TurnRecords] = field(default_factory=list, repr=False)

    def summary(self) -> dict[str, float | None]:
        o, w = self.overheads_ms, self.in_worker_ms
        return {
            "turns": self.turns,
            "rate_per_s": self.rate_per_s,
            "model_latency_ms": self.model_latency_s * 1000,
            "overhead_p50_ms": round(percentile(o, 50), 1),
            "overhead_p90_ms": round(percentile(o, 90), 1),
            "overhead_p99_ms": round(percentile(o, 99), 1),
            "overhead_max_ms": round(max(o), 1),
            "in_worker_overhead_p50_ms": round(percentile(w, 50), 1),
            "in_worker_overhead_p99_ms": round(percentile(w, 99), 1),
            "pickup_p50_ms": round(percentile(self.pickup_ms, 50), 1) if self.pickup_ms else None,
            "finish_p50_ms": round(percentile(self.finish_ms, 50), 1) if self.finish_ms else None,
            "commits": self.commits,
            "commit_ms_mean": round(self.commit_ms_mean, 1),
        }


class FrameworkLatency:
    """A warmed-up worker that times paced blocks of turns, one block at a time.

    The latency phase alternates blocks with its floor (``floor.FloorLatencySession``) on
    the same schedule, so drift on a shared machine falls on both sides alike; the
    records of the warm-up turns are read back on entry (``templates``) for the floor to
    write. ``result()`` gathers every block's samples, in schedule order.
    """

    def __init__(
        self,
        bootstrap: str,
        *,
        rate: float,
        model_latency_s: float,
        partitions: int,
        warmup: int = 10,
        keep_topics: bool = False,
        telemetry: bool = True,
        capture: bool = False,
        read_only: bool = True,
    ) -> None:
        self.bootstrap, self.rate, self.partitions = bootstrap, rate, partitions
        self.model_latency_s, self.warmup, self.capture = model_latency_s, warmup, capture
        self.keep_topics, self.telemetry = keep_topics, telemetry
        self.agent = tool_turn_agent(
            unique("lat"), latency_s=model_latency_s, partitions=partitions, read_only=read_only
        )
        self.templates: list[TurnRecords] = []
        self.sent: dict[bytes, float] = {}
        self._stack = contextlib.AsyncExitStack()
        self._submitter = Submitter(bootstrap)
        self._reader: CompletionReader | None = None
        self._worker: Any = None
        self._timed = 0

    async def __aenter__(self) -> FrameworkLatency:
        try:
            self._worker = await self._stack.enter_async_context(
                in_process_worker(
                    self.agent,
                    self.bootstrap,
                    WorkerOptions(max_concurrent_turns=1000, telemetry=self.telemetry),
                )
            )
            reader = CompletionReader(
                self.bootstrap, self.agent.topics.events, self.partitions, keep_ts=True
            )
            self._reader = reader
            self._stack.callback(reader.close)
            warm = turn_requests(self.agent.name, self.warmup, QUESTION)
            await asyncio.to_thread(self._submitter.send_all, self.agent.topics.turns, warm)
            await wait_for(lambda: reader.reached(self.warmup), 120, "latency warm-up")
            if self.capture:
                self.templates, _ = await asyncio.to_thread(
                    capture_agent, self.bootstrap, self.agent
                )
        except BaseException:
            await self.__aexit__(None, None, None)
            raise
        return self

    async def block(self, turns: int) -> None:
        """Send ``turns`` turns at the paced rate and wait until all are read back."""
        reader = self._reader
        assert reader is not None, "enter the session first"
        timed = turn_requests(self.agent.name, turns, QUESTION)
        sent = await asyncio.to_thread(
            self._submitter.send_paced, self.agent.topics.turns, timed, self.rate
        )
        self._timed += turns
        done = self.warmup + self._timed
        await wait_for(
            lambda: reader.reached(done),
            120 + turns * MODEL_CALLS * self.model_latency_s,
            f"latency run: {reader.terminal - self.warmup}/{self._timed} turns completed",
        )
        self.sent.update(sent)

    async def __aexit__(self, *exc: object) -> None:
        try:
            await self._stack.aclose()
        finally:
            self._submitter.close()
            if not self.keep_topics:
                await asyncio.to_thread(drop_topics, self.bootstrap, agent_topics(self.agent))

    def result(self) -> LatencyRun:
        """Every timed turn's samples, in the order they were sent."""
        reader, sent = self._reader, self.sent
        assert reader is not None and self._worker is not None
        model_s = MODEL_CALLS * self.model_latency_s
        overheads = [(reader.done[k] - t) * 1000 - model_s * 1000 for k, t in sent.items()]
        in_worker = [
            reader.end_ts_ms[k] - reader.start_ts_ms[k] - model_s * 1000
            for k in sent
            if k in reader.start_ts_ms and k in reader.end_ts_ms
        ]
        wall = time.time() - time.monotonic()  # the event stamps are wall-clock ms
        pickup = [
            reader.start_ts_ms[k] - 1000 * (t + wall)
            for k, t in sent.items()
            if k in reader.start_ts_ms
        ]
        finish = [
            1000 * (reader.done[k] + wall) - reader.end_ts_ms[k]
            for k in sent
            if k in reader.end_ts_ms
        ]
        stats = self._worker.committer.stats
        return LatencyRun(
            len(sent),
            self.rate,
            self.model_latency_s,
            overheads,
            in_worker,
            pickup,
            finish,
            stats.commits,
            1000 * stats.seconds / max(1, stats.commits),
            self.templates,
        )


async def run_latency(
    bootstrap: str,
    *,
    turns: int,
    rate: float,
    model_latency_s: float,
    partitions: int,
    warmup: int = 10,
    keep_topics: bool = False,
    telemetry: bool = True,
    capture: bool = False,
    read_only: bool = True,
) -> LatencyRun:
    """Warm the worker up with a few turns, then time ``turns`` turns sent at ``rate``/s
    in one block; ``capture`` reads back what the warm-up turns wrote (for the latency
    floor to write); ``read_only=False`` runs the tool with effects (one more commit
    waited on)."""
    async with FrameworkLatency(
        bootstrap,
        rate=rate,
        model_latency_s=model_latency_s,
        partitions=partitions,
        warmup=warmup,
        keep_topics=keep_topics,
        telemetry=telemetry,
        capture=capture,
        read_only=read_only,
    ) as session:
        await session.block(turns)
        return session.result()
