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
from pyrula_stream.access.api_keys import APIKeyAuth
from pyrula_stream.access.http_guard import HTTPAccess
from pyrula_stream.llm import FakeLLM
from pyrula_stream.testing import running_worker, unique_name
from pyrula_stream.ui.feed import FeedOptions
from pyrula_stream.ui.server import UIApp, UIOptions, running_ui
from tests.ui.test_cli import HOST, free_port, wait_until_served

ACTION = {"x-pyrula-action": "cancel"}
WEB_KEY = "k-web-0123456789abcdef0123456789abcdef"
OPS_KEY = "k-ops-fedcba9876543210fedcba9876543210"


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


def keyed(
    *,
    host: str = "127.0.0.1",
    allow_actions: bool = False,
    reviewers: frozenset[str] | None = None,
) -> UIOptions:
    """UI options with two keys, "web" and "ops"."""
    access = HTTPAccess(auth=APIKeyAuth({"web": WEB_KEY, "ops": OPS_KEY}))
    return UIOptions(
        host=host, port=0, allow_actions=allow_actions, access=access, reviewers=reviewers
    )


async def test_with_keys_every_route_needs_one_and_the_login_cookie_opens_the_page(
    kafka_bootstrap_servers: str,
    client: KafkaAgentClient,
    agent_and_turns: tuple[str, str, str],
) -> None:
    agent, done, running = agent_and_turns
    feed = FeedOptions(kafka_bootstrap_servers, agents=(agent,))
    async with (
        running_ui(feed, keyed(allow_actions=True)) as url,
        httpx.AsyncClient(base_url=url, timeout=60) as http,
    ):
        routes = ["/", "/static/app.js", f"/api/turns/{agent}/{done}", "/api/live"]
        for path in routes:
            missing = await http.get(path)
            assert missing.status_code == 401, (path, missing.text)
            assert missing.headers["www-authenticate"].startswith("Bearer")
            assert missing.json()["code"] == "auth_missing"
            wrong = await http.get(path, headers={"authorization": "Bearer not-a-key"})
            assert wrong.status_code == 401
            assert 'error="invalid_token"' in wrong.headers["www-authenticate"]
            assert wrong.json()["code"] == "auth_invalid"
            assert "not-a-key" not in wrong.text
        unkeyed = await http.post(f"/api/turns/{agent}/{running}/terminate", headers=ACTION)
        assert unkeyed.status_code == 401

        bearer = {"authorization": f"Bearer {OPS_KEY}"}
        turn = await http.get(f"/api/turns/{agent}/{done}", headers=bearer)
        assert turn.status_code == 200 and turn.json()["result"] == "answer to hi"

        # A browser asking for the page gets the login form, signs in, and gets a cookie
        # that is not the key.
        form = await http.get("/", headers={"accept": "text/html"})
        assert form.status_code == 401 and 'action="/login"' in form.text
        bad = await http.post("/login", data={"key": "guess"})
        assert bad.status_code == 401 and "not valid" in bad.text
        assert "set-cookie" not in bad.headers
        login = await http.post("/login", data={"key": WEB_KEY})
        assert login.status_code == 303 and login.headers["location"] == "/"
        cookie = login.headers["set-cookie"]
        assert all(a in cookie for a in ("HttpOnly", "SameSite=Strict", "Path=/"))
        assert WEB_KEY not in cookie
        page = await http.get("/", headers={"accept": "text/html"})  # httpx keeps the cookie
        assert page.status_code == 200 and "/static/app.js" in page.text
        async with http.stream("GET", "/api/live") as live:
            first = await anext(line async for line in live.aiter_lines() if "data: " in line)
        assert '"signed_in": true' in first

        # Signed in or not, another site's page may not act through the browser's cookie.
        forged = await http.post(
            f"/api/turns/{agent}/{running}/terminate",
            headers={**ACTION, "origin": "http://evil.example", "sec-fetch-site": "cross-site"},
        )
        assert forged.status_code == 403
        own = await http.post(
            f"/api/turns/{agent}/{running}/terminate",
            headers={**ACTION, "origin": url, "sec-fetch-site": "same-origin"},
        )
        assert own.status_code == 200, own.text
        events = [e async for e in client.stream(agent, running)]
        assert (events[-1].type, events[-1].data["code"]) == ("run:error", "cancelled")

        logout = await http.post("/logout", headers={"origin": url})
        assert logout.status_code == 303 and "Max-Age=0" in logout.headers["set-cookie"]
        assert (await http.get(f"/api/turns/{agent}/{done}")).status_code == 401


async def test_only_a_reviewers_key_may_answer_a_question(
    kafka_bootstrap_servers: str, agent_and_turns: tuple[str, str, str]
) -> None:
    agent, _, running = agent_and_turns
    feed = FeedOptions(kafka_bootstrap_servers, agents=(agent,))
    answer = f"/api/questions/{agent}/{running}/approve"
    body = {"key": "tool_approval:refund#0.0"}
    async with (
        running_ui(feed, keyed(allow_actions=True, reviewers=frozenset({"ops"}))) as url,
        httpx.AsyncClient(base_url=url, timeout=60) as http,
    ):
        web = {**ACTION, "authorization": f"Bearer {WEB_KEY}"}
        refused = await http.post(answer, headers=web, json=body)
        assert refused.status_code == 403, refused.text
        assert "web is not a reviewer" in refused.json()["error"]
        ops = {**ACTION, "authorization": f"Bearer {OPS_KEY}"}
        sent = await http.post(answer, headers=ops, json=body)
        # Past the reviewer check: the worker refuses it, as the turn asked no question.
        assert sent.status_code == 400 and "not_asked" in sent.json()["error"], sent.text
        # Other actions stay open to any key.
        cancel = await http.post(f"/api/turns/{agent}/{running}/cancel", headers=web)
        assert cancel.status_code == 200, cancel.text


def test_serving_beyond_loopback_without_keys_is_refused_naming_both_options() -> None:
    feed = FeedOptions("127.0.0.1:9")  # never contacted: the UI is only built
    for host in ("0.0.0.0", "::", "192.0.2.10", "ui.example.com"):
        with pytest.raises(ConfigurationError, match="--api-keys FILE") as refused:
            UIApp(feed, UIOptions(host=host))
        assert "--allow-unauthenticated" in str(refused.value)
    UIApp(feed, keyed(host="0.0.0.0"))
    UIApp(feed, UIOptions(host="0.0.0.0", access=HTTPAccess(allow_unauthenticated=True)))
    for loopback in ("127.0.0.1", "127.0.0.2", "::1", "localhost"):
        UIApp(feed, UIOptions(host=loopback))


def test_the_ui_command_refuses_to_serve_beyond_loopback_without_keys(tmp_path: Path) -> None:
    command = [sys.executable, "-m", "pyrula_stream.cli", "ui", "--host", "0.0.0.0"]
    command += ["--bootstrap-servers", "127.0.0.1:9", "--port", "0"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done
    assert "--api-keys FILE" in done.stderr and "--allow-unauthenticated" in done.stderr
    assert "pyrula-stream ui on" not in done.stdout
    empty = tmp_path / "keys"
    empty.write_text("# nobody yet\n")
    done = subprocess.run([*command, "--api-keys", str(empty)], capture_output=True, text=True)
    assert done.returncode == 2 and "holds no keys" in done.stderr, done


def test_the_ui_command_serves_with_a_key_file_and_extra_allowed_hosts(
    kafka_bootstrap_servers: str, tmp_path: Path
) -> None:
    keys = tmp_path / "ui.keys"
    keys.write_text(f"# who may look\nweb = {WEB_KEY}\n\nops={OPS_KEY}\n")
    port = free_port()
    url = f"http://{HOST}:{port}"
    command = [sys.executable, "-m", "pyrula_stream.cli", "ui", "--host", HOST]
    command += ["--bootstrap-servers", kafka_bootstrap_servers, "--port", str(port)]
    command += ["--api-keys", str(keys), "--allowed-hosts", "ui.example,10.1.2.3"]
    with subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as proc:
        try:
            wait_until_served(url, proc)
            bearer = {"authorization": f"Bearer {WEB_KEY}"}
            assert httpx.get(url, timeout=30).status_code == 401
            assert httpx.get(url, headers=bearer, timeout=30).status_code == 200
            for name in ("ui.example", "10.1.2.3", "localhost", HOST):
                named = httpx.get(url, headers={**bearer, "host": f"{name}:{port}"}, timeout=30)
                assert named.status_code == 200, name
            evil = httpx.get(url, headers={**bearer, "host": "evil.example"}, timeout=30)
            assert evil.status_code == 421
        finally:
            proc.terminate()
            _, err = proc.communicate(timeout=60)
    assert WEB_KEY not in err and OPS_KEY not in err
