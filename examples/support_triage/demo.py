"""The main job: a broker, the support agent's topics, a worker process, sample turns.

Starts a local Kafka broker unless ``KAFKA_BOOTSTRAP_SERVERS`` is set, applies the
agent's topics, starts ``pyrula-stream worker`` as a separate process, submits every
sample question, prints each turn's events as they arrive, then a summary. Exits 0 only
when every sample turn completed.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections import Counter

from examples.support_triage.agent import DATA, support
from pyrula_stream import Event, KafkaAgentClient
from pyrula_stream.cli import format_event
from pyrula_stream.kafka.admin import apply_topics
from pyrula_stream.testing import local_kafka, read_topic
from pyrula_stream.wire.serde import decode_turn_result

AGENT = "examples.support_triage.agent:support"


async def run_batch(bootstrap: str) -> dict[str, list[Event]]:
    """Submit every sample question at once and follow all turns until they end."""
    events: dict[str, list[Event]] = {}
    async with KafkaAgentClient(bootstrap, prefix=support.prefix) as client:
        handles = [
            await client.submit(support.name, thread_id=q["customer"], **q)
            for q in DATA["questions"]
        ]
        print(f"submitted {len(handles)} turns to {support.topics.turns}\n")

        async def follow(turn_id: str, since_ms: int) -> None:
            events[turn_id] = []
            async for event in client.stream(
                support.name, turn_id, since_ms=since_ms - 60_000, idle_timeout_seconds=60
            ):
                events[turn_id].append(event)
                print(format_event(event), flush=True)

        await asyncio.wait_for(
            asyncio.gather(*(follow(h.turn_id, h.submitted_ms) for h in handles)), 180
        )
    return events


def summarize(events: dict[str, list[Event]]) -> bool:
    print("\n== summary ==")
    ok = True
    for turn_id, evs in events.items():
        last = evs[-1] if evs else None
        done = last is not None and last.type == "run:complete"
        ok &= done
        if done and last is not None:
            result = last.data["result"]
            outcome = f"{result['customer']}: {result['answer']}"
        else:
            outcome = f"FAILED: {last.data if last else 'no events'}"
        print(f"{turn_id[:8]} {len(evs):2d} events  {outcome}")
    kinds = Counter(e.type for evs in events.values() for e in evs)
    print(f"\n{len(events)} turns, {sum(kinds.values())} events: {dict(kinds)}")
    print("every turn completed" if ok else "SOME TURNS DID NOT COMPLETE")
    return ok


def show_results(bootstrap: str, turn_ids: set[str]) -> bool:
    """What a downstream job reads: one record per turn on the results topic."""
    decoded = [
        (key, decode_turn_result(value, headers))
        for key, value, headers in read_topic(bootstrap, support.topics.results)
        if value is not None
    ]
    records = [(key, r) for key, r in decoded if r.turn_id in turn_ids]
    print(f"\n== {support.topics.results}: {len(records)} records ==")
    for key, result in records:
        outcome = result.result if result.status == "completed" else result.error_code
        print(
            f"key={(key or b'').decode()} turn={result.turn_id[:8]} {result.status} "
            f"{result.duration_ms}ms ${result.cost_usd:.4f} {outcome}"
        )
    return len({r.turn_id for _, r in records}) == len(records) == len(turn_ids)


def main() -> int:
    print(f"model: {support.llm.describe() if support.llm else 'FakeLLM'}")
    with local_kafka() as bootstrap:
        print(f"kafka: {bootstrap}")
        report = apply_topics(bootstrap, support.topic_specs())
        print(report.describe())
        if not report.ok:
            return 2
        worker = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "pyrula_stream.cli",
                "worker",
                AGENT,
                "--bootstrap-servers",
                bootstrap,
                "--worker-id",
                "demo-1",
            ],
            env={**os.environ, "PYTHONPATH": os.getcwd()},
        )
        started = time.monotonic()
        try:
            events = asyncio.run(run_batch(bootstrap))
        finally:
            worker.send_signal(signal.SIGTERM)
            try:
                worker.wait(60)
            except subprocess.TimeoutExpired:
                worker.kill()
        print(f"batch took {time.monotonic() - started:.1f}s; worker exited {worker.returncode}")
        ok = summarize(events) and show_results(bootstrap, set(events))
        return 0 if ok and worker.returncode == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
