"""A worker killed between writing an object and committing the records that reference
it leaves an orphan, never a reference to nothing: the sweeper removes the orphan (and
only it), the next worker finishes the turn, and a second sweep deletes nothing."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

import pytest

from pyrula_stream import AgentContext, AgentLimits, KafkaAgentClient, WorkerOptions, kafka_agent
from pyrula_stream.cli import main
from pyrula_stream.llm import FakeLLM, reply_tool_call
from pyrula_stream.objects import LocalObjectStore
from pyrula_stream.objects.sweep import live_digests, object_prefix, sweep
from pyrula_stream.runtime.committer import CHAOS_KILL_ENV
from pyrula_stream.testing import agent_topics_ready, running_worker, unique_name
from tests.agents import large

ROOT = Path(__file__).resolve().parents[2]


async def _sweep_cli(
    bootstrap: str, prefix: str, agent: str, store: Path, capsys: pytest.CaptureFixture[str]
) -> dict[str, int]:
    """``pyrula-stream objects sweep`` (its ``main``, in a thread: no interpreter start)."""
    argv = ["objects", "sweep", agent, "--bootstrap-servers", bootstrap, "--prefix", prefix]
    argv += ["--object-store", f"file://{store}", "--grace-seconds", "0"]
    capsys.readouterr()
    assert await asyncio.to_thread(main, argv) == 0
    return dict(json.loads(capsys.readouterr().out.strip().splitlines()[-1]))


async def test_a_crash_between_object_and_commit_leaves_an_orphan_the_sweeper_removes(
    kafka_bootstrap_servers: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    name, prefix = unique_name("orphan"), unique_name("lp")
    root = tmp_path / "objects"
    store = LocalObjectStore(root)
    worker = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "pyrula_stream.cli",
        "worker",
        "tests.agents.large:large",
        "--bootstrap-servers",
        kafka_bootstrap_servers,
        "--object-store",
        str(root),
        cwd=ROOT,
        env={
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "LARGE_AGENT_NAME": name,
            "LARGE_AGENT_PREFIX": prefix,
            CHAOS_KILL_ENV: "1",
        },
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )
    async with KafkaAgentClient(
        kafka_bootstrap_servers, prefix=prefix, object_store=store
    ) as client:
        try:
            await agent_topics_ready(kafka_bootstrap_servers, name, prefix=prefix)
            handle = await client.submit(name)
            assert await asyncio.wait_for(worker.wait(), 120) == -9  # killed itself at the point
        finally:
            if worker.returncode is None:
                worker.kill()
                await worker.wait()
        orphans = [info.key for info in store.list()]
        assert orphans, "the tool result was stored before the commit"

        first = await _sweep_cli(kafka_bootstrap_servers, prefix, name, root, capsys)
        assert first["deleted"] == len(orphans) and first["referenced"] == 0, first
        assert list(store.list()) == []

        @kafka_agent(
            name=name,
            prefix=prefix,
            llm=FakeLLM([reply_tool_call("fetch_report"), "read"]),
            tools=[large.fetch_report],
            partitions=1,
            limits=AgentLimits(max_tool_result_bytes=None),
        )
        async def agent(ctx: AgentContext) -> str:
            return await ctx.llm.run([{"role": "user", "content": "fetch the report"}])

        async with running_worker(
            agent, kafka_bootstrap_servers, WorkerOptions(object_store=store)
        ):
            events = [e async for e in client.stream(name, handle.turn_id)]
        assert events[-1].type == "run:complete", events[-1].data
        [result] = [e for e in events if e.type == "tool:result"]
        assert result.data["output"] == "R" * large.TOOL_BYTES

        topics = [t for t in vars(agent.topics).values() if isinstance(t, str)]
        second = await asyncio.to_thread(
            sweep,
            store,
            object_prefix(prefix, name),
            lambda: live_digests(kafka_bootstrap_servers, prefix, topics=topics)[0],
            grace_s=0,
        )
        assert second.deleted == [] and second.referenced >= 1, second
        replayed = [e async for e in client.stream(name, handle.turn_id)]
        assert [e.data for e in replayed] == [e.data for e in events]  # no reference dangles
