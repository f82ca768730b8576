"""`pyrula-stream worker ... --processes N`: one group, N supervised worker processes."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import httpx

from pyrula_stream import KafkaAgentClient
from pyrula_stream.kafka.local.broker import free_port
from pyrula_stream.runtime.supervisor import child_args
from pyrula_stream.testing import unique_name

ROOT = Path(__file__).parents[2]
STARTED = re.compile(r"worker (\S+) started \(pid (\d+)\)")


def test_child_args_pass_everything_but_the_per_child_options() -> None:
    args, health = child_args(
        ["-v", "worker", "m:a", "--processes=2", "--worker-id", "w", "--health-port", "9000", "-x"]
    )
    assert args == ["-v", "worker", "m:a", "-x"]
    assert health == 9000


async def _ready(port: int) -> bool:
    try:
        async with httpx.AsyncClient(timeout=2) as http:
            return (await http.get(f"http://127.0.0.1:{port}/readyz")).status_code == 200
    except httpx.HTTPError:
        return False


async def _wait(predicate: Callable[[], Awaitable[bool]], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not await predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        await asyncio.sleep(0.2)


async def test_supervised_workers_share_the_group_restart_and_drain(
    kafka_bootstrap_servers: str, client: KafkaAgentClient
) -> None:
    """Two children (``PYRULA_PROCESSES=2``) with static membership: a SIGKILLed one is
    restarted under its id and gets its partition back; SIGTERM drains both and the
    supervisor exits 0."""
    agent = unique_name("procs")
    port = free_port()
    supervisor = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "pyrula_stream.cli",
        "worker",
        "tests.agents.echo:echo",
        "--bootstrap-servers",
        kafka_bootstrap_servers,
        "--worker-id",
        "sup",
        "--shutdown-grace",
        "5",
        "--static-membership",
        cwd=ROOT,
        env={
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "ECHO_AGENT_NAME": agent,
            # As a pod sets them: the children must not inherit them as they are (a
            # child with PYRULA_PROCESSES would supervise, one with the port would clash).
            "PYRULA_PROCESSES": "2",
            "PYRULA_HEALTH_PORT": str(port),
        },
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    lines: list[str] = []

    async def collect() -> None:
        assert supervisor.stdout is not None
        async for line in supervisor.stdout:
            lines.append(line.decode(errors="replace"))

    collector = asyncio.create_task(collect())

    def starts() -> list[tuple[str, str]]:
        return STARTED.findall("".join(lines))

    async def both_ready() -> bool:
        return await _ready(port) and await _ready(port + 1)

    try:
        await _wait(both_ready, 180, "both children ready")
        started = dict(starts())
        assert set(started) == {"sup-0", "sup-1"}

        os.kill(int(started["sup-1"]), signal.SIGKILL)

        async def restarted() -> bool:
            # A restart that itself dies is restarted again: wait for a live sup-1.
            return len(starts()) >= 3 and await _ready(port + 1)

        try:
            await _wait(restarted, 180, "the killed child restarted with its id")
        except TimeoutError:
            raise TimeoutError(
                f"no live sup-1 after the kill; supervisor said:\n{''.join(lines)}"
            ) from None
        again = [s for s in starts()[2:] if s[0] == "sup-1"]
        assert again and again[-1][1] != started["sup-1"], starts()

        for i in range(4):  # both partitions: each child owns one
            events = await client.run(agent, text=f"hi {i}", timeout=90)
            assert events[-1].type == "run:complete", events[-1].data
    finally:
        supervisor.send_signal(signal.SIGTERM)
        await asyncio.wait_for(supervisor.wait(), 90)
        await collector
    output = "".join(lines)
    assert supervisor.returncode == 0, output
    for worker_id, pid in starts():
        assert not _alive(int(pid)), f"child {worker_id} outlived the supervisor"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
