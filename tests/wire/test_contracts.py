"""The JSON Schemas and the AsyncAPI document under ``schemas/`` are the code's: they are
regenerated and compared here, and real records a worker wrote validate against them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from jsonschema import Draft202012Validator

from pyrula_stream import AgentContext, KafkaAgentClient, ToolContext, kafka_agent, tool
from pyrula_stream.llm import FakeLLM, reply_tool_call
from pyrula_stream.testing import read_topic, running_worker, unique_name
from pyrula_stream.wire import contracts
from pyrula_stream.wire.events import EventType

SCHEMAS = Path(__file__).resolve().parent.parent.parent / "schemas"


def _validator(name: str) -> Draft202012Validator:
    return Draft202012Validator(json.loads((SCHEMAS / "json" / name).read_text()))


def test_the_checked_in_files_are_what_the_code_generates() -> None:
    """A change to an Avro schema, a payload class or a header that leaves these files
    behind fails here (``python -m pyrula_stream.wire.contracts`` rewrites them)."""
    assert contracts.stale(SCHEMAS) == []


def test_every_schema_is_a_valid_json_schema() -> None:
    for name in contracts.json_schemas():
        Draft202012Validator.check_schema(json.loads((SCHEMAS / "json" / name).read_text()))


def test_every_event_type_has_its_data_described() -> None:
    schema = json.loads((SCHEMAS / "json" / "event.schema.json").read_text())
    described = {rule["if"]["properties"]["type"]["const"] for rule in schema["allOf"]}
    assert described == {str(t) for t in EventType}


def test_the_asyncapi_document_points_at_files_and_messages_that_exist() -> None:
    doc = yaml.safe_load((SCHEMAS / "asyncapi.yaml").read_text())
    assert doc["asyncapi"].startswith("3.")
    messages = doc["components"]["messages"]
    for channel in doc["channels"].values():
        for ref in channel["messages"].values():
            assert ref["$ref"].removeprefix("#/components/messages/") in messages
    for message in messages.values():
        payload = message["payload"]
        ref = payload.get("$ref") or payload.get("schema", {}).get("$ref")
        if ref is not None:
            assert (SCHEMAS / ref).exists(), ref


def test_a_stale_file_is_named(tmp_path: Path) -> None:
    assert contracts.main(["--out", str(tmp_path)]) == 0
    assert contracts.stale(tmp_path) == []
    (tmp_path / "json" / "event.schema.json").write_text("{}\n")
    assert contracts.stale(tmp_path) == ["json/event.schema.json"]
    assert contracts.main(["--check", "--out", str(tmp_path)]) == 1


def _errors(validator: Draft202012Validator, value: Any) -> list[str]:
    return [f"{list(e.absolute_path)}: {e.message}" for e in validator.iter_errors(value)]


async def test_what_a_worker_writes_validates_against_the_schemas(
    kafka_bootstrap_servers: str, client: KafkaAgentClient
) -> None:
    """A turn with a tool, a status line and a result, and a turn that fails, in the JSON
    form a consumer without Avro reads: every event and result validates, and a value
    the schema forbids does not (so the check can fail)."""

    @tool
    async def lookup(ctx: ToolContext, order_id: str) -> str:
        """Looks an order up."""
        await ctx.emit_status("looking")
        return f"order {order_id}: shipped"

    @kafka_agent(
        name=unique_name("contract"),
        llm=FakeLLM([reply_tool_call("lookup", order_id="7"), "shipped"]),
        tools=[lookup],
        event_format="json",
    )
    async def agent(ctx: AgentContext, order_id: str) -> str:
        if order_id == "fail":
            raise ValueError("no such order")
        return await ctx.llm.run([{"role": "user", "content": f"where is {order_id}?"}])

    async with running_worker(agent, kafka_bootstrap_servers):
        await client.run(agent.name, order_id="7", timeout=60)
        await client.run(agent.name, order_id="fail", timeout=60)

    events = _validator("event.schema.json")
    seen = set()
    for _, raw, headers in read_topic(kafka_bootstrap_servers, agent.topics.events):
        assert headers["content-type"] == "application/json" and raw is not None
        event = json.loads(raw)
        seen.add(event["type"])
        assert _errors(events, event) == [], event
    assert {"run:start", "llm:complete", "tool:start", "tool:result", "status"} <= seen
    assert {"run:complete", "run:error"} <= seen

    results = _validator("turn_result.schema.json")
    statuses = []
    for _, raw, _ in read_topic(kafka_bootstrap_servers, agent.topics.results):
        assert raw is not None
        result = json.loads(raw)
        statuses.append(result["status"])
        assert _errors(results, result) == [], result
    assert sorted(statuses) == ["completed", "failed"]

    forged = {"type": "tool:result", "turn_id": "t", "agent": "a", "seq": 1, "ts_ms": 1}
    assert _errors(events, forged | {"data": {"tool": "lookup"}}) != []


@pytest.mark.parametrize(
    ("schema", "value"),
    [
        ("turn_request.schema.json", {"params": {"order_id": "7"}}),
        ("control.schema.json", {"turn_id": "t1", "action": "cancel"}),
        ("signal.schema.json", {"name": "approved", "payload": {"by": "ann"}}),
        (
            "reply.schema.json",
            {"parent_turn_id": "p", "child_turn_id": "c", "agent": "a", "status": "completed"},
        ),
    ],
)
def test_the_smallest_valid_bodies(schema: str, value: dict[str, Any]) -> None:
    assert _errors(_validator(schema), value) == []


def test_a_control_action_outside_the_list_is_refused() -> None:
    assert _errors(_validator("control.schema.json"), {"turn_id": "t", "action": "pause"})
