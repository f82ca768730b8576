"""A worker configured as a pod configures it (``PYRULA_*`` variables only) answers its
probes on every interface, and a SIGTERM turns ``/readyz`` false at once while ``/livez``
stays true until the drain has finished the turn in flight and the process exits."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

import httpx
import psutil

from pyrula_stream import KafkaAgentClient
from pyrula_stream.kafka.local.broker import free_port
from pyrula_stream.testing import unique_name

ROOT = Path(__file__).parents[2]


async def _status(http: httpx.AsyncClient, url: str) -> int | None:
    try:
        return (await http.get(url)).status_code
    except httpx.TransportError:
        return None


async def test_readyz_turns_false_when_the_drain_starts_and_livez_stays_true(
    kafka_bootstrap_servers: str, client: KafkaAgentClient, tmp_path: Path
) -> None:
    agent = unique_name("drain")
    port = free_port()
    mark = tmp_path / "started"
    worker = await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "pyrula_stream.cli", "worker", "tests.agents.draining:draining"),
        cwd=ROOT,
        env={
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "DRAINING_AGENT_NAME": agent,
            "DRAINING_MARK": str(mark),
            "KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap_servers,
            "PYRULA_HEALTH_HOST": "0.0.0.0",
            "PYRULA_HEALTH_PORT": str(port),
            "PYRULA_SHUTDOWN_GRACE": "60",
        },
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    livez, readyz = f"http://127.0.0.1:{port}/livez", f"http://127.0.0.1:{port}/readyz"
    seen: list[tuple[int | None, int | None]] = []
    try:
        async with httpx.AsyncClient(timeout=5) as http:
            for _ in range(1800):
                if await _status(http, readyz) == 200:
                    break
                assert worker.returncode is None, "the worker exited before it was ready"
                await asyncio.sleep(0.1)
            else:
                raise TimeoutError(f"{readyz} never answered 200")
            listening = {
                c.laddr
                for c in psutil.Process(worker.pid).net_connections("tcp")
                if c.status == psutil.CONN_LISTEN
            }
            assert ("0.0.0.0", port) in listening, listening

            handle = await client.submit(agent, seconds=8)
            for _ in range(1800):
                if mark.exists():
                    break
                await asyncio.sleep(0.1)
            else:
                raise TimeoutError("the turn never started")
            assert mark.read_text() == handle.turn_id

            worker.send_signal(signal.SIGTERM)
            while worker.returncode is None:
                seen.append((await _status(http, livez), await _status(http, readyz)))
                await asyncio.sleep(0.1)
    finally:
        if worker.returncode is None and not seen:
            worker.kill()
        output, _ = await asyncio.wait_for(worker.communicate(), 120)
    assert worker.returncode == 0, output.decode(errors="replace")
    draining = [s for s in seen if s[0] == 200]
    assert draining, f"no probe answered after SIGTERM: {seen}"
    assert all(ready == 503 for _, ready in draining), seen  # not ready from the first poll
    # Alive until the process ends: once /livez stops answering, it never answers again.
    first_gone = next((i for i, s in enumerate(seen) if s[0] != 200), len(seen))
    assert all(s[0] != 200 for s in seen[first_gone:]), seen
    events = [e async for e in client.stream(agent, handle.turn_id, since_ms=handle.submitted_ms)]
    assert events[-1].type == "run:complete", events[-1].data  # the drain finished it
