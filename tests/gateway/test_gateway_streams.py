"""The gateway scales with streams (issue 47): a submitted turn's stream is opened before
the turn is produced and taken over by its events request; while the gateway knows Kafka
is unreachable, a submit is refused at once instead of after the produce deadline."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from typing import Any

import httpx

from pyrula_stream.chaos.processes import free_port
from pyrula_stream.gateway import AppOptions, create_app
from pyrula_stream.gateway.serve import running_gateway
from pyrula_stream.gateway.served import Gateway
from pyrula_stream.testing import running_worker, unique_name
from tests.agents.echo import echo


async def test_a_submit_while_readyz_is_false_is_refused_at_once() -> None:
    down = f"127.0.0.1:{free_port()}"  # nothing listens there
    # a produce deadline far longer than the guard below: only a refusal that does not
    # try to produce answers within it
    options = AppOptions(bootstrap_servers=down, kafka_timeout=300, retry_after_s=7)
    app = create_app(agents=["nobody"], options=options)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as http:
        ready = await http.get("/readyz")
        submits = await asyncio.wait_for(
            asyncio.gather(*(http.post("/agents/nobody/turns", json={"x": i}) for i in range(3))),
            60,
        )
    assert ready.status_code == 503
    for answer in submits:
        assert answer.status_code == 503, answer.text
        assert answer.json()["code"] == "store_unavailable"
        assert answer.headers["retry-after"] == "7"


async def test_the_events_request_takes_the_stream_opened_at_submit(
    kafka_bootstrap_servers: str,
) -> None:
    agent = dataclasses.replace(echo, name=unique_name("gwpend"))
    app = create_app(agents=[agent], options=AppOptions(bootstrap_servers=kafka_bootstrap_servers))
    gateway: Gateway = app.state.gateway
    async with (
        running_worker(agent, kafka_bootstrap_servers),
        running_gateway(app) as url,
        httpx.AsyncClient(base_url=url, timeout=60) as http,
    ):
        turns = []
        for text in ("one", "two"):
            answer = await http.post(f"/agents/{agent.name}/turns", json={"text": text})
            assert answer.status_code == 202, answer.text
            turns.append(answer.json())
        kept = len(gateway.pending)
        seen: list[list[dict[str, Any]]] = []
        for turn in turns:
            async with http.stream("GET", turn["events_url"]) as response:
                seen.append(
                    [
                        json.loads(line[6:])
                        async for line in response.aiter_lines()
                        if line.startswith("data: ")
                    ]
                )
        left = len(gateway.pending)
    assert kept == 2, "each submit kept its turn's stream"
    assert left == 0, "each events request took its turn's stream"
    for turn, events in zip(turns, seen, strict=True):
        assert [e["seq"] for e in events] == list(range(len(events)))
        assert {e["turn_id"] for e in events} == {turn["turn_id"]}
        assert events[-1]["type"] == "run:complete", events[-1]
