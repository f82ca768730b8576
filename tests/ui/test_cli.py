"""``pyrula-stream ui`` as a user starts it: a process serving the shipped page, the API
and the live stream, that stops cleanly on Ctrl-C even with a live stream open."""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import subprocess
import sys
import time

import httpx

from pyrula_stream import AgentContext, KafkaAgentClient, kafka_agent
from pyrula_stream.llm import FakeLLM
from pyrula_stream.testing import running_worker, unique_name

# The UI binds where --host says: 127.0.0.2 is loopback too on Linux, but a server on the
# default 127.0.0.1 does not answer there.
HOST = "127.0.0.2"


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def wait_until_served(url: str, proc: subprocess.Popen[str], timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"pyrula-stream ui exited: {proc.communicate()}")
        try:
            httpx.get(url, timeout=2)
            return
        except httpx.TransportError:
            time.sleep(0.1)
    raise AssertionError(f"{url} did not answer within {timeout_s}s")


async def test_ui_command_serves_page_api_and_live_stream(
    kafka_bootstrap_servers: str, client: KafkaAgentClient
) -> None:
    @kafka_agent(name=unique_name("uicli"), llm=FakeLLM(["fine"]), partitions=1)
    async def agent(ctx: AgentContext, question: str) -> str:
        return await ctx.llm.run([{"role": "user", "content": question}])

    async with running_worker(agent, kafka_bootstrap_servers):
        events = await client.run(agent.name, question="hi", timeout=60)
    await asyncio.to_thread(
        check_ui_process, kafka_bootstrap_servers, agent.name, events[0].turn_id
    )


def check_ui_process(bootstrap_servers: str, agent: str, turn_id: str) -> None:
    port = free_port()
    url = f"http://{HOST}:{port}"
    command = [sys.executable, "-m", "pyrula_stream.cli", "ui", "--host", HOST]
    command += ["--bootstrap-servers", bootstrap_servers, "--agent", agent, "--port", str(port)]
    with subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as proc:
        try:
            wait_until_served(url, proc)
            page = httpx.get(url, timeout=10)
            assert page.status_code == 200 and "/static/app.js" in page.text
            assert httpx.get(f"{url}/static/app.js", timeout=10).status_code == 200
            # A turn read by id, from Kafka (the live feed may not have it yet).
            turn = httpx.get(f"{url}/api/turns/{agent}/{turn_id}", timeout=60).json()
            assert (turn["status"], turn["steps"][0]["text"]) == ("completed", "fine")
            missing = httpx.get(f"{url}/api/turns/{agent}/nope", timeout=60)
            assert missing.status_code == 404
            assert "no events for turn nope" in missing.json()["error"]
            with httpx.stream("GET", f"{url}/api/live", timeout=60) as live:
                first = next(line for line in live.iter_lines() if line.startswith("data: "))
                snapshot = json.loads(first.removeprefix("data: "))
                assert snapshot["snapshot"] is True
                assert snapshot["config"]["allow_actions"] is False
                # Ctrl-C with a live stream open: the server ends the stream and exits.
                proc.send_signal(signal.SIGINT)
                out, err = proc.communicate(timeout=60)
            assert proc.returncode == 0, err
            assert f"pyrula-stream ui on {url}" in out
        finally:
            if proc.poll() is None:
                proc.kill()
