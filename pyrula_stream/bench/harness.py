"""What every bench phase needs: a broker, an in-process worker, topic clean-up, the machine.

The in-process worker is ``pyrula_stream.testing.running_worker`` (that module imports
pytest only when it is installed), waiting until the worker owns every partition.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import platform
import uuid
from collections.abc import AsyncIterator, Iterator, Mapping
from typing import Any

from pyrula_stream.agent.definition import KafkaAgent
from pyrula_stream.kafka.admin import TopicSpec, admin_client, apply_topics
from pyrula_stream.kafka.consumers import reader_consumer
from pyrula_stream.kafka.offsets import watermarks
from pyrula_stream.runtime import event_loop
from pyrula_stream.runtime.collector import tune_for_worker
from pyrula_stream.runtime.worker import KafkaWorker, WorkerOptions
from pyrula_stream.testing import running_worker

log = logging.getLogger(__name__)

BOOTSTRAP_ENV = "KAFKA_BOOTSTRAP_SERVERS"
PREFIX = "bench"


def unique(base: str) -> str:
    """A fresh agent name, so runs sharing a broker never share topics."""
    return f"{base}{uuid.uuid4().hex[:8]}"


@contextlib.contextmanager
def kafka(bootstrap_servers: str | None) -> Iterator[tuple[str, str]]:
    """Yield ``(bootstrap, description)``: the given cluster, or a local broker we start."""
    given = bootstrap_servers or os.environ.get(BOOTSTRAP_ENV)
    if given:
        yield given, f"given cluster at {given}"
        return
    from pyrula_stream.kafka.local.broker import KAFKA_VERSION, start_local_broker

    broker = start_local_broker()
    try:
        yield (
            broker.bootstrap_servers,
            f"local Apache Kafka {KAFKA_VERSION} (KRaft, one node, same machine)",
        )
    finally:
        broker.stop()


def create_topics(bootstrap_servers: str, specs: list[TopicSpec], timeout_s: float = 60.0) -> None:
    """Create topics and wait until every partition answers a watermark query.

    A partition can be in the metadata before its leader serves it; a worker assigned it
    then fails its restore with NOT_LEADER_FOR_PARTITION inside the rebalance callback
    (seen on a busy 2-core machine), so the bench creates topics before any client uses them.
    """
    apply_topics(bootstrap_servers, specs)
    consumer = reader_consumer(bootstrap_servers, client_id=unique("bench-ready"))
    try:
        for spec in specs:
            for p in range(spec.partitions):
                watermarks(consumer, spec.name, p, timeout_s=timeout_s)
    finally:
        consumer.close()


@contextlib.asynccontextmanager
async def in_process_worker(
    agent: KafkaAgent,
    bootstrap_servers: str,
    options: WorkerOptions | None = None,
    *,
    timeout_s: float = 60.0,
    create: bool = True,
) -> AsyncIterator[KafkaWorker]:
    """Run a worker in this event loop until it owns every partition; stop it on exit.

    ``create=False`` when the caller already made the topics (and times the start).
    """
    if create:
        await asyncio.to_thread(create_topics, bootstrap_servers, agent.topic_specs())
    tune_for_worker()  # as run_worker does in a worker's own process
    async with running_worker(
        agent, bootstrap_servers, options, all_partitions=True, timeout_s=timeout_s
    ) as worker:
        yield worker


def drop_topics(bootstrap_servers: str, names: list[str]) -> None:
    """Delete the bench's topics so a shared cluster does not fill up with them."""
    if not names:
        return
    # The client must outlive the futures: a temporary one was freed at once, its requests
    # never sent and the failures suppressed, so every run's topics stayed on the broker
    # (and each later round ran against a broker with more partitions to look after).
    admin = admin_client(bootstrap_servers)
    futures = admin.delete_topics(names, operation_timeout=30)
    for fut in futures.values():
        with contextlib.suppress(Exception):
            fut.result()


def process_cpu_s(pid: int | None) -> float | None:
    """CPU seconds so far of a process and its children (the broker's JVM; None: no pid
    or the process is gone)."""
    if pid is None:
        return None
    import psutil  # type: ignore[import-untyped,unused-ignore]

    try:
        process = psutil.Process(pid)
        total = 0.0
        for p in (process, *process.children(recursive=True)):
            with contextlib.suppress(psutil.Error):
                t = p.cpu_times()
                total += t.user + t.system
        return total
    except psutil.Error:
        return None


def agent_topics(agent: KafkaAgent) -> list[str]:
    return [spec.name for spec in agent.topic_specs()]


def machine() -> dict[str, Any]:
    """Cores, memory and versions: a figure means little without the machine it came from."""
    import confluent_kafka
    import psutil  # type: ignore[import-untyped,unused-ignore]

    model = platform.processor() or ""
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return {
        "cpu": model,
        "logical_cores": os.cpu_count(),
        "physical_cores": psutil.cpu_count(logical=False),
        "memory_gb": round(psutil.virtual_memory().total / 2**30, 1),
        "os": f"{platform.system()} {platform.release()}",
        "load_avg_1m_at_start": round(os.getloadavg()[0], 2),
        "python": platform.python_version(),
        "confluent_kafka": str(getattr(confluent_kafka, "__version__", "?")),
        "librdkafka": confluent_kafka.libversion()[0],
        "event_loop": event_loop.chosen(),  # what the bench and its workers run on
    }


FLOOR_UNSTABLE = 0.15
"""A floor whose own runs lie further apart than this share of their median is no
steady yardstick: the run is marked and the ratio targets are not judged."""


def cpu_ticks() -> dict[str, int]:
    """The machine's CPU time so far from ``/proc/stat`` (clock ticks per state; {} when
    there is no such file)."""
    names = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")
    with contextlib.suppress(OSError), open("/proc/stat") as f:
        for line in f:
            if line.startswith("cpu "):
                return dict(zip(names, map(int, line.split()[1:9]), strict=False))
    return {}


def neighbours(start: Mapping[str, int], load_at_start: float) -> dict[str, Any]:
    """What else ran on the machine over the run: load average at start and end, the
    time the hypervisor gave to others (steal) and the share of all CPU time it was."""
    end = cpu_ticks()
    used = {k: end.get(k, 0) - start.get(k, 0) for k in end}
    total = sum(used.values())
    hz = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    one, five, _ = os.getloadavg()
    return {
        "load_avg_1m_at_start": round(load_at_start, 2),
        "load_avg_1m_at_end": round(one, 2),
        "load_avg_5m_at_end": round(five, 2),
        "steal_s": round(used.get("steal", 0) / hz, 2) if end else None,
        "steal_fraction": round(used.get("steal", 0) / total, 4) if total else None,
        "busy_fraction": round(1 - (used.get("idle", 0) + used.get("iowait", 0)) / total, 3)
        if total
        else None,
    }
