"""The gateway (SSE and status) and the UI's turn view read values stored by reference
back whole, through the same resolver as the client."""

from __future__ import annotations

from typing import Any

import httpx

from pyrula_stream import AgentContext, AgentLimits, ToolContext, WorkerOptions, kafka_agent, tool
from pyrula_stream.gateway import AgentClient, AppOptions, create_app
from pyrula_stream.gateway.serve import running_gateway
from pyrula_stream.llm import FakeLLM, reply_tool_call
from pyrula_stream.objects import ObjectStore
from pyrula_stream.testing import running_worker, unique_name
from pyrula_stream.ui.feed import FeedOptions
from pyrula_stream.ui.server import UIOptions, running_ui

LOG = 700_000
RESULT = 400_000


async def test_the_gateway_and_the_ui_read_a_large_turn_back_whole(
    kafka_bootstrap_servers: str, object_store: ObjectStore
) -> None:
    """On each store."""
    store = object_store

    @tool(read_only=True)
    async def read_log(ctx: ToolContext) -> str:
        """Read a log file."""
        return "L" * LOG

    @kafka_agent(
        name=unique_name("readers"),
        llm=FakeLLM([reply_tool_call("read_log"), "read it"]),
        tools=[read_log],
        partitions=1,
        limits=AgentLimits(max_tool_result_bytes=None),
    )
    async def agent(ctx: AgentContext, text: str) -> dict[str, Any]:
        await ctx.llm.run([{"role": "user", "content": text}])
        return {"summary": "S" * RESULT}

    app = create_app(
        agents=[agent],
        options=AppOptions(bootstrap_servers=kafka_bootstrap_servers, object_store=store),
    )
    feed = FeedOptions(kafka_bootstrap_servers, agents=(agent.name,), object_store=store)
    async with (
        running_worker(agent, kafka_bootstrap_servers, WorkerOptions(object_store=store)),
        running_gateway(app) as url,
        AgentClient(url) as web,
        running_ui(feed, UIOptions(port=0)) as ui_url,
        httpx.AsyncClient(base_url=ui_url, timeout=60) as ui,
    ):
        events = await web.run(agent.name, text="read the log")
        turn_id = events[-1].turn_id
        status = await web.status(agent.name, turn_id)
        view = (await ui.get(f"/api/turns/{agent.name}/{turn_id}")).json()
    assert events[-1].type == "run:complete", events[-1].data
    assert events[-1].data["result"] == {"summary": "S" * RESULT}
    [tool_result] = [e for e in events if e.type == "tool:result"]
    assert tool_result.data["output"] == "L" * LOG
    assert status.state == "completed"
    assert view["result"] == {"summary": "S" * RESULT}, str(view)[:300]
    assert "$pyrula_ref" not in str(view)
