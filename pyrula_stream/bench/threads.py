"""Threads and memory: how fast a worker restores a partition's threads, and how long a
memory write takes to become visible on another worker.

``thread_restore_threads_per_s``: a threads partition filled with ``threads`` live
threads of ``turns`` turns each (one record per turn plus a head, as workers write
them) is read to its end and folded into ``PartitionThreads``, as a worker does when the
partition is assigned; live threads restored per second.

``memory_visible_ms_p50``: one ``KafkaMemory`` writes an item and waits for the broker's
acknowledgement (the write is then committed), another, started beforehand, follows the
topic; the time from the acknowledgement to the item in the second one's SQLite view.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from pyrula_stream.bench.harness import agent_topics, create_topics, drop_topics, unique
from pyrula_stream.bench.load import Record, Submitter
from pyrula_stream.bench.stats import median, percentile
from pyrula_stream.bench.workload import steps_agent
from pyrula_stream.kafka.consumers import reader_consumer
from pyrula_stream.kafka.stores.memory import KafkaMemory
from pyrula_stream.kafka.table import PartitionedTable
from pyrula_stream.state.threads import PartitionThreads, ThreadTurn, head_key, turn_key
from pyrula_stream.wire.records import JSON_CONTENT_TYPE


def thread_records(threads: int, turns: int) -> list[Record]:
    out: list[Record] = []
    for i in range(threads):
        tid = f"thread{i:08d}"
        for n in range(1, turns + 1):
            messages: list[dict[str, Any]] = [
                {"role": "user", "content": f"question {n} of {tid}"},
                {"role": "assistant", "content": [{"type": "text", "text": "an answer " * 8}]},
            ]
            turn = ThreadTurn(n, uuid.uuid4().hex, messages, {"status": "completed"}, 0)
            value = json.dumps(turn.to_json()).encode()
            out.append((turn_key(tid, n).encode(), value, [JSON_CONTENT_TYPE]))
        head = json.dumps({"thread_id": tid, "next": turns + 1}).encode()
        out.append((head_key(tid).encode(), head, [JSON_CONTENT_TYPE]))
    return out


def _time_thread_restore(bootstrap: str, topic: str) -> tuple[float, int, int]:
    reader = reader_consumer(bootstrap, client_id=unique("bench-threads"))
    try:
        started = time.perf_counter()
        threads = PartitionThreads()
        records = threads.restore(PartitionedTable(topic).restore(reader, 0))
        return time.perf_counter() - started, records, threads.live_threads
    finally:
        reader.close()


async def run_thread_restore(
    bootstrap: str, *, threads: int, turns: int, keep_topics: bool = False
) -> dict[str, Any]:
    agent = steps_agent(unique("thr"))  # one partition: every record lands in partition 0
    try:
        await asyncio.to_thread(create_topics, bootstrap, agent.topic_specs())
        submitter = Submitter(bootstrap)
        try:
            records = thread_records(threads, turns)
            await asyncio.to_thread(submitter.send_all, agent.topics.threads, records)
        finally:
            submitter.close()
        seconds, read, live = await asyncio.to_thread(
            _time_thread_restore, bootstrap, agent.topics.threads
        )
        if live != threads:
            raise RuntimeError(f"restored {live} threads, wrote {threads}")
        return {
            "threads": threads,
            "turns_per_thread": turns,
            "records": read,
            "restore_s": round(seconds, 3),
            "thread_restore_threads_per_s": round(threads / seconds),
        }
    finally:
        if not keep_topics:
            await asyncio.to_thread(drop_topics, bootstrap, agent_topics(agent))


def measure_memory_visibility(bootstrap: str, samples: int) -> dict[str, Any]:
    prefix = unique("benchmem")
    with tempfile.TemporaryDirectory(prefix="bench-memory-") as state_dir:
        writer = KafkaMemory(bootstrap, state_dir=Path(state_dir), client_id="w", prefix=prefix)
        reader = KafkaMemory(bootstrap, state_dir=Path(state_dir), client_id="r", prefix=prefix)
        writer.start()
        reader.start()
        try:
            lags_ms: list[float] = []
            for i in range(samples):
                ns, key = ("bench",), f"k{i}"
                writer.put(ns, key, {"i": i}, source="system", written_by_run_id=None)
                acked = time.perf_counter()
                deadline = acked + 30
                while reader.get(ns, key) is None:
                    if time.perf_counter() > deadline:
                        raise TimeoutError(f"memory item {key} not visible after 30 s")
                    time.sleep(0.0005)
                lags_ms.append((time.perf_counter() - acked) * 1000)
        finally:
            writer.close()
            reader.close()
        drop_topics(bootstrap, [writer.topic])
    return {
        "samples": samples,
        "memory_visible_ms_p50": round(median(lags_ms), 1),
        "memory_visible_ms_p99": round(percentile(lags_ms, 99), 1),
    }


async def run_threads(
    bootstrap: str, *, threads: int, turns: int, memory_samples: int, keep_topics: bool = False
) -> dict[str, Any]:
    restore = await run_thread_restore(
        bootstrap, threads=threads, turns=turns, keep_topics=keep_topics
    )
    memory = await asyncio.to_thread(measure_memory_visibility, bootstrap, memory_samples)
    return {**restore, **memory}
