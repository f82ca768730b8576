"""What a value stored by reference costs: added latency and CPU per MB, per store.

One in-process worker per store (the local directory, then the real S3 server of
``objects.s3_server``) runs an agent that returns the document it was given, so each turn
stores its value twice by reference (the request's parameter, put by the client before
it produces; the result, put by the worker before its commit) and reads it back twice
(the worker resolves the request, the client the result). Turns run one at a time, with
small values first (under the offload threshold: nothing stored) and then values of each
size. A turn's latency is submit to ``run:complete`` read back whole by the client; its
CPU is this process's (client and worker), and for S3 also the server's, apart.

The per-MB figures are the slope of a least-squares line through (MB stored per turn,
median latency) and (MB stored per turn, CPU per turn), small values included: the cost
of one more MB, whatever a turn's fixed cost. MB stored counts every ``put`` (a value
written twice, say by the request and by an event, counts twice).
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyrula_stream.agent.definition import KafkaAgent, kafka_agent
from pyrula_stream.agent.limits import AgentLimits
from pyrula_stream.bench.harness import agent_topics, drop_topics, in_process_worker, unique
from pyrula_stream.bench.stats import line_fit, median
from pyrula_stream.client.kafka_client import KafkaAgentClient
from pyrula_stream.context.agent_context import AgentContext
from pyrula_stream.llm.fake import FakeLLM
from pyrula_stream.objects.local import LocalObjectStore
from pyrula_stream.objects.s3 import store_from_url
from pyrula_stream.objects.s3_server import local_s3
from pyrula_stream.objects.store import ObjectInfo, ObjectStore
from pyrula_stream.runtime.options import WorkerOptions

MB = 1_000_000
SMALL = 1_000
"""A small value's size: far under the offload threshold, so nothing is stored."""
BUCKET = "pyrula-bench"


class CountingStore:
    """A real store with a count of what was put and read through it."""

    def __init__(self, inner: ObjectStore) -> None:
        self.inner = inner
        self.put_bytes = 0
        self.got_bytes = 0

    @property
    def name(self) -> str:
        return self.inner.name

    def put(self, key: str, data: bytes, content_type: str) -> None:
        self.inner.put(key, data, content_type)
        self.put_bytes += len(data)

    def get(self, key: str) -> bytes:
        data = self.inner.get(key)
        self.got_bytes += len(data)
        return data

    def exists(self, key: str) -> bool:
        return self.inner.exists(key)

    def delete(self, key: str) -> None:
        self.inner.delete(key)

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        return self.inner.list(prefix)


@dataclass
class SizeRun:
    """Turns of one value size on one store."""

    store: str
    value_bytes: int
    turns: int
    latency_p50_ms: float
    cpu_ms_per_turn: float
    mb_put_per_turn: float
    mb_read_per_turn: float
    server_cpu_ms_per_turn: float | None

    def as_dict(self) -> dict[str, Any]:
        return {k: round(v, 2) if isinstance(v, float) else v for k, v in vars(self).items()}


def echo_agent(name: str) -> KafkaAgent:
    @kafka_agent(
        name=name, llm=FakeLLM(None), partitions=1, limits=AgentLimits(max_tool_result_bytes=None)
    )
    async def echo(ctx: AgentContext, document: str) -> str:
        return document

    return echo


def _cpu_s(pid: int | None = None) -> float:
    """CPU seconds (user + system) of this process, or of ``pid``."""
    import psutil  # type: ignore[import-untyped,unused-ignore]

    times = psutil.Process(pid).cpu_times()
    return float(times.user + times.system)


async def _run_sizes(
    bootstrap: str,
    store_name: str,
    store: CountingStore,
    sizes: Sequence[int],
    turns_per_size: int,
    server_pid: int | None,
    keep_topics: bool,
) -> list[SizeRun]:
    agent = echo_agent(unique(f"payloads-{store_name}"))
    runs: list[SizeRun] = []
    try:
        async with (
            in_process_worker(agent, bootstrap, WorkerOptions(object_store=store)),
            KafkaAgentClient(bootstrap, object_store=store) as client,
        ):
            await client.run(agent.name, document="warm", timeout=120)
            for size in (SMALL, *sizes):
                document = "d" * size
                latencies, put0, got0 = [], store.put_bytes, store.got_bytes
                cpu0 = _cpu_s()
                server0 = _cpu_s(server_pid) if server_pid else 0.0
                for _ in range(turns_per_size):
                    started = time.perf_counter()
                    events = await client.run(agent.name, document=document, timeout=300)
                    latencies.append((time.perf_counter() - started) * 1000)
                    if events[-1].type != "run:complete" or events[-1].data["result"] != document:
                        failed = str(events[-1].data)[:300]
                        raise RuntimeError(f"a {size}-byte turn on {store_name}: {failed}")
                cpu = _cpu_s() - cpu0
                runs.append(
                    SizeRun(
                        store_name,
                        size,
                        turns_per_size,
                        median(latencies),
                        cpu * 1000 / turns_per_size,
                        (store.put_bytes - put0) / MB / turns_per_size,
                        (store.got_bytes - got0) / MB / turns_per_size,
                        (_cpu_s(server_pid) - server0) * 1000 / turns_per_size
                        if server_pid
                        else None,
                    )
                )
    finally:
        if not keep_topics:
            await asyncio.to_thread(drop_topics, bootstrap, agent_topics(agent))
    return runs


def _per_mb(runs: Sequence[SizeRun]) -> dict[str, Any]:
    """Slopes over MB put per turn: the latency and CPU of one more MB by reference."""
    mbs = [r.mb_put_per_turn for r in runs]
    latency, _, latency_r2 = line_fit(mbs, [r.latency_p50_ms for r in runs])
    cpu, _, cpu_r2 = line_fit(mbs, [r.cpu_ms_per_turn for r in runs])
    out = {
        "added_latency_ms_per_mb": round(latency, 2),
        "latency_fit_r2": round(latency_r2, 3),
        "cpu_ms_per_mb": round(cpu, 2),
        "cpu_fit_r2": round(cpu_r2, 3),
    }
    if all(r.server_cpu_ms_per_turn is not None for r in runs):
        server, _, _ = line_fit(mbs, [r.server_cpu_ms_per_turn or 0.0 for r in runs])
        out["server_cpu_ms_per_mb"] = round(server, 2)
    return out


async def run_payloads(
    bootstrap: str,
    *,
    sizes: Sequence[int],
    turns_per_size: int,
    stores: Sequence[str] = ("local", "s3"),
    keep_topics: bool = False,
) -> dict[str, Any]:
    """Each store's runs and its per-MB figures."""
    results: dict[str, Any] = {"sizes": list(sizes), "turns_per_size": turns_per_size}
    for name in stores:
        if name == "local":
            folder = Path(tempfile.mkdtemp(prefix="pyrula-bench-objects-"))
            try:
                store = CountingStore(LocalObjectStore(folder))
                runs = await _run_sizes(
                    bootstrap, name, store, sizes, turns_per_size, None, keep_topics
                )
            finally:
                shutil.rmtree(folder, ignore_errors=True)
        else:
            with local_s3(BUCKET) as server:  # started for the phase
                store = CountingStore(store_from_url(server.store_url(BUCKET, "bench/")))
                pid = server.process.pid if server.process is not None else None
                runs = await _run_sizes(
                    bootstrap, name, store, sizes, turns_per_size, pid, keep_topics
                )
        results[name] = {"runs": [r.as_dict() for r in runs], **_per_mb(runs)}
    return results
