"""Who may call ``mcp serve --http``: beyond loopback only with an API key, never through
a foreign Host or Origin (the SDK's own rebinding protection stays on), and the key's
name is recorded as the owner of the turns a call submits. Real broker, real worker."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

from pyrula_stream import AgentContext, ConfigurationError, build_mcp_server, kafka_agent
from pyrula_stream.access.api_keys import APIKeyAuth
from pyrula_stream.access.http_guard import ASGIApp, HTTPAccess
from pyrula_stream.chaos.processes import free_port
from pyrula_stream.integrations.mcp_server import mcp_http_app
from pyrula_stream.llm import FakeLLM
from pyrula_stream.testing import running_worker, unique_name
from tests.agents.echo import echo
from tests.mcp_servers.processes import ROOT, sigkill, start_listening

DESK_KEY = "desk-0123456789abcdef0123456789abcdef"
INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "probe", "version": "0"},
    },
}
MCP_HEADERS = {"accept": "application/json, text/event-stream"}


@contextlib.asynccontextmanager
async def serving(app: ASGIApp) -> AsyncIterator[str]:
    """``app`` under uvicorn on a free loopback port in this loop; yields the base URL."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        while not server.started:
            if task.done():
                task.result()
            await asyncio.sleep(0.05)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        await task
        sock.close()


@contextlib.asynccontextmanager
async def mcp_client(url: str, key: str) -> AsyncIterator[Client]:
    headers = {"authorization": f"Bearer {key}"}
    async with (
        create_mcp_http_client(headers=headers) as http,
        Client(streamable_http_client(url, http_client=http), cache=None) as mcp,
    ):
        yield mcp


async def test_beyond_loopback_a_call_needs_the_key_the_right_host_and_records_the_owner(
    kafka_bootstrap_servers: str,
) -> None:
    @kafka_agent(name=unique_name("whoami"), llm=FakeLLM(["x"]), partitions=1)
    async def whoami(ctx: AgentContext, note: str) -> str:
        """Say who submitted this turn."""
        return f"{note} from {ctx.metadata.get('owner')}"

    server = build_mcp_server(agents=[whoami], bootstrap_servers=kafka_bootstrap_servers)
    # Served as if on every interface (the policy follows host=), reached over loopback.
    access = HTTPAccess(auth=APIKeyAuth({"desk": DESK_KEY}), allowed_hosts=("mcp.example",))
    app = mcp_http_app(server, host="0.0.0.0", access=access)
    async with (
        running_worker(whoami, kafka_bootstrap_servers),
        serving(app) as base,
        httpx.AsyncClient(base_url=base, timeout=60) as http,
    ):
        url = f"{base}/mcp"
        missing = await http.post("/mcp", json=INITIALIZE, headers=MCP_HEADERS)
        assert missing.status_code == 401 and missing.json()["code"] == "auth_missing"
        assert missing.headers["www-authenticate"].startswith("Bearer")
        wrong = {**MCP_HEADERS, "authorization": "Bearer desk-guess"}
        refused = await http.post("/mcp", json=INITIALIZE, headers=wrong)
        assert refused.status_code == 401 and refused.json()["code"] == "auth_invalid"

        keyed = {**MCP_HEADERS, "authorization": f"Bearer {DESK_KEY}"}
        rebound = await http.post(
            "/mcp", json=INITIALIZE, headers={**keyed, "host": "evil.example"}
        )
        assert rebound.status_code == 421, rebound.text
        # The SDK's own check is still on: it refuses a foreign Origin even on a GET.
        port = base.rsplit(":", 1)[1]
        sdk = await http.get("/mcp", headers={**keyed, "origin": f"http://evil.example:{port}"})
        assert (sdk.status_code, sdk.text) == (403, "Invalid Origin header")
        named = await http.post("/mcp", json=INITIALIZE, headers={**keyed, "host": "mcp.example"})
        assert named.status_code == 200, named.text

        async with mcp_client(url, DESK_KEY) as mcp:
            result = await mcp.call_tool(whoami.name, {"note": "hello"})
        assert not result.is_error, result
        text: Any = result.content[0]
        assert text.text == "hello from desk"


def test_an_open_bind_is_refused_in_python_and_from_the_shell(kafka_bootstrap_servers: str) -> None:
    server = build_mcp_server(agents=[echo], bootstrap_servers=kafka_bootstrap_servers)
    with pytest.raises(ConfigurationError, match="--api-keys FILE") as refused:
        mcp_http_app(server, host="0.0.0.0")
    assert "--allow-unauthenticated" in str(refused.value)
    mcp_http_app(server, host="0.0.0.0", access=HTTPAccess(allow_unauthenticated=True))

    command = [sys.executable, "-m", "pyrula_stream.cli", "mcp", "serve", "tests.agents.echo:echo"]
    command += ["--bootstrap-servers", kafka_bootstrap_servers, "--http", "0", "--host", "0.0.0.0"]
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 2, done
    assert "--api-keys FILE" in done.stderr and "--allow-unauthenticated" in done.stderr
    assert "serving MCP" not in done.stderr
    # Keys over stdio would do nothing: say so rather than seem to protect.
    stdio = [*command[:6], "--bootstrap-servers", kafka_bootstrap_servers, "--api-keys", "k"]
    done = subprocess.run(stdio, capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 2 and "apply to --http PORT" in done.stderr, done


async def test_mcp_serve_http_with_a_key_file(kafka_bootstrap_servers: str, tmp_path: Path) -> None:
    keys = tmp_path / "mcp.keys"
    keys.write_text(f"desk={DESK_KEY}\n")
    agent = dataclasses.replace(echo, name=unique_name("mcpkeyed"))
    port = free_port()
    argv = [sys.executable, "-m", "pyrula_stream.cli", "mcp", "serve", "tests.agents.echo:echo"]
    argv += ["--bootstrap-servers", kafka_bootstrap_servers, "--http", str(port)]
    argv += ["--api-keys", str(keys)]
    env = {"PYTHONPATH": ROOT, "ECHO_AGENT_NAME": agent.name}
    async with running_worker(agent, kafka_bootstrap_servers):
        proc = await asyncio.to_thread(start_listening, argv, port, env)
        try:
            url = f"http://127.0.0.1:{port}/mcp"
            async with httpx.AsyncClient(timeout=60) as http:
                missing = await http.post(url, json=INITIALIZE, headers=MCP_HEADERS)
                rebound = await http.post(
                    url, json=INITIALIZE, headers={**MCP_HEADERS, "host": "evil.example"}
                )
            assert missing.status_code == 401
            assert rebound.status_code == 421
            async with mcp_client(url, DESK_KEY) as mcp:
                result = await mcp.call_tool(agent.name, {"text": "hello"})
            text: Any = result.content[0]
            assert text.text == "said it"
        finally:
            sigkill(proc)
