"""Exactly once across a pipeline: orders in, one result and one downstream record each,
with our worker SIGKILLed mid-run. Shared by the Faust and Quix example tests."""

from __future__ import annotations

import json
import signal
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from pyrula_stream.chaos.processes import Managed, child_env
from pyrula_stream.kafka.admin import TopicSpec, agent_topic_specs, apply_topics
from pyrula_stream.kafka.io import RecordProducer
from pyrula_stream.testing import read_topic
from pyrula_stream.wire.serde import decode_turn_result


@dataclass
class PipelineRun:
    results: Counter[str]
    downstream: Counter[str]
    worker_starts: int
    results_when_killed: int


def wait_until(predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.5)


def run_pipeline(
    bootstrap: str,
    tmp_path: Path,
    *,
    pipeline: str,
    agent_spec: str,
    agent_name: str,
    processor_argv: list[str],
    downstream_topic: str,
    records: int,
    input_topic: str,
    id_field: str = "order_id",
    python: str = sys.executable,
    partitions: int = 2,
) -> PipelineRun:
    """Produce ``records`` orders, run our worker and the processor, kill our worker once
    a quarter of the results are in, restart it, and count what came out (committed)."""
    apply_topics(
        bootstrap,
        [
            *agent_topic_specs(agent_name, prefix=pipeline, partitions=partitions),
            TopicSpec(input_topic, partitions),
            TopicSpec(downstream_topic, partitions),
        ],
    )
    producer = RecordProducer(bootstrap)
    for i in range(records):
        text = "arrived damaged" if i % 3 == 0 else "where is it?"
        order = {id_field: f"o{i}", "text": text}
        producer.send_sync(input_topic, f"o{i}".encode(), json.dumps(order).encode())
    producer.close()

    env = child_env(
        {
            "KAFKA_BOOTSTRAP_SERVERS": bootstrap,
            "PIPELINE": pipeline,
            "PIPELINE_MODEL_LATENCY_S": "0.2",  # turns stay in flight long enough to kill
            "PIPELINE_STATE_DIR": str(tmp_path / "state"),
        }
    )
    worker_argv = [
        *(python, "-m", "pyrula_stream.cli", "worker", agent_spec),
        *("--bootstrap-servers", bootstrap, "--worker-id", "w1"),
    ]
    worker = Managed("worker", worker_argv, env, tmp_path / "worker.log")
    processor = Managed("processor", processor_argv, env, tmp_path / "processor.log")
    results_topic = f"{pipeline}.{agent_name}.results"

    def check_alive() -> None:
        for proc in (worker, processor):
            if not proc.alive():
                log = proc.log_path.read_text(errors="replace")[-3000:]
                raise AssertionError(f"{proc.name} exited:\n{log}")

    def committed_results() -> int:
        return sum(1 for _, v, _ in read_topic(bootstrap, results_topic) if v is not None)

    def result_count() -> int:
        check_alive()
        return committed_results()

    def downstream_keys() -> set[bytes | None]:
        check_alive()
        return {k for k, _, _ in read_topic(bootstrap, downstream_topic)}

    try:
        worker.start()
        processor.start()
        wait_until(lambda: result_count() >= records // 4, 120, "a quarter of the results")
        worker.signal(signal.SIGKILL)  # mid-run: turns in flight, a transaction open
        worker.kill()
        killed_at = committed_results()
        worker.start()  # same worker id: its transactional id fences what was left open
        wait_until(lambda: len(downstream_keys()) >= records, 240, "every downstream record")
    finally:
        processor.stop(30)
        worker.stop(30)
    results = Counter(
        decode_turn_result(v, h).correlation_id or "?"
        for _, v, h in read_topic(bootstrap, results_topic)
        if v is not None
    )
    downstream = Counter(
        (k or b"").decode() for k, v, _ in read_topic(bootstrap, downstream_topic) if v
    )
    return PipelineRun(results, downstream, worker.starts, killed_at)
