"""Recorded turns on the real broker: keep_history, `turn export`, and offline replay of
the export against today's code (`pyrula-stream replay`, `assert_replays`)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from pyrula_stream import AgentContext, KafkaAgent, KafkaAgentClient, WorkerOptions, kafka_agent
from pyrula_stream.llm import FakeLLM, ModelResponse, ToolDefinition, reply_text
from pyrula_stream.runtime.replay import replay_turn
from pyrula_stream.state.history import TurnRecording, export_turn
from pyrula_stream.testing import assert_replays, running_worker, unique_name
from tests.agents.recorded import SYSTEM, add_note, lookup_order, make_agent, order_model

ROOT = Path(__file__).parents[2]
QUICK_STOP = WorkerOptions(shutdown_grace=0.2)


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pyrula_stream.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
    )


@pytest.fixture
async def exported(
    kafka_bootstrap_servers: str, client: KafkaAgentClient, tmp_path: Path
) -> tuple[str, Path]:
    """A completed turn of a keep_history agent, exported with the CLI to a file."""
    agent = make_agent(unique_name("rec"))
    async with running_worker(agent, kafka_bootstrap_servers, QUICK_STOP):
        handle = await client.submit(agent.name, question="Where is order 42?")
        events = [e async for e in client.stream(agent.name, handle.turn_id)]
    assert events[-1].type == "run:complete"
    out = cli(
        "turn",
        "export",
        handle.turn_id,
        "--agent",
        agent.name,
        "--bootstrap-servers",
        kafka_bootstrap_servers,
    )
    assert out.returncode == 0, out.stderr
    path = tmp_path / "turn.json"
    path.write_text(out.stdout)
    return agent.name, path


async def test_export_writes_request_steps_and_events(exported: tuple[str, Path]) -> None:
    _, path = exported
    raw = json.loads(path.read_text())
    assert raw["request"]["params"] == {"question": "Where is order 42?"}
    assert [(s["step"], s["kind"], s["name"]) for s in raw["steps"]] == [
        (0, "start", "start"),
        (1, "llm", "llm"),
        (2, "tool", "lookup_order"),
        (3, "llm", "llm"),
        (4, "tool", "add_note"),
        (5, "llm", "llm"),
    ]
    assert raw["terminal"]["type"] == "run:complete"
    assert raw["terminal"]["result"].startswith("Order 42:")
    types = [e["type"] for e in raw["events"]]
    assert types[0] == "run:start" and types[-1] == "run:complete"
    assert [e["seq"] for e in raw["events"]] == list(range(len(types)))


async def test_an_exported_turn_replays_cleanly_on_the_same_code(
    exported: tuple[str, Path],
) -> None:
    name, path = exported
    report = await replay_turn(make_agent(name), TurnRecording.load(path))
    assert report.clean, report.message
    assert_replays(make_agent(name), path)


async def test_a_changed_system_prompt_is_reported_at_the_first_model_call(
    exported: tuple[str, Path],
) -> None:
    name, path = exported
    report = await replay_turn(make_agent(name, "Be terse."), TurnRecording.load(path))
    assert not report.clean
    assert report.step == 1
    assert "the system prompt changed" in report.message
    with pytest.raises(AssertionError, match="system prompt changed"):
        assert_replays(make_agent(name, "Be terse."), path)


async def test_changed_calls_messages_and_a_shorter_body_are_reported(
    exported: tuple[str, Path],
) -> None:
    name, path = exported
    recording = TurnRecording.load(path)

    @kafka_agent(name=name, llm=FakeLLM(order_model), tools=[lookup_order, add_note])
    async def direct(ctx: AgentContext, question: str) -> str:
        await lookup_order(ctx, order_id="43")
        return "done"

    report = await replay_turn(direct, recording)
    assert not report.clean
    assert report.step == 1
    assert "the code now makes tool 'lookup_order'" in report.message

    @kafka_agent(name=name, llm=FakeLLM(order_model), tools=[lookup_order, add_note])
    async def reworded(ctx: AgentContext, question: str) -> str:
        return await ctx.llm.run([{"role": "user", "content": f"{question}!"}], system=SYSTEM)

    report = await replay_turn(reworded, recording)
    assert not report.clean
    assert report.step == 1
    assert report.message.endswith("(llm 'llm'): the conversation messages changed")

    @kafka_agent(name=name, llm=FakeLLM(order_model), tools=[lookup_order, add_note])
    async def stops_early(ctx: AgentContext, question: str) -> str:
        return "no model today"

    report = await replay_turn(stops_early, recording)
    assert not report.clean
    assert "the code ended after step 0" in report.message

    @kafka_agent(name=name, llm=FakeLLM(order_model), tools=[lookup_order, add_note])
    async def renamed_param(ctx: AgentContext, query: str) -> str:
        return query

    report = await replay_turn(renamed_param, recording)
    assert not report.clean
    assert report.message.startswith("the turn now ends with run:error invalid_request:")
    assert "question" in report.message


async def test_a_turn_recorded_on_version_1_replays_on_the_kept_body_or_names_the_gap(
    exported: tuple[str, Path],
) -> None:
    name, path = exported
    recording = TurnRecording.load(path)
    recording.steps[0].data["version"] = "1"  # as if it started on version 1
    old = make_agent(name)

    @kafka_agent(name=name, llm=FakeLLM(order_model), tools=[lookup_order, add_note])
    async def new_body(ctx: AgentContext, question: str) -> str:
        return "new code"

    def deploy(**versions: Any) -> KafkaAgent:
        return kafka_agent(
            name=name,
            llm=FakeLLM(order_model),
            tools=[lookup_order, add_note],
            version="2",
            versions=versions,
        )(new_body.fn)

    kept = await replay_turn(deploy(**{"1": old.fn}), recording)
    assert kept.clean, kept.message
    dropped = await replay_turn(deploy(), recording)
    assert not dropped.clean
    assert "turn started on version '1'; this worker has ['2']: keep that body" in dropped.message


def test_the_replay_command_prints_the_changed_step(exported: tuple[str, Path]) -> None:
    name, path = exported
    spec = "tests.agents.recorded:recorded"
    same = cli("replay", spec, str(path), env={"RECORDED_AGENT_NAME": name})
    assert same.returncode == 0, same.stderr
    assert same.stdout.strip().endswith("replays cleanly")
    changed = cli(
        "replay", spec, str(path), env={"RECORDED_AGENT_NAME": name, "RECORDED_SYSTEM": "Hi."}
    )
    assert changed.returncode == 1, changed.stderr
    assert "step 1 (llm 'llm'): the system prompt changed" in changed.stdout
    assert SYSTEM not in changed.stdout


def test_export_of_an_unrecorded_turn_names_the_reason(kafka_bootstrap_servers: str) -> None:
    name = unique_name("norec")
    from pyrula_stream.kafka.admin import agent_topic_specs, apply_topics

    apply_topics(kafka_bootstrap_servers, agent_topic_specs(name, partitions=1, keep_history=True))
    out = cli(
        "turn", "export", "nope", "--agent", name, "--bootstrap-servers", kafka_bootstrap_servers
    )
    assert out.returncode == 2
    assert "keep_history=True" in out.stderr


async def test_a_turn_that_used_memory_replays_offline(
    kafka_bootstrap_servers: str, client: KafkaAgentClient
) -> None:
    ns = ("replay", unique_name("mem"))

    def remembering(name: str, key: str) -> KafkaAgent:
        @kafka_agent(name=name, llm=FakeLLM(), keep_history=True, partitions=1)
        async def remembers(ctx: AgentContext, n: int) -> str:
            before = await ctx.memory.get(ns, key)
            await ctx.memory.put(ns, key, {"n": n})
            return f"was {before.value['n'] if before else None}"

        return remembers

    agent = remembering(unique_name("mem"), "k")
    async with running_worker(agent, kafka_bootstrap_servers, QUICK_STOP):
        first = await client.run(agent.name, n=1, timeout=60)
        second = await client.run(agent.name, n=2, timeout=60)
    assert first[-1].data["result"] == "was None" and second[-1].data["result"] == "was 1"
    recording = await asyncio.to_thread(
        export_turn,
        kafka_bootstrap_servers,
        history_topic=agent.topics.history,
        events_topic=agent.topics.events,
        turn_id=second[0].turn_id,
    )

    report = await replay_turn(agent, recording)
    assert report.clean, report.message
    moved = await replay_turn(remembering(agent.name, "other"), recording)
    assert not moved.clean and moved.step == 1
    assert "memory 'get'" in moved.message and "arguments changed" in moved.message


async def test_a_turn_in_a_thread_replays_offline_with_the_threads_earlier_messages(
    kafka_bootstrap_servers: str, client: KafkaAgentClient
) -> None:
    def answers(messages: list[dict[str, Any]], tools: list[ToolDefinition]) -> ModelResponse:
        return reply_text(f"seen {len(messages)} messages")

    @kafka_agent(name=unique_name("thread"), llm=FakeLLM(answers), keep_history=True)
    async def chat(ctx: AgentContext, text: str) -> str:
        return await ctx.llm.run([{"role": "user", "content": text}])

    thread = unique_name("t")
    async with running_worker(chat, kafka_bootstrap_servers, QUICK_STOP):
        await client.run(chat.name, thread_id=thread, text="one", timeout=60)
        two = await client.run(chat.name, thread_id=thread, text="two", timeout=60)
    assert two[-1].data["result"] == "seen 3 messages", "the thread's first turn came first"
    recording = await asyncio.to_thread(
        export_turn,
        kafka_bootstrap_servers,
        history_topic=chat.topics.history,
        events_topic=chat.topics.events,
        turn_id=two[0].turn_id,
    )

    report = await replay_turn(chat, recording)
    assert report.clean, report.message
