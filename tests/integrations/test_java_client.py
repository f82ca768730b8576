"""A turn from another language: ``examples/java/TurnClient.java``, on the Kafka Java
client alone, produces a JSON turn request and reads the turn's JSON events until it
ends, against a real worker on the real broker."""

from __future__ import annotations

import asyncio
import json
import subprocess
from pathlib import Path

from jsonschema import Draft202012Validator

from pyrula_stream import AgentContext, ToolContext, kafka_agent, tool
from pyrula_stream.kafka.local.broker import check_java, fetch_jars
from pyrula_stream.llm import FakeLLM, reply_tool_call
from pyrula_stream.testing import running_worker, unique_name

ROOT = Path(__file__).resolve().parent.parent.parent
CLIENT = ROOT / "examples" / "java" / "TurnClient.java"
EVENT_SCHEMA = json.loads((ROOT / "schemas" / "json" / "event.schema.json").read_text())


def _java_client(bootstrap: str, agent: str, params: str) -> subprocess.CompletedProcess[str]:
    """The example as its header says to run it (the broker's jars hold kafka-clients
    and jackson-databind)."""
    return subprocess.run(
        [check_java(), "-cp", f"{fetch_jars()}/*", str(CLIENT), bootstrap, agent, params],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


async def test_a_java_client_submits_a_turn_and_reads_its_events(
    kafka_bootstrap_servers: str,
) -> None:
    @tool
    async def lookup(ctx: ToolContext, order_id: str) -> str:
        """Where an order is."""
        return f"order {order_id} shipped on Monday"

    @kafka_agent(
        name=unique_name("javaclient"),
        llm=FakeLLM([reply_tool_call("lookup", order_id="9"), "It shipped on Monday."]),
        tools=[lookup],
        event_format="json",
    )
    async def agent(ctx: AgentContext, question: str) -> str:
        return await ctx.llm.run([{"role": "user", "content": question}])

    async with running_worker(agent, kafka_bootstrap_servers):
        done = await asyncio.to_thread(
            _java_client,
            kafka_bootstrap_servers,
            agent.name,
            json.dumps({"question": "Where is order 9?"}),
        )
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert lines[0].startswith("submitted ")
    seqs, types = [], []
    for line in lines[1:]:
        seq, type_, data = line.split(" ", 2)
        seqs.append(int(seq))
        types.append(type_)
        event = {"type": type_, "turn_id": "t", "agent": agent.name, "seq": int(seq), "ts_ms": 0}
        errors = list(
            Draft202012Validator(EVENT_SCHEMA).iter_errors(event | {"data": json.loads(data)})
        )
        assert errors == [], (line, errors)
    assert seqs == list(range(len(seqs)))
    assert types[0] == "run:start" and types[-1] == "run:complete"
    assert {"tool:start", "tool:result"} <= set(types)
    assert json.loads(lines[-1].split(" ", 2)[2])["result"] == "It shipped on Monday."


async def test_a_failed_turn_ends_the_java_client_with_code_1(kafka_bootstrap_servers: str) -> None:
    @kafka_agent(name=unique_name("javafail"), llm=FakeLLM(), event_format="json")
    async def agent(ctx: AgentContext, question: str) -> str:
        raise ValueError("no answer")

    async with running_worker(agent, kafka_bootstrap_servers):
        done = await asyncio.to_thread(
            _java_client, kafka_bootstrap_servers, agent.name, '{"question": "?"}'
        )
    assert done.returncode == 1, done.stdout + done.stderr[-3000:]
    assert done.stdout.splitlines()[-1].split(" ", 2)[1] == "run:error"
