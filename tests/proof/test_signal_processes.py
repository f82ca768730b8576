"""Signals across worker processes: a wait's timeout fires, and a signal sent while no
worker ran is taken, on another worker after the first was SIGKILLed."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from pyrula_stream import Event, KafkaAgentClient
from pyrula_stream.chaos.processes import Managed, child_env
from pyrula_stream.testing import agent_topics_ready, read_topic, unique_name, wait_for

ROOT = Path(__file__).parents[2]
SPEC = "tests.agents.waiting:waiting"


@contextmanager
def worker(tmp_path: Path, bootstrap: str, agent: str, worker_id: str) -> Iterator[Managed]:
    argv = [sys.executable, "-m", "pyrula_stream.cli", "worker", SPEC]
    argv += ["--bootstrap-servers", bootstrap, "--worker-id", worker_id, "--shutdown-grace", "1"]
    env = child_env({"PYTHONPATH": str(ROOT), "WAITING_AGENT": agent})
    proc = Managed(worker_id, argv, env, tmp_path / f"{worker_id}.log")
    proc.start()
    try:
        yield proc
    finally:
        proc.stop(10.0)


async def stream(client: KafkaAgentClient, agent: str, turn_id: str) -> list[Event]:
    async def read() -> list[Event]:
        return [e async for e in client.stream(agent, turn_id)]

    return await asyncio.wait_for(read(), 120)


async def test_a_wait_times_out_and_a_signal_is_taken_after_the_worker_was_killed(
    kafka_bootstrap_servers: str, client: KafkaAgentClient, tmp_path: Path
) -> None:
    agent = unique_name("waiting")
    journal = f"pyrula.{agent}.journal"
    with worker(tmp_path, kafka_bootstrap_servers, agent, "waiting-1") as first:
        await agent_topics_ready(kafka_bootstrap_servers, agent)
        timed = await client.submit(agent, seconds=6.0)
        signalled = await client.submit(agent)
        parks = {f"{h.turn_id}/park".encode() for h in (timed, signalled)}

        def parked() -> bool:
            found = {k for k, v, _ in read_topic(kafka_bootstrap_servers, journal) if v}
            return parks <= found

        await wait_for(parked, 60, "both turns parked on their waits")
        first.kill()
    # No worker runs: the signal waits on its topic, undecided.
    sent = await client.signal(agent, signalled.turn_id, "go", "now", wait=0.5)
    assert not sent.accepted
    with worker(tmp_path, kafka_bootstrap_servers, agent, "waiting-2"):
        timed_events = await stream(client, agent, timed.turn_id)
        signalled_events = await stream(client, agent, signalled.turn_id)
    last = timed_events[-1]
    assert last.type == "run:complete", [(e.type, e.data) for e in timed_events]
    assert last.data["result"].startswith("timed out at ")
    assert last.ts_ms - timed_events[0].data["started_ms"] >= 6000, "timed out before its time"
    assert signalled_events[-1].data["result"] == "went with now"
    for events in (timed_events, signalled_events):
        assert [e.type for e in events].count("run:start") == 1
        assert events[-1].attempt >= 2  # parked, then resumed by replay on the new worker
        assert [e.seq for e in events] == list(range(len(events)))
