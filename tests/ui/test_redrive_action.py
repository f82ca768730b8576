"""The UI's redrive action: with ``--allow-actions``, a dead letter is sent back to its
source once, noted under the caller's principal; without it, or for a key that is not
one of ``--operator``, the route refuses. A real
worker and broker, the real UI server over httpx."""

from __future__ import annotations

import json

import httpx

from pyrula_stream import AgentContext, KafkaAgentClient, WorkerOptions, kafka_agent
from pyrula_stream.access.api_keys import APIKeyAuth
from pyrula_stream.access.http_guard import HTTPAccess
from pyrula_stream.kafka.admin import missing_topics
from pyrula_stream.llm import FakeLLM
from pyrula_stream.testing import read_topic, running_worker, unique_name, wait_for
from pyrula_stream.ui.feed import FeedOptions
from pyrula_stream.ui.server import UIOptions, running_ui
from pyrula_stream.wire.guard import DecodeLimits

OPS_KEY = "k-ops-fedcba9876543210fedcba9876543210"
WEB_KEY = "k-web-0123456789abcdef0123456789abcdef"
REDRIVE = {"x-pyrula-action": "redrive", "authorization": f"Bearer {OPS_KEY}"}


async def test_the_ui_redrives_a_dead_letter_once_under_its_principal(
    kafka_bootstrap_servers: str, client: KafkaAgentClient
) -> None:
    @kafka_agent(name=unique_name("uiredrive"), llm=FakeLLM(["ok"]), partitions=1)
    async def agent(ctx: AgentContext, question: str) -> str:
        return "answered"

    bs = kafka_bootstrap_servers
    small = WorkerOptions(decode_limits=DecodeLimits(max_bytes=2000))
    async with running_worker(agent, bs, small):
        handle = await client.submit(agent.name, question="z" * 5000)
        await wait_for(lambda: len(read_topic(bs, agent.topics.dlq)) == 1, 30, "a dead letter")

    access = HTTPAccess(auth=APIKeyAuth({"ops": OPS_KEY, "web": WEB_KEY}))
    feed = FeedOptions(bs, agents=(agent.name,))
    path = f"/api/dlq/{agent.name}/0/redrive"
    read_only = UIOptions(port=0, access=access)
    async with (
        running_ui(feed, read_only) as url,
        httpx.AsyncClient(base_url=url, timeout=60) as http,
    ):
        refused = await http.post(path, headers=REDRIVE)
        assert refused.status_code == 403 and "--allow-actions" in refused.json()["error"]
    assert missing_topics(bs, [agent.topics.dlq_redrives]) == [agent.topics.dlq_redrives]

    acting = UIOptions(port=0, access=access, allow_actions=True, operators=frozenset({"ops"}))

    async with (
        running_ui(feed, acting) as url,
        httpx.AsyncClient(base_url=url, timeout=60) as http,
        running_worker(agent, bs),
    ):
        not_operator = {**REDRIVE, "authorization": f"Bearer {WEB_KEY}"}
        refused = await http.post(path, headers=not_operator)
        assert refused.status_code == 403 and "not an operator" in refused.json()["error"]
        headerless = await http.post(path, headers={"authorization": REDRIVE["authorization"]})
        assert headerless.status_code == 400
        first = await http.post(path, headers=REDRIVE)
        again = await http.post(path, headers=REDRIVE)
        assert first.status_code == again.status_code == 200, first.text
        assert first.json()["outcome"] == "redriven"
        assert again.json()["outcome"] == "already_redriven"
        events = [e async for e in client.stream(agent.name, handle.turn_id)]
        assert events[-1].type == "run:complete"
    ((_, note, _),) = read_topic(bs, agent.topics.dlq_redrives)
    assert json.loads(note or b"")["by"] == "ops"
