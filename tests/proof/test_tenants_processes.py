"""Quotas across a worker group of two processes: usage one worker counts holds back the
other's turns, and deferred turns resume after the window, exactly once, though the
worker that deferred some of them was SIGKILLed."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from functools import partial
from pathlib import Path

import httpx

from pyrula_stream import KafkaAgentClient
from pyrula_stream.cli import main as cli_main
from pyrula_stream.kafka.local.broker import free_port
from pyrula_stream.kafka.partitioner import partition_for
from pyrula_stream.testing import agent_topics_ready, read_topic, unique_name, wait_for
from pyrula_stream.wire.events import Event
from pyrula_stream.wire.serde import decode_turn_result_value

ROOT = Path(__file__).parents[2]
CAP = 3  # tests/agents/tenanted.py: turns_per_minute=3


async def _ready(port: int) -> bool:
    try:
        async with httpx.AsyncClient(timeout=2) as http:
            return (await http.get(f"http://127.0.0.1:{port}/readyz")).status_code == 200
    except httpx.HTTPError:
        return False


def thread_on(partition: int, n: int) -> str:
    """A thread id whose key lands on ``partition`` of two (one thread per turn)."""
    i = 0
    while True:
        tid = f"t{n}-{i}"
        if partition_for(tid.encode(), 2) == partition:
            return tid
        i += 1


def usage_turns(bootstrap: str, agent: str) -> int:
    """The tenant's turns this minute, as ``pyrula-stream tenants show`` prints them."""
    from contextlib import redirect_stdout
    from io import StringIO

    out = StringIO()
    with redirect_stdout(out):
        cli_main(["tenants", "show", agent, "--bootstrap-servers", bootstrap])
    for line in out.getvalue().splitlines():
        row = json.loads(line)
        if row["tenant"] == "acme" and row["minute"] is not None:
            return int(row["minute"]["turns"])
    return 0


def usage_reaches(bootstrap: str, agent: str, turns: int) -> bool:
    return usage_turns(bootstrap, agent) >= turns


async def test_deferred_turns_resume_after_the_window_across_a_sigkill(
    kafka_bootstrap_servers: str, client: KafkaAgentClient
) -> None:
    agent = unique_name("tenantprocs")
    ports = [free_port(), free_port()]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TENANTED_AGENT_NAME": agent}

    async def spawn(i: int) -> asyncio.subprocess.Process:
        return await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "pyrula_stream.cli",
            "worker",
            "tests.agents.tenanted:tenanted",
            "--bootstrap-servers",
            kafka_bootstrap_servers,
            "--worker-id",
            f"tq-{i}",
            "--health-port",
            str(ports[i]),
            "--shutdown-grace",
            "2",
            cwd=ROOT,
            env=env,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
        )

    workers = [await spawn(0), await spawn(1)]
    try:
        await agent_topics_ready(kafka_bootstrap_servers, agent)
        for port in ports:
            deadline = time.monotonic() + 120
            while not await _ready(port):
                assert time.monotonic() < deadline, "worker not ready"
                await asyncio.sleep(0.2)
        left = 60 - time.time() % 60
        if left < 30:  # set-up: the six submissions fall in one quota minute
            await asyncio.sleep(left + 0.2)

        firsts: list[Event] = []
        handles = []
        for n in range(6):  # partitions 0, 1, 0, 1, 0, 1: both workers take turns
            handle = await client.submit(
                agent, metadata={"tenant": "acme"}, thread_id=thread_on(n % 2, n)
            )
            handles.append(handle)
            stream = client.stream(agent, handle.turn_id)
            first = await anext(e async for e in stream if e.type in ("run:start", "run:deferred"))
            firsts.append(first)
            if first.type == "run:start":  # set-up: its usage is on the topic before the next
                await wait_for(
                    partial(usage_reaches, kafka_bootstrap_servers, agent, len(handles)),
                    30,
                    "the turn's usage committed",
                )
        kinds = [f.type for f in firsts]
        assert kinds == ["run:start"] * CAP + ["run:deferred"] * 3, kinds
        deferred_partitions = {
            h.partition for h, f in zip(handles, firsts, strict=True) if f.type == "run:deferred"
        }
        assert deferred_partitions == {0, 1}

        workers[0].send_signal(signal.SIGKILL)  # one worker's deferred turns lose their owner
        await workers[0].wait()
        workers[0] = await spawn(0)  # under its id: it aborts what the killed one left open

        ends = []
        for handle in handles:
            events = [
                e async for e in client.stream(agent, handle.turn_id, idle_timeout_seconds=150)
            ]
            ends.append(events)
    finally:
        for w in workers:
            if w.returncode is None:
                w.send_signal(signal.SIGTERM)
        for w in workers:
            await asyncio.wait_for(w.wait(), 60)

    for first, events in zip(firsts, ends, strict=True):
        assert events[-1].type == "run:complete", events[-1].data
        if first.type == "run:deferred":
            started = [e for e in events if e.type == "run:start"]
            assert len(started) == 1 and started[0].ts_ms >= first.data["resume_at"]
    results = [
        decode_turn_result_value(v).turn_id
        for _, v, _ in read_topic(kafka_bootstrap_servers, f"pyrula.{agent}.results")
        if v is not None
    ]
    assert sorted(results) == sorted(h.turn_id for h in handles), "each turn ended once"
