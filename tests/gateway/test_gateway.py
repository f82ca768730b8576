"""The HTTP gateway (issue 24) on the real broker: uvicorn serves ``create_app``, httpx and
``AgentClient`` call it, a worker runs the turns."""

from __future__ import annotations

import asyncio
import dataclasses
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from confluent_kafka import Consumer, TopicPartition

from pyrula_stream import AgentContext, ToolContext, kafka_agent, tool
from pyrula_stream.access.api_keys import APIKeyAuth
from pyrula_stream.chaos.partition import PartitionProxy
from pyrula_stream.chaos.processes import free_port
from pyrula_stream.errors import ConfigurationError
from pyrula_stream.gateway import AgentClient, AppOptions, create_app
from pyrula_stream.gateway.client import GatewayError
from pyrula_stream.gateway.serve import running_gateway
from pyrula_stream.kafka.admin import agent_topic_specs, apply_topics
from pyrula_stream.kafka.local.broker import start_local_broker
from pyrula_stream.llm import FakeLLM, reply_tool_call
from pyrula_stream.testing import running_worker, unique_name
from tests.agents.echo import echo
from tests.mcp_servers.processes import ROOT, sigkill, start_listening

WEB = "k-web-0123456789abcdef0123456789abcdef"
OPS = "k-ops-fedcba9876543210fedcba9876543210"
KEYS = APIKeyAuth({"web": WEB, "ops": OPS})
AS_WEB = {"Authorization": f"Bearer {WEB}"}
AS_OPS = {"Authorization": f"Bearer {OPS}"}


@tool(read_only=True)
async def pause(ctx: ToolContext, seconds: float) -> str:
    """Wait, so the turn's events arrive in two bursts."""
    await asyncio.sleep(seconds)
    return "paused"


@kafka_agent(
    name="gwslow",
    llm=FakeLLM([reply_tool_call("pause", seconds=1.5), "done pausing"]),
    tools=[pause],
    partitions=2,
)
async def slow(ctx: AgentContext, text: str) -> str:
    return await ctx.llm.run([{"role": "user", "content": text}])


def options(bootstrap: str, **kw: Any) -> AppOptions:
    return AppOptions(bootstrap_servers=bootstrap, auth=KEYS, **kw)


def turns_written(bootstrap: str, topic: str) -> int:
    """Records ever produced to ``topic`` (sum of its partitions' high watermarks)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": unique_name("gwcount")})
    try:
        parts = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        return sum(
            consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in parts
        )
    finally:
        consumer.close()


async def sse_events(response: httpx.Response) -> AsyncIterator[tuple[str, str, dict[str, Any]]]:
    """(id, event, data) of each SSE message, as a browser's EventSource parses them."""
    fields: dict[str, str] = {}
    async for line in response.aiter_lines():
        if line.startswith(":"):
            continue
        if line:
            name, _, value = line.partition(": ")
            fields[name] = value
            continue
        if "data" in fields:
            import json

            yield fields.get("id", ""), fields.get("event", ""), json.loads(fields["data"])
        fields = {}


@pytest.fixture(scope="module")
def agents() -> tuple[Any, Any]:
    return (
        dataclasses.replace(echo, name=unique_name("gwecho")),
        dataclasses.replace(slow, name=unique_name("gwslow")),
    )


async def test_submit_stream_idempotency_owners_and_keys(
    kafka_bootstrap_servers: str, agents: tuple[Any, Any]
) -> None:
    agent = agents[0]
    app = create_app(agents=[agent], options=options(kafka_bootstrap_servers))
    async with (
        running_worker(agent, kafka_bootstrap_servers),
        running_gateway(app) as url,
        AgentClient(url, headers=AS_WEB) as web,
        httpx.AsyncClient(base_url=url, timeout=30) as http,
    ):
        listed = (await http.get("/agents/", headers=AS_WEB)).json()
        events = await web.run(agent.name, text="hello")
        first = await web.submit(agent.name, idempotency_key="order-7", text="again")
        second = await web.submit(agent.name, idempotency_key="order-7", text="again")
        async with http.stream("GET", first.events_url, headers=AS_WEB) as response:
            frames = [f async for f in sse_events(response)]
            content_type = response.headers["content-type"]
        async with http.stream("GET", first.events_url, headers=AS_WEB) as again:
            again_frames = [f async for f in sse_events(again)]
            answered = [response.headers, again.headers]
        status = await web.status(agent.name, first.turn_id)
        # another principal: as if the turn did not exist
        base = f"/agents/{agent.name}/turns/{first.turn_id}"
        foreign = [
            await http.get(f"{base}/events", headers=AS_OPS),
            await http.get(base, headers=AS_OPS),
            await http.post(f"{base}/cancel", headers=AS_OPS, json={}),
        ]
        missing = await http.get(base)
        wrong = await http.get(base, headers={"Authorization": "Bearer nope"})
        before = turns_written(kafka_bootstrap_servers, f"pyrula.{agent.name}.turns")
        bad = await http.post(f"/agents/{agent.name}/turns", headers=AS_WEB, json={"txt": "x"})
        after = turns_written(kafka_bootstrap_servers, f"pyrula.{agent.name}.turns")
        unknown = await http.post("/agents/nosuch/turns", headers=AS_WEB, json={"text": "x"})
        threaded = await web.submit(agent.name, thread_id="t-1", text="hi")
        in_thread = [e async for e in web.stream_from_path(threaded.events_url)]
        thread_status = await http.get(threaded.status_url, headers=AS_WEB)
        thread_path = f"/agents/{agent.name}/threads/t-1"
        thread = (await http.get(thread_path, headers=AS_WEB)).json()
        not_theirs = (await http.get(thread_path, headers=AS_OPS)).json()
        deleted = (await http.delete(thread_path, headers=AS_WEB)).json()

    assert listed["agents"][0]["name"] == agent.name and listed["agents"][0]["validates"]
    assert events[0].type == "run:start"
    assert events[-1].type == "run:complete" and events[-1].data["result"] == "said it"
    assert [e.seq for e in events] == list(range(len(events)))
    assert first.turn_id == second.turn_id  # one Idempotency-Key, one turn
    assert content_type.startswith("text/event-stream")
    assert again_frames == frames  # a finished turn's stream is read again whole
    for headers in answered:  # the guard's headers, once each, on every stream
        assert headers.get_list("x-frame-options") == ["DENY"]
        assert headers.get_list("x-accel-buffering") == ["no"]
        assert headers.get_list("cache-control") == ["no-cache"]
    assert [int(i) for i, _, _ in frames] == list(range(len(frames)))
    assert [kind for _, kind, _ in frames][-1] == "run:complete"
    assert frames[0][2]["data"]["metadata"]["owner"] == "web"
    assert status.state == "completed"
    assert [r.status_code for r in foreign] == [404, 404, 404]
    assert {r.json()["code"] for r in foreign} == {"not_found"}
    assert (missing.status_code, missing.json()["code"]) == (401, "auth_missing")
    assert (wrong.status_code, wrong.json()["code"]) == (401, "auth_invalid")
    assert bad.status_code == 422
    assert bad.json()["code"] == "invalid_request" and bad.json()["field"] == "text"
    assert after == before  # a refused request reaches no topic
    assert (unknown.status_code, unknown.json()["code"]) == (404, "not_found")
    assert in_thread[-1].type == "run:complete"
    assert thread_status.json()["state"] == "completed"
    assert [t["turn_id"] for t in thread["turns"]] == [threaded.turn_id]
    assert not_theirs == {"thread_id": "t-1", "turns": []}  # ops' t-1 is another thread
    assert deleted == {"thread_id": "t-1", "deleted_turns": 1}


async def test_a_dropped_stream_resumes_on_another_gateway(
    kafka_bootstrap_servers: str, agents: tuple[Any, Any]
) -> None:
    agent = agents[1]
    first_app = create_app(agents=[agent], options=options(kafka_bootstrap_servers))
    second_app = create_app(agents=[agent.name], options=options(kafka_bootstrap_servers))
    async with (
        running_worker(agent, kafka_bootstrap_servers),
        running_gateway(first_app) as first_url,
        running_gateway(second_app) as second_url,
        AgentClient(first_url, headers=AS_WEB) as web,
    ):
        turn = await web.submit(agent.name, text="slowly")
        seen: list[tuple[str, str, dict[str, Any]]] = []
        async with (
            httpx.AsyncClient(base_url=first_url, timeout=30) as http,
            http.stream("GET", turn.events_url, headers=AS_WEB) as response,
        ):
            async for frame in sse_events(response):
                seen.append(frame)
                if frame[1] == "tool:start":
                    break  # the connection drops here, mid-turn
        resumed: list[tuple[str, str, dict[str, Any]]] = []
        headers = {**AS_WEB, "Last-Event-ID": seen[-1][0]}
        async with (
            httpx.AsyncClient(base_url=second_url, timeout=30) as http,
            http.stream("GET", turn.events_url, headers=headers) as response,
        ):
            resumed = [f async for f in sse_events(response)]
            foreign = await http.get(turn.status_url, headers=AS_OPS)

    ids = [int(i) for i, _, _ in seen + resumed]
    assert ids == list(range(len(ids)))  # nothing lost, nothing twice
    assert int(resumed[0][0]) == int(seen[-1][0]) + 1
    assert resumed[-1][1] == "run:complete" and resumed[-1][2]["data"]["result"] == "done pausing"
    assert foreign.status_code == 404  # the second gateway read the owner from Kafka


async def test_the_client_reconnects_when_the_gateway_ends_a_stream(
    kafka_bootstrap_servers: str, agents: tuple[Any, Any]
) -> None:
    agent = agents[1]
    app = create_app(
        agents=[agent], options=options(kafka_bootstrap_servers, sse_max_duration_s=0.5)
    )
    async with (
        running_worker(agent, kafka_bootstrap_servers),
        running_gateway(app) as url,
        AgentClient(url, headers=AS_WEB) as web,
    ):
        events = await web.run(agent.name, text="slowly")

    assert [e.seq for e in events] == list(range(len(events)))
    assert events[-1].type == "run:complete"


async def test_stream_limits_answer_429(kafka_bootstrap_servers: str) -> None:
    name = unique_name("gwidle")  # topics, no worker: its turns stay queued, streams open
    await asyncio.to_thread(
        apply_topics, kafka_bootstrap_servers, agent_topic_specs(name, partitions=1)
    )
    app = create_app(
        agents=[name],
        options=options(
            kafka_bootstrap_servers,
            sse_max_streams=1,
            sse_max_streams_per_owner=1,
            sse_keepalive_interval=0.2,
        ),
    )
    async with (
        running_gateway(app) as url,
        AgentClient(url, headers=AS_WEB) as web,
        AgentClient(url, headers=AS_OPS) as ops,
        httpx.AsyncClient(base_url=url, timeout=30) as http,
    ):
        mine = await web.submit(name, text="a")
        theirs = await ops.submit(name, text="b")
        async with http.stream("GET", mine.events_url, headers=AS_WEB) as held:
            assert held.status_code == 200
            async with asyncio.timeout(10):  # nothing happens: a comment keeps it alive
                async for line in held.aiter_lines():
                    if line == ": keepalive":
                        break
            again = await http.get(mine.events_url, headers=AS_WEB)
            other = await http.get(theirs.events_url, headers=AS_OPS)
        later = await http.get(theirs.status_url, headers=AS_OPS)
        reopened = 0
        for _ in range(50):  # the dropped stream's slot is given back
            async with http.stream("GET", theirs.events_url, headers=AS_OPS) as response:
                reopened = response.status_code
            if reopened == 200:
                break
            await asyncio.sleep(0.1)
    deep = create_app(agents=[name], options=options(kafka_bootstrap_servers, max_queue_depth=1))
    transport = httpx.ASGITransport(app=deep)
    async with AgentClient("http://127.0.0.1", transport=transport, headers=AS_WEB) as web:
        with pytest.raises(GatewayError) as queued:  # two turns wait: more than 1
            await web.submit(name, text="c")

    assert (again.status_code, again.json()["code"]) == (429, "backpressure_rejected")
    assert "sse_max_streams_per_owner" in again.json()["error"]
    assert other.status_code == 429 and "(sse_max_streams)" in other.json()["error"]
    assert later.status_code == 200 and later.json()["state"] == "queued"
    assert reopened == 200
    assert queued.value.status == 429 and queued.value.error_code == "backpressure_rejected"
    assert "max_queue_depth=1" in str(queued.value)


async def test_a_broker_that_is_down_is_a_503_not_a_hang() -> None:
    down = f"127.0.0.1:{free_port()}"  # nothing listens there
    app = create_app(agents=["nobody"], options=AppOptions(bootstrap_servers=down, kafka_timeout=1))
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as http:
        started = time.monotonic()
        submit = await http.post("/agents/nobody/turns", json={"text": "x"})
        status = await http.get("/agents/nobody/turns/abc")
        ready = await http.get("/readyz")
        healthy = await http.get("/healthz")
        took = time.monotonic() - started

    for answer in (submit, status, ready):
        assert answer.status_code == 503, answer.text
        assert answer.json()["code"] == "store_unavailable"
        assert answer.headers["retry-after"] == "5"
    assert healthy.status_code == 200
    assert took < 15


async def test_the_bind_refusal_and_the_cli_with_keys_from_the_environment(
    kafka_bootstrap_servers: str,
) -> None:
    with pytest.raises(ConfigurationError, match=r"serve on 0\.0\.0\.0 without API keys"):
        create_app(agents=["a"], options=AppOptions(host="0.0.0.0"))
    create_app(agents=["a"], options=AppOptions(host="0.0.0.0", auth=KEYS))  # keys: fine
    command = [sys.executable, "-m", "pyrula_stream.cli", "gateway", "tests.agents.echo:echo"]
    command += ["--host", "0.0.0.0", "--bootstrap-servers", kafka_bootstrap_servers]
    refused = await asyncio.to_thread(
        subprocess.run, command, cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert refused.returncode == 2
    assert "without API keys" in refused.stderr and "--allow-unauthenticated" in refused.stderr

    port = free_port()  # the same command serves, with its keys from $PYRULA_API_KEYS
    command[command.index("0.0.0.0")] = "127.0.0.1"
    env = {"PYRULA_API_KEYS": f"web={WEB},ops={OPS}", "ECHO_AGENT_NAME": unique_name("gwcli")}
    proc = await asyncio.to_thread(start_listening, [*command, "--port", str(port)], port, env)
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30) as http:
            keyless = await http.get("/agents/")
            listed = await http.get("/agents/", headers=AS_OPS)
            bad = await http.post(
                f"/agents/{env['ECHO_AGENT_NAME']}/turns", headers=AS_WEB, json={"text": 3.5}
            )
    finally:
        sigkill(proc)
    assert keyless.status_code == 401
    assert [a["name"] for a in listed.json()["agents"]] == [env["ECHO_AGENT_NAME"]]
    assert (bad.status_code, bad.json()["field"]) == (422, "text")  # checked by the gateway


async def test_client_errors_carry_the_code(kafka_bootstrap_servers: str) -> None:
    app = create_app(agents=["a"], options=options(kafka_bootstrap_servers, max_body_bytes=100))
    transport = httpx.ASGITransport(app=app)
    async with AgentClient("http://127.0.0.1", transport=transport, headers=AS_WEB) as web:
        with pytest.raises(GatewayError) as caught:
            await web.status("other", "t1")
        with pytest.raises(GatewayError) as too_big:
            await web.submit("a", text="x" * 200)
        with pytest.raises(GatewayError) as bad_metadata:
            await web.submit("a", metadata="not an object")  # type: ignore[arg-type]
    assert caught.value.status == 404 and caught.value.error_code == "not_found"
    assert too_big.value.status == 413 and too_big.value.error_code == "invalid_request"
    assert bad_metadata.value.status == 422 and bad_metadata.value.body["field"] == "metadata"


async def test_static_pages_sign_in_with_a_key_and_the_cookie_reaches_the_routes() -> None:
    page = f"{ROOT}/examples/web_chat"
    app = create_app(agents=["a"], options=AppOptions(auth=KEYS, static_dir=page))
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as browser:
        html = {"Accept": "text/html"}
        before = await browser.get("/", headers=html)
        api_before = await browser.get("/agents/")
        signed = await browser.post("/login", data={"key": WEB})
        after = await browser.get("/", headers=html)
        script = await browser.get("/chat.js")
        api_after = await browser.get("/agents/")

    assert before.status_code == 401 and "API key" in before.text  # the sign-in form
    assert api_before.status_code == 401
    assert signed.status_code == 303 and "HttpOnly" in signed.headers["set-cookie"]
    assert after.status_code == 200 and "pyrula-stream web chat" in after.text
    assert script.status_code == 200 and "EventSource" in script.text
    assert api_after.status_code == 200 and api_after.json()["agents"][0]["name"] == "a"


@pytest.mark.broker
async def test_a_broker_that_goes_away_is_a_503_and_the_gateway_recovers(
    tmp_path: Path, agents: tuple[Any, Any]
) -> None:
    """The same gateway process: 202 while Kafka answers, 503 ``store_unavailable`` with a
    ``Retry-After`` while every connection to it is cut, ready and 202 again once it heals."""
    echo_agent, _ = agents
    port = free_port()
    proxy = PartitionProxy(free_port(), port)
    broker = start_local_broker(data_dir=tmp_path / "kafka", port=port, advertised_port=proxy.port)
    bootstrap = proxy.bootstrap_servers
    try:
        apply_topics(bootstrap, echo_agent.topic_specs())
        app = create_app(agents=[echo_agent], options=options(bootstrap, kafka_timeout=2))
        async with running_gateway(app) as url, httpx.AsyncClient(base_url=url) as http:
            route = f"/agents/{echo_agent.name}/turns"
            before = await http.post(route, json={"text": "up"}, headers=AS_WEB)
            proxy.cut()
            down = await http.post(route, json={"text": "down"}, headers=AS_WEB)
            not_ready = await http.get("/readyz")
            proxy.heal()
            for _ in range(60):  # librdkafka reconnects with a backoff of up to 10 s
                ready = await http.get("/readyz")
                if ready.status_code == 200:
                    break
                await asyncio.sleep(0.5)
            after = await http.post(route, json={"text": "up again"}, headers=AS_WEB)
    finally:
        broker.stop()
        proxy.close()
    assert before.status_code == 202, before.text
    for answer in (down, not_ready):
        assert answer.status_code == 503, answer.text
        assert answer.json()["code"] == "store_unavailable"
        assert answer.headers["retry-after"]
    assert ready.status_code == 200, ready.text
    assert after.status_code == 202, after.text
    assert after.json()["turn_id"] != before.json()["turn_id"]
