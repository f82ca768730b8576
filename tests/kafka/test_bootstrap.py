"""Where the cluster is when nobody says (``kafka.local.bootstrap.find_bootstrap``): the
CLI, ``KafkaAgentClient()`` and ``run_worker`` ask the same function, so a client in a
newcomer's script finds the broker ``pyrula-stream broker start`` put on a free port."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from pyrula_stream import KafkaAgentClient
from pyrula_stream.errors import ConfigurationError, ErrorCode, TurnFailed, UnknownTopicError
from pyrula_stream.kafka.local.bootstrap import DEFAULT_BOOTSTRAP, find_bootstrap, state_file
from pyrula_stream.testing import unique_name

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty cache and no cluster settings in the environment."""
    monkeypatch.setenv("PYRULA_STREAM_CACHE", str(tmp_path))
    for name in [n for n in os.environ if n.startswith(("KAFKA_", "PYRULA_KAFKA_"))]:
        monkeypatch.delenv(name)
    return tmp_path


def started_broker_at(address: str) -> None:
    """What `pyrula-stream broker start` leaves behind (its state file)."""
    state_file().write_text(json.dumps({"bootstrap_servers": address, "pid": 1}))


def test_the_started_broker_then_the_default(cache: Path) -> None:
    assert state_file() == cache / "broker.json"
    assert find_bootstrap() == DEFAULT_BOOTSTRAP
    started_broker_at("127.0.0.1:40123")
    assert find_bootstrap() == "127.0.0.1:40123"
    assert KafkaAgentClient().bootstrap_servers == "127.0.0.1:40123"


def test_the_environment_and_the_settings_come_first(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    started_broker_at("127.0.0.1:40123")
    assert find_bootstrap({"bootstrap.servers": "settings:9092"}) == "settings:9092"
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", "env:9092")
    assert find_bootstrap({"bootstrap.servers": "settings:9092"}) == "env:9092"
    assert KafkaAgentClient().bootstrap_servers == "env:9092"
    assert KafkaAgentClient("given:9092").bootstrap_servers == "given:9092"
    with pytest.raises(ConfigurationError, match="bootstrap_servers is empty"):
        KafkaAgentClient("")


def test_a_failed_turn_reads_as_its_code_and_message() -> None:
    failed = TurnFailed(
        agent="support", turn_id="t-1", data={"code": "llm_error", "message": "no such model"}
    )
    assert str(failed) == "turn t-1 of agent 'support' failed with llm_error: no such model"
    assert failed.code == ErrorCode.LLM_ERROR
    unknown = TurnFailed(agent="support", turn_id="t-2", data={"code": "from_the_future"})
    assert unknown.code == ErrorCode.INTERNAL
    assert str(unknown).endswith("failed with from_the_future: (no message)")


WORKER = """
import sys
from pyrula_stream import AgentContext, kafka_agent
from pyrula_stream.llm import FakeLLM
from pyrula_stream.runtime.mesh import run_worker

@kafka_agent(name=sys.argv[1], llm=FakeLLM(["found it"]))
async def agent(ctx: AgentContext, question: str) -> str:
    return await ctx.llm.run([{"role": "user", "content": question}])

run_worker(agent)  # no address: the broker in the state file
"""


@pytest.mark.broker
@pytest.mark.timeout(180)
async def test_run_worker_and_the_client_find_the_started_broker(
    kafka_bootstrap_servers: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker run from Python and a client, both without an address, meet at the broker
    named by the state file (standing in for `pyrula-stream broker start`'s)."""
    monkeypatch.setenv("PYRULA_STREAM_CACHE", str(tmp_path))
    for name in [n for n in os.environ if n.startswith(("KAFKA_", "PYRULA_KAFKA_"))]:
        monkeypatch.delenv(name)
    started_broker_at(kafka_bootstrap_servers)
    name = unique_name("boot")
    (tmp_path / "worker.py").write_text(WORKER)
    log = (tmp_path / "worker.log").open("w")
    worker = await asyncio.create_subprocess_exec(
        sys.executable,
        str(tmp_path / "worker.py"),
        name,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        async with KafkaAgentClient() as client:
            while True:  # the worker makes the agent's topics as it starts
                try:
                    answer = await client.ask(name, question="where?", timeout=60)
                    break
                except UnknownTopicError:
                    assert worker.returncode is None, (tmp_path / "worker.log").read_text()
                    await asyncio.sleep(0.5)
        assert answer == "found it"
    finally:
        worker.send_signal(signal.SIGTERM)
        await asyncio.wait_for(worker.wait(), 60)
        log.close()
