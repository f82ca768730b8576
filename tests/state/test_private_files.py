"""The worker's local state (idempotency keys, memory views: parked turns and what users
stored) is readable by its own account only: files 0600 in a 0700 directory, whatever
the umask."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from pyrula_stream import AgentContext, KafkaAgentClient, WorkerOptions, kafka_agent
from pyrula_stream.kafka.table import SqliteView
from pyrula_stream.llm import FakeLLM
from pyrula_stream.state.memory import SqliteMemory
from pyrula_stream.testing import running_worker, unique_name


@pytest.fixture
def open_umask() -> Iterator[None]:
    """The common default, under which new files are 0644 and directories 0755."""
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.mark.usefixtures("open_umask")
def test_local_tables_are_private_files_in_a_private_directory(tmp_path: Path) -> None:
    view = SqliteView(tmp_path / "state" / "keys.sqlite")
    memory = SqliteMemory(tmp_path / "state" / "m.memory.sqlite")
    try:
        assert mode(tmp_path / "state") == 0o700
        assert mode(view.path) == 0o600
        assert mode(memory.path) == 0o600
    finally:
        view.close()
        memory.close()


@pytest.mark.usefixtures("open_umask")
async def test_a_worker_state_dir_is_0700_and_its_files_0600(
    kafka_bootstrap_servers: str, client: KafkaAgentClient, tmp_path: Path
) -> None:
    @kafka_agent(name=unique_name("private"), llm=FakeLLM(["ok"]), partitions=1)
    async def agent(ctx: AgentContext) -> str:
        return "done"

    state = tmp_path / "state"
    state.mkdir(mode=0o755)
    options = WorkerOptions(state_dir=state)
    async with running_worker(agent, kafka_bootstrap_servers, options):
        events = await client.run(agent.name, idempotency_key="once", timeout=60)
        assert events[-1].type == "run:complete"
        files = [p for p in state.rglob("*") if p.is_file()]
        assert files, "the worker kept no local table"
        assert mode(state) == 0o700
        assert {p.name: mode(p) for p in files} == {p.name: 0o600 for p in files}
