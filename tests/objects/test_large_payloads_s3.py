"""A turn far past a Kafka record on S3 (the session's real S3 server): a 20 MB request
document sent to the gateway as one JSON body, a 5 MB tool result, a 2 MB result; read
back whole by the gateway (Server-Sent Events and status) and by the Python client."""

from __future__ import annotations

import hashlib
import json
import uuid
from typing import Any

import boto3
import httpx
from botocore.config import Config

from pyrula_stream import (
    AgentContext,
    AgentLimits,
    KafkaAgentClient,
    ToolContext,
    WorkerOptions,
    kafka_agent,
    tool,
)
from pyrula_stream.gateway import AppOptions, create_app
from pyrula_stream.gateway.serve import running_gateway
from pyrula_stream.llm import FakeLLM, reply_tool_call
from pyrula_stream.objects.s3 import store_from_url
from pyrula_stream.objects.s3_server import LocalS3
from pyrula_stream.testing import read_topic, running_worker, unique_name
from pyrula_stream.wire.payload_refs import REF_MARK
from tests.conftest import S3_TEST_BUCKET
from tests.gateway.test_gateway import sse_events

DOCUMENT = 20_000_000
LOG = 5_000_000
RESULT = 2_000_000


async def test_a_large_turn_on_s3_reads_back_whole_through_gateway_and_client(
    kafka_bootstrap_servers: str, s3_server: LocalS3
) -> None:
    url = s3_server.store_url(S3_TEST_BUCKET, f"large-{uuid.uuid4().hex[:8]}")
    store = store_from_url(url)

    @tool
    async def read_log(ctx: ToolContext, name: str) -> str:
        """Read a log file."""
        return "L" * LOG

    @kafka_agent(
        name=unique_name("large-s3"),
        llm=FakeLLM([reply_tool_call("read_log", name="app.log"), "read it"]),
        tools=[read_log],
        partitions=1,
        limits=AgentLimits(max_tool_result_bytes=None),
    )
    async def agent(ctx: AgentContext, document: str) -> dict[str, Any]:
        answer = await ctx.llm.run([{"role": "user", "content": "read app.log"}])
        return {"document": len(document), "answer": answer, "summary": "S" * RESULT}

    app = create_app(
        agents=[agent.name],
        options=AppOptions(bootstrap_servers=kafka_bootstrap_servers, object_store=url),
    )
    expected = {"document": DOCUMENT, "answer": "read it", "summary": "S" * RESULT}
    async with (
        running_worker(agent, kafka_bootstrap_servers, WorkerOptions(object_store=url)),
        running_gateway(app) as base,
        httpx.AsyncClient(base_url=base, timeout=120) as http,
        KafkaAgentClient(kafka_bootstrap_servers, object_store=url) as client,
    ):
        body = json.dumps({"document": "D" * DOCUMENT})
        accepted = await http.post(
            f"/agents/{agent.name}/turns",
            content=body,
            headers={"Content-Type": "application/json"},
        )
        assert accepted.status_code == 202, accepted.text
        turn = accepted.json()
        async with http.stream("GET", turn["events_url"]) as response:
            frames = [data async for _, _, data in sse_events(response)]
        status = (await http.get(turn["status_url"])).json()
        events = [e async for e in client.stream(agent.name, turn["turn_id"])]

    assert frames[-1]["type"] == "run:complete", frames[-1]
    assert frames[-1]["data"]["result"] == expected
    assert frames[0]["data"]["params"]["document"] == "D" * DOCUMENT
    [tool_result] = [f for f in frames if f["type"] == "tool:result"]
    assert tool_result["data"]["output"] == "L" * LOG
    assert status["state"] == "completed" and status["events"] == len(frames)
    assert [e.type for e in events] == [f["type"] for f in frames]
    assert events[-1].data["result"] == expected
    assert events[0].data["params"]["document"] == "D" * DOCUMENT

    # The records stayed small and point into the bucket, where the values are.
    for topic in (agent.topics.turns, agent.topics.results, agent.topics.events):
        values = [value or b"" for _, value, _ in read_topic(kafka_bootstrap_servers, topic)]
        assert values and max(map(len, values)) < 300_000, topic
        assert any(REF_MARK in value for value in values), topic
    sizes = sorted(info.size for info in store.list())
    assert sizes[-1] == DOCUMENT + 2  # the document as its JSON string, uploaded in parts
    assert LOG + 2 in sizes


async def test_a_producer_of_another_language_writes_the_object_and_the_reference(
    kafka_bootstrap_servers: str, s3_server: LocalS3
) -> None:
    """docs/object-stores.md's rule, followed with a bare S3 client (as a Go or Java
    producer would): the JSON's SHA-256, the key <topic prefix>.<agent>/<sha[:2]>/<sha>,
    then the request with the reference. The producer needs no store of ours."""

    @kafka_agent(name=unique_name("foreign"), llm=FakeLLM(None), partitions=1)
    async def agent(ctx: AgentContext, document: str) -> int:
        return len(document)

    prefix = f"foreign-{uuid.uuid4().hex[:8]}/"
    value = json.dumps("Z" * 600_000).encode()
    sha = hashlib.sha256(value).hexdigest()
    key = f"pyrula.{agent.name}/{sha[:2]}/{sha}"
    raw = boto3.client(
        "s3",
        endpoint_url=s3_server.endpoint_url,
        config=Config(s3={"addressing_style": "path"}),
    )
    raw.put_object(
        Bucket=S3_TEST_BUCKET, Key=prefix + key, Body=value, ContentType="application/json"
    )
    ref = {
        "$pyrula_ref": {
            "store": "s3",
            "key": key,
            "size": len(value),
            "sha256": sha,
            "content_type": "application/json",
        }
    }
    url = s3_server.store_url(S3_TEST_BUCKET, prefix)
    async with (
        running_worker(agent, kafka_bootstrap_servers, WorkerOptions(object_store=url)),
        KafkaAgentClient(kafka_bootstrap_servers) as bare,  # a producer: no store of ours
        KafkaAgentClient(kafka_bootstrap_servers, object_store=url) as reader,
    ):
        handle = await bare.submit(agent.name, document=ref)
        events = [e async for e in reader.stream(agent.name, handle.turn_id)]
    assert events[-1].type == "run:complete", events[-1].data
    assert events[-1].data["result"] == 600_000
