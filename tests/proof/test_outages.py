"""Kafka that is missing, down, restarted or cut off: clear errors within a timeout, a few
log lines instead of one per librdkafka retry, and a worker that waits and carries on."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from pyrula_stream import AgentContext, ToolContext, kafka_agent, tool
from pyrula_stream.chaos.partition import PartitionProxy
from pyrula_stream.client.kafka_client import KafkaAgentClient
from pyrula_stream.errors import BrokerUnavailableError, UnknownTopicError
from pyrula_stream.kafka.io import PartitionReader
from pyrula_stream.kafka.local.broker import LocalBroker, free_port, start_local_broker
from pyrula_stream.llm import FakeLLM, reply_tool_call
from pyrula_stream.testing import running_worker, unique_name

ROOT = Path(__file__).parents[2]


async def test_client_names_the_missing_topic_and_how_to_create_it(
    kafka_bootstrap_servers: str,
) -> None:
    agent = unique_name("ghost")
    hint = f"start a worker for '{agent}' or run `pyrula-stream topics apply {agent} --prefix p2`"
    async with KafkaAgentClient(kafka_bootstrap_servers, prefix="p2", timeout=10) as client:
        with pytest.raises(UnknownTopicError) as submitted:
            await client.submit(agent, x=1)
        with pytest.raises(UnknownTopicError) as streamed:
            async for _ in client.stream(agent, "0" * 32):
                pass
    assert str(submitted.value) == f"no topic p2.{agent}.turns: {hint}"
    assert str(streamed.value) == f"no topic p2.{agent}.events: {hint}"


# librdkafka names a broker ``sasl_ssl://host:port/id`` unless it is on PLAINTEXT.
SECURED = {
    "security.protocol": "SASL_SSL",
    "sasl.mechanism": "SCRAM-SHA-512",
    "sasl.username": "worker",
    "sasl.password": "not-needed-here",
}
PROTOCOLS = pytest.mark.parametrize("settings", [{}, SECURED], ids=["plaintext", "sasl_ssl"])


@PROTOCOLS
async def test_client_submit_to_a_closed_port_fails_after_its_timeout(
    settings: dict[str, str],
) -> None:
    port = free_port()
    async with KafkaAgentClient(f"127.0.0.1:{port}", timeout=1, kafka_config=settings) as client:
        with pytest.raises(BrokerUnavailableError) as info:
            await client.submit("support", question="hello?")
    message = str(info.value)
    assert message.startswith(f"cannot reach Kafka at 127.0.0.1:{port} within 1s")
    assert "(Connection refused)" in message


@PROTOCOLS
def test_connection_failures_are_logged_once_not_per_retry(
    caplog: pytest.LogCaptureFixture, settings: dict[str, str]
) -> None:
    caplog.set_level(logging.WARNING, logger="pyrula_stream.librdkafka")
    port = free_port()
    reader = PartitionReader(
        f"127.0.0.1:{port}", "pyrula.outage.events", client_id="outage", kafka_config=settings
    )
    try:
        reader.seek_partitions([0], None)  # assigned without metadata: only fetches fail
        for _ in range(10):  # about 2 s of librdkafka reconnecting every few tens of ms
            assert list(reader.poll(0.2)) == []
    finally:
        reader.close()
    lines = [r.getMessage() for r in caplog.records if r.name == "pyrula_stream.librdkafka"]
    assert lines == [
        f"Kafka broker 127.0.0.1:{port} is unreachable (Connection refused); retrying with "
        "backoff, a reminder every 10s until it is back"
    ]


# -- a worker started before its broker, and the broker restarted under it --------------


def _readyz(port: int) -> int | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except OSError:
        return None


def _wait(predicate: object, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.2)


async def _one_turn(bootstrap: str, agent: str) -> str:
    async with KafkaAgentClient(bootstrap, timeout=120) as client:
        events = await client.run(agent, text="hello", timeout=180)
    return events[-1].type


@pytest.mark.broker
@pytest.mark.slow
@pytest.mark.timeout(420)
def test_worker_waits_for_kafka_and_carries_on_after_a_broker_restart(
    tmp_path: Path,
) -> None:
    agent = unique_name("outage")
    port, health = free_port(), free_port()
    bootstrap = f"127.0.0.1:{port}"
    log_path = tmp_path / "worker.log"
    with open(log_path, "wb") as log_file:
        worker = subprocess.Popen(
            [
                *(sys.executable, "-m", "pyrula_stream.cli", "worker", "tests.agents.echo:echo"),
                *("--bootstrap-servers", bootstrap, "--health-port", str(health)),
                *("--worker-id", "outage-1"),
            ],
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT), "ECHO_AGENT_NAME": agent},
            stdout=log_file,
            stderr=subprocess.STDOUT,
        )
    broker: LocalBroker | None = None
    try:
        _wait(lambda: _readyz(health) is not None, 60, "the health server never answered")
        assert _readyz(health) == 503
        _wait(
            lambda: "does not answer; waiting for it" in log_path.read_text(),
            30,
            "no log line about waiting for Kafka",
        )

        broker = start_local_broker(data_dir=tmp_path / "kafka", port=port)
        _wait(lambda: _readyz(health) == 200, 120, "the worker never became ready")
        assert asyncio.run(_one_turn(bootstrap, agent)) == "run:complete"

        broker.halt(signal.SIGTERM)  # same port, same data directory: a restart
        broker = start_local_broker(data_dir=tmp_path / "kafka", port=port)
        try:
            last = asyncio.run(_one_turn(bootstrap, agent))
        except TimeoutError:
            last = "no terminal event within 180 s"
        assert last == "run:complete", log_path.read_text()[-20_000:]
    finally:
        worker.send_signal(signal.SIGTERM)
        try:
            worker.wait(60)
        finally:
            worker.kill()
            if broker is not None:
                broker.stop()
    log = log_path.read_text()
    assert worker.returncode == 0, log
    assert f"Kafka broker {bootstrap} is unreachable (Connection refused)" in log
    assert f"Kafka broker {bootstrap} is reachable again after" in log
    assert "Connect to ipv4#" not in log, log  # no raw line per librdkafka retry


# -- a network partition between the worker and its broker, healed -----------------------


@pytest.mark.broker
@pytest.mark.slow
@pytest.mark.timeout(420)
async def test_a_turn_committing_into_a_network_partition_completes_after_it_heals(
    tmp_path: Path,
) -> None:
    started, release = asyncio.Event(), asyncio.Event()

    @tool
    async def hold(ctx: ToolContext) -> str:
        """Returns when the test says, so its step commits while the network is cut."""
        started.set()
        await release.wait()
        return "held"

    @kafka_agent(
        name=unique_name("partition"),
        llm=FakeLLM([reply_tool_call("hold"), "after the partition"]),
        tools=[hold],
        partitions=1,
    )
    async def agent(ctx: AgentContext) -> str:
        return await ctx.llm.run([{"role": "user", "content": "go"}])

    port = free_port()
    proxy = PartitionProxy(free_port(), port)
    broker = start_local_broker(data_dir=tmp_path / "kafka", port=port, advertised_port=proxy.port)
    bootstrap = proxy.bootstrap_servers
    try:
        async with running_worker(agent, bootstrap) as worker:
            async with KafkaAgentClient(bootstrap, timeout=60) as client:
                handle = await client.submit(agent.name)
            await asyncio.wait_for(started.wait(), 60)
            proxy.cut()
            release.set()  # the tool's step commits into the partition
            await asyncio.sleep(8)
            proxy.heal()
            async with KafkaAgentClient(bootstrap, timeout=60) as client:
                held = [e async for e in client.stream(agent.name, handle.turn_id)]
                after = await client.run(agent.name, timeout=120)
            assert not worker.done
    finally:
        broker.stop()
        proxy.close()
    assert held[-1].type == "run:complete"
    assert held[-1].data["result"] == "after the partition"
    assert after[-1].type == "run:complete"
    tool_results = [e for e in held if e.type == "tool:result"]
    assert len(tool_results) == 1, tool_results  # committed once, never twice
