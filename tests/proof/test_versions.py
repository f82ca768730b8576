"""Versioned agents on the real broker: a rolling deploy never breaks an in-flight turn.

Workers run in their own processes, so a SIGKILL is a real crash."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

from pyrula_stream import AgentContext, KafkaAgentClient, WorkerOptions, kafka_agent
from pyrula_stream.chaos.processes import Managed, child_env
from pyrula_stream.errors import AgentRegistrationError
from pyrula_stream.kafka.admin import agent_topic_specs, apply_topics
from pyrula_stream.llm import FakeLLM
from pyrula_stream.testing import running_worker, unique_name, wait_for
from pyrula_stream.wire.events import Event

SPEC = "tests.agents.versioned:agent"


def worker(tag: str, versions: str, bootstrap: str, env: dict[str, str], run_dir: Path) -> Managed:
    argv = [
        sys.executable,
        "-m",
        "pyrula_stream.cli",
        "worker",
        SPEC,
        "--bootstrap-servers",
        bootstrap,
        "--worker-id",
        f"w-{tag}",
        "--shutdown-grace",
        "1",
    ]
    extra = {**env, "VERSIONS": versions, "VERSIONED_TAG": tag}
    proc = Managed(tag, argv, child_env(extra), run_dir / f"worker-{tag}.log")
    proc.start()
    return proc


async def last_event(client: KafkaAgentClient, agent: str, turn_id: str) -> Event:
    """The turn's terminal event (its stream ends there)."""
    events = [e async for e in client.stream(agent, turn_id)]
    return events[-1]


@pytest.mark.timeout(240)
async def test_a_pinned_turn_survives_a_rolling_deploy_with_a_killed_worker(
    kafka_bootstrap_servers: str, client: KafkaAgentClient, tmp_path: Path
) -> None:
    name = unique_name("pinned")
    gate, effects = tmp_path / "gate", tmp_path / "effects"
    env = {
        "VERSIONED_AGENT_NAME": name,
        "VERSIONED_GATE": str(gate),
        "VERSIONED_EFFECTS": str(effects),
    }
    apply_topics(kafka_bootstrap_servers, agent_topic_specs(name, partitions=1))
    procs: list[Managed] = []
    try:
        # Version 1 is deployed; a turn starts on it and is inside its tool call.
        old = worker("a", "1", kafka_bootstrap_servers, env, tmp_path)
        procs.append(old)
        handle = await client.submit(name, question="Where is order 7?")
        await wait_for(lambda: effects.exists() and "a " in effects.read_text(), 90, "tool on a")
        # A read-only tool may start before the model's answer is committed; the turn is
        # pinned once that commit lands (its llm:complete is read back).
        stream = client.stream(name, handle.turn_id)
        await asyncio.wait_for(anext(e async for e in stream if e.type == "llm:complete"), 90)
        old.kill()

        # New code only (version 2): the turn is left alone, not started, not committed.
        new = worker("b", "2", kafka_bootstrap_servers, env, tmp_path)
        procs.append(new)
        pinned = f"turn {handle.turn_id} is pinned to version 1"
        await wait_for(lambda: pinned in new.log_path.read_text(), 90, "b left the turn alone")
        new.stop(30)

        # New code that keeps version 1: the turn resumes and ends on version 1.
        gate.touch()
        both = worker("c", "1,2", kafka_bootstrap_servers, env, tmp_path)
        procs.append(both)
        events = [e async for e in client.stream(name, handle.turn_id)]
    finally:
        for p in procs:
            p.kill()

    assert [e.type for e in events].count("run:complete") == 1, [e.data for e in events]
    assert events[-1].data["result"] == "v1: it shipped"
    assert {e.data.get("version") for e in events} == {"1"}
    assert [e.seq for e in events] == list(range(len(events)))
    ran_on = [line.split()[0] for line in effects.read_text().splitlines()]
    assert ran_on == ["a", "c"], "the version-2-only worker never ran the turn"


@pytest.mark.timeout(240)
async def test_a_worker_without_the_pinned_version_still_runs_new_turns_after_a_crash(
    kafka_bootstrap_servers: str, client: KafkaAgentClient, tmp_path: Path
) -> None:
    """Issue 46: a worker that took the partition over from a killed owner runs its turns
    one at a time (careful mode); the first, pinned to a version it lacks, is left, and
    must not count as the turn in flight, or no later turn of the partition starts."""
    name = unique_name("careful")
    gate, effects = tmp_path / "gate", tmp_path / "effects"
    env = {
        "VERSIONED_AGENT_NAME": name,
        "VERSIONED_GATE": str(gate),
        "VERSIONED_EFFECTS": str(effects),
    }
    apply_topics(kafka_bootstrap_servers, agent_topic_specs(name, partitions=1))
    procs: list[Managed] = []
    try:
        old = worker("a", "1", kafka_bootstrap_servers, env, tmp_path)
        procs.append(old)
        pinned_turn = await client.submit(name, question="Where is order 7?")
        await wait_for(lambda: effects.exists() and "a " in effects.read_text(), 90, "tool on a")
        stream = client.stream(name, pinned_turn.turn_id)
        await asyncio.wait_for(anext(e async for e in stream if e.type == "llm:complete"), 90)
        old.kill()  # SIGKILL: its intake mark stays open, so the next owner is careful
        gate.touch()

        new = worker("b", "2", kafka_bootstrap_servers, env, tmp_path)
        procs.append(new)
        pinned = f"turn {pinned_turn.turn_id} is pinned to version 1"
        await wait_for(lambda: pinned in new.log_path.read_text(), 90, "b left the turn alone")
        assert "running its turns one at a time" in new.log_path.read_text()

        # New turns of that partition (other keys) run on version 2, one after another.
        fresh = [await client.submit(name, question=f"Where is order {n}?") for n in (8, 9)]
        ends = [await asyncio.wait_for(last_event(client, name, h.turn_id), 90) for h in fresh]
    finally:
        for p in procs:
            p.kill()

    assert [e.data.get("result") for e in ends] == ["v2: it shipped", "v2: it shipped"]
    log_text = new.log_path.read_text()
    assert log_text.count(pinned) == 1, "the pinned turn was left once, not retried"


async def test_auto_upgrade_continues_on_new_code_and_fails_a_changed_step(
    kafka_bootstrap_servers: str, client: KafkaAgentClient
) -> None:
    name = unique_name("upgrade")
    gate = asyncio.Event()
    started = asyncio.Event()

    async def waits() -> str:
        started.set()
        await gate.wait()
        return "ok"

    @kafka_agent(
        name=name, llm=FakeLLM(["hi"]), partitions=1, version="1", version_behavior="auto_upgrade"
    )
    async def v1(ctx: AgentContext) -> str:
        await ctx.step("a", lambda: "a")
        return str(await ctx.step("wait", waits))

    @kafka_agent(
        name=name, llm=FakeLLM(["hi"]), partitions=1, version="2", version_behavior="auto_upgrade"
    )
    async def v2(ctx: AgentContext) -> str:
        await ctx.step("b", lambda: "b")
        return "never"

    quick = WorkerOptions(shutdown_grace=0.2)
    async with running_worker(v1, kafka_bootstrap_servers, quick):
        handle = await client.submit(name)
        await asyncio.wait_for(started.wait(), 60)
    async with running_worker(v2, kafka_bootstrap_servers, quick):
        events = [e async for e in client.stream(name, handle.turn_id)]
    assert events[-1].type == "run:error"
    assert events[-1].data["code"] == "replay_input_changed"
    assert "step 1" in events[-1].data["message"]
    # Events carry the version of the code that published them.
    assert events[0].data["version"] == "1" and events[-1].data["version"] == "2"


def test_versions_are_checked_when_the_agent_is_bound() -> None:
    async def old(ctx: AgentContext) -> str:
        return "old"

    with pytest.raises(AgentRegistrationError, match="versions= needs version="):
        kafka_agent(name="x", versions={"1": old})(old)
    with pytest.raises(AgentRegistrationError, match="lists only older bodies"):
        kafka_agent(name="x", version="1", versions={"1": old})(old)
    pinned = kafka_agent(name="x", version="2", versions={"1": old})(old)
    assert pinned.version_behavior == "pinned"
    assert kafka_agent(name="x")(old).version_behavior == "auto_upgrade"
