"""Who may talk to ``pyrula-stream ui``: the Host it answers (DNS rebinding), the origin of
its actions, and its API keys (Bearer header, or the login form's cookie). A real worker
runs turns on the real broker; httpx talks to the real UI server."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from pyrula_stream import (
    AgentContext,
    ConfigurationError,
    KafkaAgent,
    KafkaAgentClient,
    kafka_agent,
)
from pyrula_stream.api_keys import APIKeyAuth
from pyrula_stream.http_guard import HTTPAccess
from pyrula_stream.llm import FakeLLM
from pyrula_stream.testing import running_worker, unique_name
from pyrula_stream.ui.feed import FeedOptions
from pyrula_stream.ui.server import UIApp, UIOptions, running_ui

ACTION = {"x-pyrula-action": "cancel"}
WEB_KEY = "k-web-0123456789abcdef"
OPS_KEY = "k-ops-fedcba9876543210"


def waiting_agent(release: asyncio.Event) -> KafkaAgent:
    @kafka_agent(name=unique_name("uiaccess"), llm=FakeLLM(["x"]), partitions=1)
    async def agent(ctx: AgentContext, question: str) -> str:
        if question == "wait":
            await release.wait()
        return f"answer to {question}"

    return agent


@pytest.fixture
async def agent_and_turns(
    kafka_bootstrap_servers: str, client: KafkaAgentClient
) -> AsyncIterator[tuple[str, str, str]]:
    """An agent with one finished turn and one running turn: (agent, done, running)."""
    release = asyncio.Event()
    agent = waiting_agent(release)
    async with running_worker(agent, kafka_bootstrap_servers):
        done = await client.run(agent.name, question="hi", timeout=60)
        running = await client.submit(agent.name, question="wait")
        yield agent.name, done[0].turn_id, running.turn_id
        release.set()


async def test_a_dns_rebinding_page_cannot_read_turns_or_cancel_them(
    kafka_bootstrap_servers: str, agent_and_turns: tuple[str, str, str]
) -> None:
    agent, done, running = agent_and_turns
    feed = FeedOptions(kafka_bootstrap_servers, agents=(agent,))
    async with (
        running_ui(feed, UIOptions(port=0, allow_actions=True)) as url,
        httpx.AsyncClient(base_url=url, timeout=60) as http,
    ):
        port = url.rsplit(":", 1)[1]
        # evil.example resolved to 127.0.0.1: the page is "same-origin" with the UI, so
        # it may set the action header too. Only the Host header gives it away.
        rebound = {"host": f"evil.example:{port}", "origin": f"http://evil.example:{port}"}
        read = await http.get(f"/api/turns/{agent}/{done}", headers=rebound)
        assert read.status_code == 421, read.text
        assert "evil.example" in read.json()["error"]
        assert "--allowed-hosts" in read.json()["error"]
        live = await http.get("/api/live", headers=rebound)
        assert live.status_code == 421
        cancel = await http.post(
            f"/api/turns/{agent}/{running}/cancel", headers={**rebound, **ACTION}
        )
        assert cancel.status_code == 421, cancel.text
        # Another site's page posting to the loopback UI is refused by its origin.
        for cross in ({"origin": "http://evil.example"}, {"sec-fetch-site": "cross-site"}):
            post = await http.post(
                f"/api/turns/{agent}/{running}/cancel", headers={**cross, **ACTION}
            )
            assert post.status_code == 403, post.text
            assert "cross-origin POST refused" in post.json()["error"]
        # The UI's own page, at its own address, still reads.
        own = await http.get(f"/api/turns/{agent}/{done}")
        assert own.status_code == 200 and own.json()["status"] == "completed"
        assert own.headers["x-frame-options"] == "DENY"
        status = await http.get(f"/api/turns/{agent}/{running}")
        assert status.json()["status"] == "running"  # nothing cancelled it
