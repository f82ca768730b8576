"""Large inputs through the gateway: a streamed upload into the S3 store (the session's
real S3 server) becomes a reference the caller passes as a parameter; each key has its
own size limit, and may reference only what it uploaded itself."""

from __future__ import annotations

import asyncio
import hashlib
import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from jsonschema import Draft202012Validator

from pyrula_stream import AgentContext, WorkerOptions, kafka_agent
from pyrula_stream.gateway import AgentClient, create_app
from pyrula_stream.gateway.serve import running_gateway
from pyrula_stream.gateway.uploads import digest_key
from pyrula_stream.llm import FakeLLM
from pyrula_stream.objects.s3 import store_from_url
from pyrula_stream.objects.s3_server import LocalS3
from pyrula_stream.objects.sweep import live_digests, object_prefix, sweep
from pyrula_stream.testing import running_worker, unique_name
from pyrula_stream.wire.payload_refs import content_key
from tests.conftest import S3_TEST_BUCKET
from tests.gateway.test_gateway import AS_OPS, AS_WEB, options

DOCUMENT = "contract clause. " * 40_000  # 680 KB: past a record's share, under the limit
OPS_LIMIT = 100_000


def test_an_upload_key_is_the_content_address_of_its_bytes() -> None:
    data = b"some bytes"
    assert (
        digest_key(hashlib.sha256(data).hexdigest(), "uploads/web/")
        == (content_key(data, "uploads/web/")[0])
    )


async def test_an_upload_becomes_a_parameter_within_each_keys_limit(
    kafka_bootstrap_servers: str, s3_server: LocalS3
) -> None:
    store = store_from_url(s3_server.store_url(S3_TEST_BUCKET, f"gw-{uuid.uuid4().hex[:8]}"))

    @kafka_agent(name=unique_name("uploads"), llm=FakeLLM(None))
    async def agent(ctx: AgentContext, document: str) -> dict[str, Any]:
        return {"chars": len(document), "same": document == DOCUMENT}

    app = create_app(
        agents=[agent],
        options=options(
            kafka_bootstrap_servers, object_store=store, upload_limits={"ops": OPS_LIMIT}
        ),
    )
    uploads = f"/agents/{agent.name}/uploads"
    async with (
        running_worker(agent, kafka_bootstrap_servers, WorkerOptions(object_store=store)),
        running_gateway(app) as url,
        AgentClient(url, headers=AS_WEB) as web,
        httpx.AsyncClient(base_url=url, timeout=60, follow_redirects=True) as http,
    ):
        uploaded = await http.post(
            uploads,
            content=chunks(DOCUMENT.encode(), 64 * 1024),  # streamed, no Content-Length
            headers={**AS_WEB, "Content-Type": "text/plain; charset=utf-8"},
        )
        ref = uploaded.json()
        events = await web.run(agent.name, document=ref)
        document = (await http.get("/openapi.json", headers=AS_WEB)).json()

        over = await http.post(uploads, content=b"x" * (OPS_LIMIT + 1), headers=AS_OPS)
        over_streamed = await http.post(
            uploads, content=chunks(b"x" * (OPS_LIMIT * 2), 16 * 1024), headers=AS_OPS
        )
        within = await http.post(uploads, content=b"x" * OPS_LIMIT, headers=AS_OPS)
        borrowed = await http.post(
            f"/agents/{agent.name}/turns", json={"document": ref}, headers=AS_OPS
        )
        smuggled = await http.post(
            uploads,
            content=json.dumps({"inner": ref}).encode(),
            headers={**AS_OPS, "Content-Type": "application/json"},
        )

    assert uploaded.status_code == 201, uploaded.text
    body = ref["$pyrula_ref"]
    size = len(DOCUMENT.encode())
    assert body["store"] == "s3" and body["size"] == size
    space = f"pyrula.{agent.name}/uploads/"  # with the agent's objects, which it sweeps
    assert body["key"] == content_key(DOCUMENT.encode(), f"{space}web/")[0]
    assert body["content_type"].startswith("text/plain")
    assert store.get(body["key"]) == DOCUMENT.encode()
    schema = {"$ref": "#/components/schemas/PayloadReference", **document}
    assert list(Draft202012Validator(schema).iter_errors(ref)) == []
    assert "/{agent}/uploads" in document["paths"]

    assert events[-1].type == "run:complete", events[-1].data
    assert events[-1].data["result"] == {"chars": len(DOCUMENT), "same": True}

    for refused in (over, over_streamed):
        assert refused.status_code == 413, refused.text
        assert (
            f"over {OPS_LIMIT} bytes, the upload limit of API key 'ops'" in refused.json()["error"]
        )
    assert within.status_code == 201
    assert within.json()["$pyrula_ref"]["key"].startswith(f"{space}ops/")
    for refused in (borrowed, smuggled):
        assert refused.status_code == 422, refused.text
        assert "is not an upload of API key 'ops' to this agent" in refused.json()["error"]

    # The agent's sweep sees its uploads: the one no turn references goes, the other stays.
    topics = [spec.name for spec in agent.topic_specs()]
    swept = await asyncio.to_thread(
        sweep,
        store,
        object_prefix("pyrula", agent.name),
        lambda: live_digests(kafka_bootstrap_servers, "pyrula", topics=topics)[0],
        grace_s=0,
    )
    assert swept.deleted == [within.json()["$pyrula_ref"]["key"]]
    assert store.exists(body["key"])


async def chunks(data: bytes, size: int) -> AsyncIterator[bytes]:
    for start in range(0, len(data), size):
        yield data[start : start + size]


def test_upload_limits_are_numbers_of_bytes_per_key() -> None:
    from pyrula_stream.cli.gateway import upload_limits
    from pyrula_stream.errors import ConfigurationError
    from pyrula_stream.gateway import AppOptions

    assert upload_limits(["ops=100", "web=2000000"]) == {"ops": 100, "web": 2_000_000}
    for bad in (["ops"], ["ops=lots"], ["ops=0"], ["ops=1", "ops=2"]):
        with pytest.raises(ConfigurationError, match="--upload-limit"):
            upload_limits(bad)
    with pytest.raises(ConfigurationError, match=r"upload_limits\['ops'\] must be"):
        AppOptions(upload_limits={"ops": 0})
    options = AppOptions(max_upload_bytes=10, upload_limits={"ops": 5})
    assert (options.upload_limit("ops"), options.upload_limit("web")) == (5, 10)
    assert options.upload_limit(None) == 10
